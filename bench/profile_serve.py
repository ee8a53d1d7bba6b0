"""Where does a request's time go? Profile one serving mode at concurrency 1.

    python -m bench.profile_serve --mode aggregated [--app-env KEY=VALUE] [--duration 30]
    python -m bench.profile_serve --mode vllm

Starts the server like the bench does, warms it up, then runs the bench workload with one user
while it
- samples every serving process with py-spy (`record --gil --format raw`: collapsed stacks of the
  thread holding the GIL, i.e. where Python spends CPU; native waits of Ray's core worker excluded),
- measures each process's CPU time over the run (psutil), reported as CPU ms per request,
- reads the app's own per-request histograms (serve_app.telemetry.metrics, exported by Ray on each node's
  metrics port): TTFT seen inside the engine replica vs TTFT seen by the client.
Writes <out>/profile-<mode>.json, one collapsed-stack file per process (for flamegraph tools)
and prints the top frames per process. Loopback only; bounded in time and requests.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import psutil

from bench.cpu import APP_PORT, READY_TIMEOUT_S, VLLM_PORT
from bench.ladder import Workload, run_level, warm_up
from bench.servers import REPO_ROOT, ServerProcess, app_server, tiny_model_path, vllm_server
from devstack.ports import BENCH

# process title (cmdline) patterns of the serving path, per mode
ROLES: dict[str, dict[str, str]] = {
    "vllm": {"api_server": r"vllm\.entrypoints\.openai\.api_server", "engine_core": r"^VLLM::EngineCore",
             "worker": r"^VLLM::Worker"},
    "aggregated": {"proxy": r"ray::ProxyActor", "ingress": r"ray::ServeReplica:llm:\w*Ingress",
                   "llm_server": r"ray::ServeReplica:llm:(Aggregated:|LLMServer:)?tiny", "engine_core": r"^VLLM::EngineCore",
                   "worker": r"^VLLM::Worker"},
}
ROLES["disaggregated"] = {**ROLES["aggregated"], "llm_server": r"ray::ServeReplica:llm:Decode:tiny",
                          "prefill_server": r"ray::ServeReplica:llm:Prefill:tiny"}
# metrics ports of the bench's Ray nodes (bench.app_server runs on the BENCH port plan)
METRICS_PORTS = tuple(BENCH.node_ports(i)["metrics-export-port"] for i in range(3))


def _ours(server: ServerProcess) -> Callable[[psutil.Process], bool]:
    """Processes of this server only (other clusters may run on the machine): for the app, those
    carrying the launcher's RLD_CLUSTER_ID (named in its log as /tmp/rld-<id>); for vLLM, the
    server's descendants."""
    if server.mode == "vllm":
        assert server.proc is not None
        mine = {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)} | {server.proc.pid}
        return lambda p: p.pid in mine
    m = re.search(rb"/tmp/rld-([0-9a-f]+)", server.log_path.read_bytes())
    if not m:
        raise RuntimeError(f"no cluster id (/tmp/rld-<id>) in {server.log_path}")
    cluster_id = m.group(1).decode()

    def check(p: psutil.Process) -> bool:
        try:
            return p.environ().get("RLD_CLUSTER_ID") == cluster_id
        except psutil.Error:
            return False
    return check


def find_processes(server: ServerProcess) -> dict[str, list[psutil.Process]]:
    mode, ours = server.mode, _ours(server)
    found: dict[str, list[psutil.Process]] = {role: [] for role in ROLES[mode]}
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if not any(re.search(pattern, cmd) for pattern in ROLES[mode].values()) or not ours(p):
            continue
        for role, pattern in ROLES[mode].items():
            if re.search(pattern, cmd):
                found[role].append(p)
                break
    return found


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def histogram_mean(text: str, name: str) -> dict[str, float]:
    """{labels: mean seconds} of a Prometheus histogram in `text` (sum / count per label set)."""
    sums, counts = {}, {}
    for line in text.splitlines():
        m = re.match(rf"^{name}_(sum|count)\{{(.*)\}} ([0-9.eE+-]+)$", line)
        if m:
            (sums if m.group(1) == "sum" else counts)[m.group(2)] = float(m.group(3))
    return {k: sums[k] / counts[k] for k in sums if counts.get(k)}


def top_frames(collapsed: Path, n: int = 12) -> list[tuple[str, float]]:
    """Self-time share of the hottest leaf frames in a py-spy raw (collapsed) file."""
    self_counts: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        self_counts[leaf] += int(count)
        total += int(count)
    return [(f, c / total) for f, c in self_counts.most_common(n)] if total else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=sorted(ROLES), required=True)
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--app-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    a = ap.parse_args(argv)
    env = dict(item.split("=", 1) for item in a.app_env)
    out = a.out or REPO_ROOT / "bench" / "out" / time.strftime("profile-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    py_spy = str(Path(sys.executable).with_name("py-spy"))
    w = Workload("chat", a.input_tokens, a.output_tokens, a.duration)
    server: ServerProcess
    if a.mode == "vllm":
        server = vllm_server(VLLM_PORT, tiny_model_path(), out / "server-vllm.log")
    else:
        server = app_server(a.mode, APP_PORT, out / f"server-{a.mode}.log", env)
    server.start()
    try:
        server.wait_ready(READY_TIMEOUT_S[a.mode])
        warm_up(a.mode, server.base_url, w, out)
        procs = find_processes(server)
        print("processes:", {r: [p.pid for p in ps] for r, ps in procs.items()}, file=sys.stderr)
        before = {r: cpu_seconds(ps) for r, ps in procs.items()}
        spies = []
        for role, ps in procs.items():
            for p in ps:
                dest = out / f"pyspy-{a.mode}-{role}-{p.pid}.txt"
                spies.append((role, dest, subprocess.Popen(
                    [py_spy, "record", "--pid", str(p.pid), "--duration", str(a.duration + 5), "--rate",
                     str(a.rate), "--format", "raw", "--gil", "--nonblocking", "--output", str(dest)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        level = run_level(a.mode, server.base_url, 1, w, out / "profiled",
                          calibration=out / f"{a.mode}.calibration.json")
        for _, _, sp in spies:
            try:
                sp.wait(timeout=a.duration + 60)
            except subprocess.TimeoutExpired:
                sp.kill()
        after = {r: cpu_seconds(ps) for r, ps in procs.items()}
        n = level.summary["requests"]
        time.sleep(12 if a.mode != "vllm" else 0)  # Ray exports metrics every few seconds
        report: dict[str, Any] = {
            "mode": a.mode, "app_env": env, "requests": n, "client": level.row(),
            "cpu_ms_per_request": {r: (after[r] - before[r]) * 1000 / n for r in procs if n},
            "top_self_frames": {},
        }
        if a.mode != "vllm":
            for name in ("ray_rld_time_to_first_token_seconds", "ray_rld_request_seconds"):
                for port in METRICS_PORTS:
                    now = histogram_mean(scrape(port), name)
                    if now:
                        report.setdefault("replica_histograms_mean_s", {})[f"{name}@{port}"] = now
            report["replica_histograms_note"] = "cumulative since the replica started (warm-up included)"
        for role, dest, _ in spies:
            if dest.exists():
                report["top_self_frames"][f"{role}:{dest.stem.rsplit('-', 1)[-1]}"] = top_frames(dest)
        (out / f"profile-{a.mode}.json").write_text(json.dumps(report, indent=2))
        print(json.dumps({k: v for k, v in report.items() if k != "top_self_frames"}, indent=2))
        for key, frames in report["top_self_frames"].items():
            print(f"\n== {key}: hottest frames (self share of samples)")
            for f, share in frames:
                print(f"  {share:6.1%}  {f[:150]}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
