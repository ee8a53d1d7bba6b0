"""`python -m devstack`: serve the tiny model disaggregated on http://127.0.0.1:8000/v1 until Ctrl-C.

Prints one READY line with a curl example; on SIGINT/SIGTERM stops every process it started.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from devstack.cluster import SERVE_MODES
from devstack.ports import DEMO, PortPlan
from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack, log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__)
    parser.add_argument("--mode", choices=["disaggregated", "aggregated"], default="disaggregated")
    parser.add_argument("--port", type=int, default=DEMO.http, help="Serve HTTP port on 127.0.0.1")
    parser.add_argument("--port-base", type=int, default=DEMO.base,
                        help="first of the 1000 ports the Ray nodes use (devstack/ports.py); keep it "
                        "below the kernel's ephemeral range")
    parser.add_argument("--deploy-timeout", type=float, default=900,
                        help="give up when Serve makes no progress (no replica changes state) for this many seconds; "
                        "a start that is moving is never cut off (engines take about 3 min on an idle 2-core machine)")
    parser.add_argument("--idle-cpu", type=float, default=0, metavar="SECONDS",
                        help="after READY, measure and print the CPU the idle stack uses over this many seconds")
    parser.add_argument("--serve-mode", choices=SERVE_MODES, default="high-throughput",
                        help="high-throughput: Ray Serve's HAProxy ingress and throughput-optimized mode, as the "
                        "chart deploys it; standard: Serve's Python proxy")
    parser.add_argument("--exit-when-ready", action="store_true", help="stop again right after READY (smoke test)")
    parser.add_argument(
        "--api-key", action="append", default=[], metavar="KEY",
        help="require `Authorization: Bearer KEY` (repeatable: several valid keys); without it auth is off",
    )
    args = parser.parse_args(argv)
    try:
        ports = PortPlan(http=args.port, base=args.port_base)
    except ValueError as exc:
        parser.error(str(exc))

    stop_requested = threading.Event()
    starting = True

    def on_signal(signum, _frame):
        log(f"got {signal.Signals(signum).name}: stopping")
        stop_requested.set()
        if starting:
            raise KeyboardInterrupt  # abort start-up; LocalStack.start() cleans up what it started

    def install_handlers() -> None:
        # Again after start-up: ray.init()/ray.shutdown() in the launcher replace them.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    install_handlers()
    stack = LocalStack(apps={"llm": ("/", args.mode)}, ports=ports, serve_mode=args.serve_mode, api_keys=tuple(args.api_key))
    try:
        stack.start(deploy_timeout_s=args.deploy_timeout)
    except KeyboardInterrupt:
        log("start-up interrupted; everything started so far was stopped")
        return 130
    except Exception as exc:  # noqa: BLE001 - top level: tell the operator, exit non-zero
        log(f"FAILED to start the local stack: {exc}")
        return 1
    starting = False
    install_handlers()
    t = stack.timings
    memory = stack.cluster.memory_bytes()
    log(
        f"startup: model {t['model']:.1f} s, ray {t['ray_start']:.1f} s, deploy+warm-up {t['deploy']:.1f} s, "
        f"total {t['total']:.1f} s; memory of its {len(stack.cluster.processes())} processes: "
        f"RSS {memory['rss'] / 1024**3:.1f} GB, USS {memory['uss'] / 1024**3:.1f} GB"
    )
    url = stack.base_url("llm")
    auth = f"-H 'Authorization: Bearer {stack.api_key}' " if stack.api_key else ""
    if stack.api_key:
        log(f"auth on: {len(stack.api_keys)} API key(s), in {stack.api_keys_file} (rewrite it to rotate)")
    else:
        log("auth OFF: anyone who reaches the port can generate (pass --api-key KEY to require a key)")
    print(
        f"READY {args.mode} model={MODEL_ID} at {url} ({t['total']:.0f} s) -- try: curl -s {url}/chat/completions "
        f"{auth}-H 'Content-Type: application/json' -d "
        f"'{{\"model\": \"{MODEL_ID}\", \"messages\": [{{\"role\": \"user\", \"content\": \"hello\"}}], \"max_tokens\": 16}}'",
        flush=True,
    )
    try:
        if args.idle_cpu > 0:
            stack.report_idle_cpu(args.idle_cpu)
        while not stop_requested.is_set() and not args.exit_when_ready:
            stop_requested.wait(1)
    finally:
        t0 = time.monotonic()
        count = stack.stop()
        left = [p.pid for p in stack.cluster.processes()]
        log(
            f"stopped {count} processes in {time.monotonic() - t0:.1f} s"
            + (f"; WARNING still running: {left}" if left else "; none left")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
