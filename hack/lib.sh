# Shared shell helpers for hack/*.sh. Source it; it does not run anything by itself.
# shellcheck shell=bash

RLD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RLD_CACHE="${RLD_CACHE:-$HOME/.cache/ray-llm-disagg}"
export RLD_ROOT RLD_CACHE

# versions.env is the one place versions are pinned (KEY=VALUE lines). Not exported: etcd, for one,
# reads ETCD_* variables from its environment.
# shellcheck source=../versions.env
. "$RLD_ROOT/versions.env"

rld::log()  { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
rld::die()  { printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

# rld::since START_NS: seconds elapsed since START_NS (from `date +%s%N`), as "12.3s".
rld::since() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); printf '%d.%01ds' $((ms / 1000)) $((ms % 1000 / 100)); }

# rld::timed LABEL CMD...: run CMD, log how long it took, keep its exit code.
rld::timed() {
  local label="$1" start rc=0; shift
  start=$(date +%s%N)
  "$@" || rc=$?
  rld::log "$(printf '%-28s %s%s' "$label" "$(rld::since "$start")" "$([ "$rc" -eq 0 ] || echo "  FAILED (exit $rc)")")"
  return "$rc"
}

# rld::moddir MODULE@VERSION: download a Go module (proxy) and print its directory in GOMODCACHE.
rld::moddir() {
  local dir
  dir=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json "$1" |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir","")); sys.exit("Error" in d)') ||
    rld::die "go mod download $1 failed: is the Go module proxy reachable (GOPROXY=$(go env GOPROXY)) and is that version served? Try: go list -m -versions ${1%@*}"
  printf '%s\n' "$dir"
}

# rld::wait_for SECONDS WHAT CMD...: poll CMD every 0.5 s until it succeeds; die naming WHAT on timeout.
rld::wait_for() {
  local timeout="$1" what="$2" deadline; shift 2
  deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { rld::log "timed out after ${timeout}s waiting for: $what"; return 1; }
    sleep 0.5
  done
}

# usage: print the calling script's header comment (line 2 up to the first non-comment line).
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
