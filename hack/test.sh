#!/usr/bin/env bash
# The project's test command (README: `make test`). Installs what the tests need on first run
# (Go-built tools into the cache, the Python environment), then runs pytest. The suites start
# their own servers: tests/serve_app, tests/direct and tests/resilience a local Ray + vLLM app, tests/cluster a local control plane.
# Usage: hack/test.sh [pytest args...]   (default: the whole tests/ tree)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

step() { printf '\n==> %s\n' "$*"; }
t0=$SECONDS
step "toolchain (helm, ct, kubeconform, kwok, KubeRay, control plane)"
hack/toolchain.sh
eval "$(hack/toolchain.sh env)"
step "python environment"
hack/pyenv.sh
PYTHON=$(hack/pyenv.sh python)
export PATH="$(dirname "$PYTHON"):$PATH"
echo "setup took $((SECONDS - t0)) s"

step "lint (ruff check, settings in pyproject.toml)"
"$(dirname "$PYTHON")/ruff" check "$root" ||
  { echo "lint failed: fix the lines above (or 'ruff check --fix'); settings: [tool.ruff] in pyproject.toml" >&2; exit 1; }

step "pytest ${*:-tests}"
exec "$PYTHON" -m pytest "${@:-tests}"
