"""Benchmarks. `python -m bench.cpu` (bench/cpu_bench.sh, `make bench`): direct vLLM vs our app on CPU."""
