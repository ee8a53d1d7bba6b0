"""GPU benchmarks: `python -m bench.gpu` (TTFT of the app against direct vLLM, per hop; bench/ttft.py) and
`bench/gpu/run.sh` (install the pinned stack from the package index or an offline bundle, then run it)."""
