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
# The three installs are independent, and on a cold machine each takes minutes (Go builds ~35 min on 2 cores,
# the venv ~11, the real node's image ~15): run them side by side, each into its own log, shown when it ends.
step "setup in parallel: toolchain (helm, ct, kubeconform, kwok, KubeRay, control plane, kubelet), python environment, and the real node's image when tests/e2e runs"
logs=$(mktemp -d /tmp/rld-setup.XXXXXX)
jobs_=(toolchain pyenv)
hack/toolchain.sh > "$logs/toolchain.log" 2>&1 & pids=($!)
hack/pyenv.sh > "$logs/pyenv.log" 2>&1 & pids+=($!)
if [[ " $* " == *" tests/e2e"* ]] || { [ "${RLD_E2E:-1}" != 0 ] && { [ $# -eq 0 ] || [[ " $* " == *" tests "* ]]; }; }; then
  hack/e2e.sh image > "$logs/e2e-image.log" 2>&1 & pids+=($!); jobs_+=(e2e-image)
fi
failed=()
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    printf -- '--- %s: done (%s s since setup began); last lines of its log:\n' "${jobs_[$i]}" "$((SECONDS - t0))"
    grep -v '^go: downloading' "$logs/${jobs_[$i]}.log" | tail -n 8
  else
    failed+=("${jobs_[$i]}")
    printf -- '--- %s FAILED; its log:\n' "${jobs_[$i]}"; cat "$logs/${jobs_[$i]}.log"
  fi
done
rm -rf "$logs"
[ ${#failed[@]} -eq 0 ] || { echo "setup failed: ${failed[*]} (log above); rerun 'make ${failed[0]/e2e-image/e2e-up}' alone to see it live" >&2; exit 1; }
eval "$(hack/toolchain.sh env)"
PYTHON=$(hack/pyenv.sh python)
export PATH="$(dirname "$PYTHON"):$PATH"
echo "setup took $((SECONDS - t0)) s"

step "lint (ruff check, settings in pyproject.toml)"
"$(dirname "$PYTHON")/ruff" check "$root" ||
  { echo "lint failed: fix the lines above (or 'ruff check --fix'); settings: [tool.ruff] in pyproject.toml" >&2; exit 1; }

step "pytest ${*:-tests}"
exec "$PYTHON" -m pytest "${@:-tests}"
