#!/usr/bin/env bash
# Build the runtime image with every version taken from versions.env (the one source of truth).
# Usage: images/build.sh <image-ref> [extra docker/buildx args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${1:?usage: images/build.sh <image-ref> [docker build args...]}; shift
# shellcheck source=../versions.env
. "$root/versions.env"
args=()
for v in PYTHON_VERSION RAY_VERSION VLLM_VERSION TORCH_VERSION NIXL_VERSION EFA_INSTALLER_VERSION; do
  args+=(--build-arg "$v=${!v}")
done
exec docker build -f "$root/images/Dockerfile" -t "$ref" "${args[@]}" "$@" "$root"
