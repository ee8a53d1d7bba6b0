#!/usr/bin/env bash
# bench/cpu_bench.sh — `make bench`: direct vLLM vs our aggregated vs our disaggregated app on this
# machine's CPUs, same Locust workload over a concurrency ladder; table + plot + Locust HTML reports
# in bench/out/<timestamp>/. About 12-15 min on 2 cores. Arguments go to `python -m bench.cpu`
# (e.g. --modes vllm,aggregated --concurrency 1,2 --duration 20).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=$("$root/hack/pyenv.sh" python)
cd "$root"
exec "$python" -m bench.cpu "$@"
