#!/usr/bin/env bash
# Device side (run via the `run` tool, repo root). Staging chunks arrive one call each (carry .stage/cK):
#   bash bench/gpu_run.sh stash            # copy this call's .stage/c*/bundle.* into /tmp/chunks
#   bash bench/gpu_run.sh bench ARGS...    # stash, unpack (once) to /tmp/site, then python3 bench/gpu_bench.py ARGS
set -uo pipefail
mkdir -p /tmp/chunks; cp .stage/c*/bundle.* /tmp/chunks/ 2>/dev/null; ls -la /tmp/chunks
[ "${1:-}" = stash ] && exit 0
shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -f /tmp/site/.ok ]; then
  mkdir -p /tmp/site && t=$(date +%s) && cat /tmp/chunks/bundle.* | xz -T0 -d | tar -x -C /tmp/site && touch /tmp/site/.ok
  echo "unpacked in $(( $(date +%s) - t )) s: $(du -sh /tmp/site)"
fi
export PYTHONPATH=/tmp/site RLD_MODEL8B=/tmp/model8b VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
rm -rf /tmp/model8b && cp -r .stage/model8b /tmp/model8b
PY=$(command -v python3)
# LocalRayCluster runs the `ray` CLI beside sys.executable.
[ -x "$(dirname "$PY")/ray" ] || printf '#!%s\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n' "$PY" > "$(dirname "$PY")/ray" && chmod +x "$(dirname "$PY")/ray"
nvidia-smi --query-gpu=index,name,memory.used --format=csv; nvidia-smi topo -m | head -4
export OUT=${OUT:-/tmp/out}
$PY bench/gpu_bench.py "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^INFO\|WARNING" | tail -c 9000
