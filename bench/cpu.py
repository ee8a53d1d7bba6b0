"""CPU benchmark: direct vLLM vs our aggregated app vs our disaggregated app, on this machine.

    python -m bench.cpu                       # or: bench/cpu_bench.sh, make bench
    python -m bench.cpu --modes vllm,aggregated --concurrency 1,2 --duration 20

Serves the tiny model three ways, one after the other (each is stopped before the next starts),
drives each with the same Locust workload over a concurrency ladder (closed loop, bounded in time
and request count, loopback only), then prints a table with every figure's ratio to direct vLLM
and writes into bench/out/<timestamp>/: table.md, results.json, latency.png, and per level the
Locust HTML report, CSV files, summary JSON and log, plus each server's log.

vLLM stays up, idle, while the aggregated app is measured; then a paired phase sends the same
prompts to both, alternately, one at a time (--paired N): a TTFT comparison at 1 user that
background load on a shared machine cannot skew, unlike two ladders run minutes apart.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench import report
from bench.ladder import LevelResult, Workload, run_level, warm_up
from bench.paired import PairedResult, paired_ttft
from bench.servers import (MODES, REPO_ROOT, ServerProcess, ServerStartError, app_server, port_in_use,
                           tiny_model_path, vllm_server)
from loadtests.openai_load.prompts import Calibration
from devstack.ports import BENCH

VLLM_PORT = BENCH.aux(0)  # the app serves on BENCH.http; both from the bench's own port plan
APP_PORT = BENCH.http
READY_TIMEOUT_S = {"vllm": 300, "aggregated": 600, "disaggregated": 600}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes must be among {', '.join(MODES)}; got {text!r}")
    return [m for m in MODES if m in modes]  # always vllm first: it is the baseline of the paired phase


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", type=_modes, default=list(MODES), help="default: vllm,aggregated,disaggregated")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8], help="default: 1,2,4,8")
    p.add_argument("--duration", type=int, default=30, help="seconds per ladder level (default 30)")
    p.add_argument("--input-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--api", choices=["chat", "completions"], default="chat")
    p.add_argument("--out", type=Path, default=None, help="default: bench/out/<timestamp>")
    p.add_argument("--max-ttft-ratio", type=float, default=1.25,
                   help="target for aggregated TTFT p50 / direct vLLM TTFT p50 at the lowest concurrency")
    p.add_argument("--strict", action="store_true", help="exit 1 when that target is missed")
    p.add_argument("--paired", type=int, default=30,
                   help="after the aggregated ladder, send this many identical prompts to vLLM and the app "
                        "alternately at 1 user (robust to background load; 0: skip)")
    p.add_argument("--app-env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for the app modes' Ray cluster (every replica inherits it), "
                        "e.g. RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS=0 to try a setting; repeatable")
    a = p.parse_args(argv)
    if not 5 <= a.duration <= 600:
        p.error("--duration must be between 5 and 600 seconds")
    env = {}
    for item in a.app_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--app-env {item!r}: expected KEY=VALUE")
        env[key] = value
    a.app_env = env
    return a


def preflight() -> None:
    busy = [port for port in (VLLM_PORT, APP_PORT) if port_in_use(port)]
    if busy:
        raise SystemExit(f"bench: ports {busy} on 127.0.0.1 are in use (another bench still running?); "
                         "stop it first (`ss -ltnp` shows the owner)")
    load1 = os.getloadavg()[0]
    if load1 > 1.0:
        log(f"WARNING: load average {load1:.2f} on {os.cpu_count()} cores: other work will skew the numbers")


def serve(mode: str, model_path: str, out: Path, app_env: dict[str, str]) -> ServerProcess:
    if mode == "vllm":
        return vllm_server(VLLM_PORT, model_path, out / "server-vllm.log")
    return app_server(mode, APP_PORT, out / f"server-{mode}.log", app_env)


def write_results(out: Path, args: argparse.Namespace, results: list[LevelResult], startup: dict[str, float],
                  started: float, paired: PairedResult | None = None) -> None:
    data = {
        "workload": asdict(Workload(args.api, args.input_tokens, args.output_tokens, args.duration)),
        "concurrency": args.concurrency,
        "modes": args.modes,
        "app_env": args.app_env,
        "startup_s": startup,
        "wall_s": time.monotonic() - started,
        "cpu_count": os.cpu_count(),
        "paired": asdict(paired) if paired else None,
        "levels": [
            {"mode": r.mode, "concurrency": r.concurrency, **r.row(), "locust_exit_code": r.exit_code,
             "loadavg_before": r.loadavg_before, "html": str(r.html.relative_to(out)),
             "csv_prefix": str(r.csv_prefix.relative_to(out))}
            for r in results
        ],
    }
    (out / "results.json").write_text(json.dumps(data, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    out = args.out or REPO_ROOT / "bench" / "out" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    preflight()
    w = Workload(args.api, args.input_tokens, args.output_tokens, args.duration)
    model_path = tiny_model_path()
    log(f"output: {out}; model {model_path}; workload {w.api} {w.input_tokens}->{w.output_tokens} tokens, "
        f"{w.duration_s} s per level, users {args.concurrency}, modes {args.modes}")
    results: list[LevelResult] = []
    startup: dict[str, float] = {}
    paired: PairedResult | None = None
    # vLLM stays up (idle) while the aggregated app is measured, so that both can then be compared
    # request by request (paired phase); every other server is stopped before the next starts.
    keep_vllm = args.paired > 0 and "vllm" in args.modes and "aggregated" in args.modes
    running: dict[str, ServerProcess] = {}
    failed: dict[str, str] = {}
    try:
        for mode in args.modes:
            server = serve(mode, model_path, out, args.app_env)
            running[mode] = server
            log(f"{mode}: starting ({' '.join(server.cmd[1:4])} ...)")
            try:
                server.start()
                startup[mode] = server.wait_ready(READY_TIMEOUT_S[mode])
                log(f"{mode}: ready in {startup[mode]:.0f} s at {server.base_url}; warming up")
                warm_up(mode, server.base_url, w, out)
            except (ServerStartError, RuntimeError, subprocess.TimeoutExpired) as e:
                failed[mode] = str(e).splitlines()[0]
                log(f"{mode}: FAILED, skipping it: {e}")
                running.pop(mode).stop()
                continue
            for c in args.concurrency:
                r = run_level(mode, server.base_url, c, w, out, seed=c)
                results.append(r)
                row = r.row()
                log(f"{mode} c={c}: TTFT p50 {row['ttft_p50_ms']:.1f} ms, ITL p50 {row['itl_p50_ms']:.2f} ms, "
                    f"{row['requests_per_s']:.2f} req/s, {row['output_tokens_per_s']:.0f} tok/s, "
                    f"errors {row['error_rate']:.1%} ({int(row['requests'])} requests)")
            if mode == "aggregated" and keep_vllm:
                log(f"paired phase: {args.paired} identical prompts to vllm and aggregated, alternating")
                cal = Calibration.from_json(json.loads((out / "aggregated.calibration.json").read_text())["calibration"])
                paired = paired_ttft({"vllm": running["vllm"].base_url, "aggregated": server.base_url},
                                     cal, "tiny", w, args.paired)
                log(paired.line())
            for name in [m for m in running if not (keep_vllm and m == "vllm" and mode != "aggregated")]:
                log(f"{name}: stopping")
                running.pop(name).stop()
            write_results(out, args, results, startup, started, paired)
    finally:
        for name, server in running.items():
            log(f"{name}: stopping")
            server.stop()

    title = (f"tiny model on {os.cpu_count()} CPU cores: {w.api} {w.input_tokens}->{w.output_tokens} tokens, "
             f"{w.duration_s} s per level"
             + (f"; app env {' '.join(f'{k}={v}' for k, v in args.app_env.items())}" if args.app_env else ""))
    md = report.table(results)
    ladder_ratio = report.ttft_ratio_at(results, "aggregated", min(args.concurrency))
    # The paired phase is the verdict when it ran: the ladders of the two modes ran minutes apart
    # and background load drifts in between; the paired requests were interleaved.
    ratio = paired.ttft_p50_ratio if paired is not None else ladder_ratio

    def verdict(r: float) -> str:
        return "n/a" if math.isnan(r) else (
            f"{r:.2f}x ({'within' if r <= args.max_ttft_ratio else 'ABOVE'} the {args.max_ttft_ratio}x target)")

    summary_line = (f"aggregated TTFT p50 / direct vLLM at {min(args.concurrency)} user(s), from the ladders "
                    f"(sequential runs, drift-sensitive): {verdict(ladder_ratio)}")
    if paired is not None:
        summary_line += f"\n{paired.line()}\nverdict (paired): {verdict(ratio)}"
    startup_line = "startup to ready: " + ", ".join(f"{m} {s:.0f} s" for m, s in startup.items())
    if failed:
        startup_line += "\nFAILED modes: " + "; ".join(f"{m}: {why}" for m, why in failed.items())
    (out / "table.md").write_text(f"{title}\n\n{md}\n\n{summary_line}\n{startup_line}\n")
    report.plot(results, out / "latency.png", title)
    write_results(out, args, results, startup, started, paired)
    print(f"\n{title}\n\n{md}\n\n{summary_line}\n{startup_line}\n"
          f"total {time.monotonic() - started:.0f} s; files in {out} (table.md, results.json, latency.png, *.html)")
    if failed or (args.strict and not (ratio <= args.max_ttft_ratio)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
