#!/usr/bin/env bash
# hack/demo.sh — the README's first quick start: serve a tiny model disaggregated (prefill and decode
# on separate CPU vLLM engines, KV over NIXL on loopback) at http://127.0.0.1:8000/v1 until Ctrl-C.
# First run: creates the Python env (hack/pyenv.sh, ~3-4 min) and the tiny model (~10 s).
# Options go to `python -m devstack` (--mode aggregated, --port N, --exit-when-ready, --api-key KEY).
# Auth is on: the API key is $RLD_API_KEY, or a fresh random one; the READY line shows it in a curl example.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
python=$("$RLD_ROOT/hack/pyenv.sh" python)
cd "$RLD_ROOT"
key_args=()
case " $* " in
  *" --api-key"*) ;;
  *) key_args=(--api-key "${RLD_API_KEY:-rld-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')}") ;;
esac
exec "$python" -m devstack "${key_args[@]}" "$@"
