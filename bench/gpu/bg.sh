#!/usr/bin/env bash
# bench/gpu/bg.sh — run a long bench in the background on a lent GPU machine and follow it over several calls
# (each call is at most 10 minutes; a process in a session of its own outlives the call that started it).
#
#   bench/gpu/bg.sh start DIR CMD...   start CMD (in the repo root) in a new session; output in DIR/log, status in DIR/rc
#   bench/gpu/bg.sh wait DIR SECONDS   wait until CMD ends or SECONDS pass; print its progress lines and the log's end
#   bench/gpu/bg.sh pack DIR DEST      DEST/<name>.tar.xz of DIR (the bench's --out folder inside DIR/out included),
#                                      plus the engines' scheduler/throughput log lines, for the files that come back
#   bench/gpu/bg.sh follow DIR DEST SECONDS [EVERY]
#                                      wait as `wait` does, packing into DEST every EVERY seconds (default 60) and at
#                                      the end: a call cut short by the session's device time still returns the last pack
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cmd=${1:?start|wait|pack}
dir=${2:?DIR}
case "$cmd" in
  start)
    shift 2
    mkdir -p "$dir"
    rm -f "$dir/rc"
    (cd "$root" && setsid nohup bash -c '"$@"; echo $? > "'"$dir"'/rc"' bash "$@" > "$dir/log" 2>&1 < /dev/null &)
    echo "started: $*"
    ;;
  wait)
    deadline=$((SECONDS + ${3:?SECONDS}))
    while [ ! -f "$dir/rc" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
    grep -a "bench.gpu.pd\|Error\|error:" "$dir/log" | grep -v "^\s*$" | tail -40 || true
    echo "--- log end"; tail -5 "$dir/log"
    if [ -f "$dir/rc" ]; then echo "DONE rc=$(cat "$dir/rc")"; else echo "RUNNING"; fi
    ;;
  pack)
    dest=${3:?DEST}
    mkdir -p "$dest"
    # The engines' own view: vLLM's periodic stats (throughput, running/waiting, KV use) and its scheduler settings.
    grep -rah "Asynchronous scheduling\|Avg prompt throughput\|Using executor class\|max_num_seqs\|Maximum concurrency" \
      "$dir" /tmp/rld-*/session_latest/logs 2>/dev/null | cut -c1-400 | tail -3000 > "$dir/engine-log-lines.txt" || true
    # written aside, then renamed: a call cut short mid-pack keeps the previous whole pack
    tar -cf - -C "$dir" --exclude='*/model' . | xz -T0 -6 > "$dest/.$(basename "$dir").tar.xz.tmp"
    mv "$dest/.$(basename "$dir").tar.xz.tmp" "$dest/$(basename "$dir").tar.xz"
    ls -la "$dest"
    ;;
  follow)
    dest=${3:?DEST}
    deadline=$((SECONDS + ${4:?SECONDS})) every=${5:-60}
    while [ ! -f "$dir/rc" ] && [ "$SECONDS" -lt "$deadline" ]; do
      next=$((SECONDS + every))
      while [ ! -f "$dir/rc" ] && [ "$SECONDS" -lt "$next" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 5; done
      "$0" pack "$dir" "$dest" > /dev/null
    done
    "$0" pack "$dir" "$dest" > /dev/null
    "$0" wait "$dir" 0
    ;;
  *) echo "unknown command $cmd (see the header of $0)" >&2; exit 2 ;;
esac
