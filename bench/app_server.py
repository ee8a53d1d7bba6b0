"""`python -m bench.app_server --mode aggregated|disaggregated --port N`: our app, for the bench.

The same LocalStack that `python -m devstack` (hack/demo.sh) and the tests use, with a port
plan of the bench's own so that it cannot collide with a demo or a test cluster on the default
ports. Serves http://127.0.0.1:N/v1 until SIGTERM/SIGINT, then stops every process it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.app_server", description=__doc__)
    parser.add_argument("--mode", choices=["aggregated", "disaggregated"], required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    from bench.servers import BENCH_API_KEY
    from devstack.ports import BENCH, PortPlan
    from devstack.stack import LocalStack, log

    stop = threading.Event()
    ready = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        if not ready.is_set():  # abort a start in progress: LocalStack.start stops what it began
            raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    stack = LocalStack(
        apps={"llm": ("/", args.mode)},
        ports=PortPlan(http=args.port, base=BENCH.base),
        api_keys=(BENCH_API_KEY,),
    )
    try:
        stack.start()
    except SystemExit:
        stack.stop()
        raise
    except Exception as exc:  # noqa: BLE001 - report and exit non-zero
        log(f"bench.app_server: FAILED to start {args.mode}: {exc}")
        return 1
    # ray.init (inside stack.start) replaced our SIGTERM handler with its own and Ray's core worker
    # with a fatal-signal handler that kills the process at once, leaving the cluster running.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    ready.set()
    log(f"bench.app_server: READY {args.mode} at {stack.base_url('llm')} in {stack.timings['total']:.0f} s")
    try:
        while not stop.is_set():
            stop.wait(1)
    finally:
        n = stack.stop()
        left = [p.pid for p in stack.cluster.processes()]
        log(f"bench.app_server: stopped {n} processes" + (f"; still running: {left}" if left else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
