"""Disaggregated against aggregated on the same GPUs: an open-loop request-rate ladder and goodput per GPU.

    python -m bench.gpu.pd                              # every GPU here (an even number, >= 2)
    python -m bench.gpu.pd --workloads 4k-256 --rates 1,2,4,8 --duration 60
    python -m bench.gpu.pd --device cpu                 # the same code on the tiny CPU model: a check that it runs,
                                                        # not a measurement (2 cores cannot host a fair comparison)

Modes, each on all G GPUs, one after the other:
  aggregated     our app, G replicas of one engine, one per GPU;
  aggregated-direct  the same with frontend.direct_streaming (the frontend inside each engine replica);
  disaggregated  our app, G/2 prefill + G/2 decode engines, one per GPU, the KV cache moved by NIXL;
  vllm           G direct vLLM servers, one per GPU, each offered 1/G of the rate by its own Locust process.
Engines are started by the same launcher as `make demo` (devstack.stack.LocalStack), compiled (CUDA
graphs) unless --eager, with the same engine arguments in every mode.

For each workload (prompt tokens - output tokens) and offered rate: the project's locustfile, headless, open
loop (--request-rate, Poisson arrivals) for --duration seconds, every request recorded (--samples-jsonl).
Goodput = requests per second that started in the window and met the SLO per request (TTFT <= --slo-ttft-ms
and time per output token <= --slo-tpot-ms), per GPU. A workload's ladder stops once a mode saturates
(it completed under 80 % of the offered rate, failed over 5 %, or its TTFT p95 passed 10x the SLO).
Disaggregated requests are joined to the app's per-hop trace lines (serve_app/telemetry/hops.py) by request id.

Writes into --out: summary.json, table.md, goodput.png, commands.txt, per step the Locust samples and summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from bench.report import save_run
from bench.servers import REPO_ROOT, ServerProcess, vllm_server
from bench.ttft import cpu_app_args, gpu_app_args, median
from loadtests.openai_load.samples import percentile
from serve_app.telemetry import hops
from devstack import serve_config as cpu_config
from devstack.cluster import NodeSpec
from devstack.ports import BENCH
from devstack.stack import LocalStack
from devstack.tiny_model import ensure_tiny_model

LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"
WORKLOADS = {"4k-256": (4096, 256), "1k-1k": (1024, 1024), "2k-512": (2048, 512)}
CPU_WORKLOADS = {"256-32": (256, 32), "1k-16": (1024, 16)}
MODES = ("aggregated", "aggregated-direct", "disaggregated", "vllm")
APP_MODES = {"aggregated": ("aggregated", {}), "aggregated-direct": ("aggregated", {"frontend.direct_streaming": True}),
             "disaggregated": ("disaggregated", {})}  # bench mode -> (app mode, AppConfig overrides)


def log(msg: str) -> None:
    print(f"[bench.gpu.pd {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Step:
    workload: str
    mode: str
    rate_rps: float
    gpus: int
    requests: int
    ok: int
    achieved_rps: float
    goodput_rps: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    error_rate: float
    hops_p50_ms: Optional[dict[str, Optional[float]]] = None

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus

    def saturated(self, slo_ttft_ms: float) -> bool:
        return (self.achieved_rps < 0.8 * self.rate_rps or self.error_rate > 0.05
                or not self.ttft_p95_ms <= 10 * slo_ttft_ms)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--workloads", default=None, help=f"of {', '.join(WORKLOADS)} (CPU: {', '.join(CPU_WORKLOADS)})")
    p.add_argument("--rates", default=None, help="offered requests/s, ascending (default GPU 0.5,1,2,4,6,8,12,16)")
    p.add_argument("--duration", type=int, default=None, help="seconds per rate (default GPU 60, CPU 15)")
    p.add_argument("--slo-ttft-ms", type=float, default=2000)
    p.add_argument("--slo-tpot-ms", type=float, default=50)
    p.add_argument("--model", type=Path, help="a Hugging Face model folder (default: a dummy Llama-3-8B shape)")
    p.add_argument("--model-config", type=Path, help="a folder with config.json and tokenizer files, served with "
                   "dummy weights (default: Llama-3-8B dimensions and the tiny test tokenizer, built here)")
    p.add_argument("--model-id", default=None)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--remote-prefill-min-tokens", type=int, default=0,
                   help="the app's selective-disaggregation threshold in the disaggregated mode")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    cpu = a.device == "cpu"
    a.modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in a.modes if m not in MODES]:
        p.error(f"--modes: unknown {bad}")
    table = CPU_WORKLOADS if cpu else WORKLOADS
    a.workloads = [w for w in (a.workloads or ",".join(list(table)[:2])).split(",") if w]
    if bad := [w for w in a.workloads if w not in table]:
        p.error(f"--workloads: unknown {bad}; known: {', '.join(table)}")
    a.workload_sizes = {w: table[w] for w in a.workloads}
    a.rates = [float(r) for r in (a.rates or ("0.5,1,2" if cpu else "0.5,1,2,4,6,8,12,16")).split(",") if r]
    a.duration = a.duration or (15 if cpu else 60)
    a.model_id = a.model_id or ("tiny" if cpu else "m8b")
    return a


def gpu_count(device: str, modes: list[str]) -> tuple[int, str]:
    if device == "cpu":
        return 2, "2xCPU (check only)"
    import torch

    count = torch.cuda.device_count()
    if "disaggregated" in modes and (count < 2 or count % 2):
        raise SystemExit(f"bench.gpu.pd: disaggregated needs an even number of GPUs >= 2, this machine has {count}")
    if count < 1:
        raise SystemExit("bench.gpu.pd: no CUDA GPU")
    return count, f"{count}x{torch.cuda.get_device_name(0).replace('NVIDIA ', '')}"


def engine_setup(a: argparse.Namespace, out: Path) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """Model, engine arguments and engine environment shared by every mode."""
    if a.device == "cpu":
        return ensure_tiny_model(), dict(cpu_config.CPU_ENGINE_ARGS), dict(cpu_config.CPU_LOOPBACK_ENV)
    import importlib.util

    from bench.gpu.model import dummy_model

    longest = max(i + o for i, o in a.workload_sizes.values()) + 256
    engine: dict[str, Any] = {"max_model_len": longest, "gpu_memory_utilization": 0.85, "dtype": "bfloat16"}
    if a.model is None:
        engine["load_format"] = "dummy"
    if a.eager:
        engine["enforce_eager"] = True
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if importlib.util.find_spec("flashinfer") is None:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    model = a.model or a.model_config or dummy_model("llama3-8b", out / "model", longest + 1024, ensure_tiny_model())
    return Path(model), engine, env


def app_stack(mode: str, gpus: int, a: argparse.Namespace, model: Path, engine: dict[str, Any],
              env: dict[str, str]) -> LocalStack:
    half = gpus // 2
    app_mode, extra = APP_MODES[mode]
    if a.device == "cpu":
        nodes = (NodeSpec("head", num_cpus=2), NodeSpec("prefill", num_cpus=4, role="prefill"),
                 NodeSpec("decode", num_cpus=4, role="decode"))
        app_args = functools.partial(cpu_app_args, overrides={})
    else:
        if app_mode == "aggregated":
            nodes = (NodeSpec("head", num_cpus=4), NodeSpec("decode", num_cpus=8 * gpus, role="decode",
                                                            gpus=tuple(range(gpus))))
        else:
            nodes = (NodeSpec("head", num_cpus=4),
                     NodeSpec("prefill", num_cpus=8 * half, role="prefill", gpus=tuple(range(half))),
                     NodeSpec("decode", num_cpus=8 * half, role="decode", gpus=tuple(range(half, gpus))))
        app_args = functools.partial(gpu_app_args, model_id=a.model_id, engine=engine, env=env, overrides={})
    overrides = {"decode.replicas": gpus} if app_mode == "aggregated" else {
        "decode.replicas": half, "prefill.replicas": half, "remote_prefill_min_tokens": a.remote_prefill_min_tokens}
    return LocalStack(apps={"llm": ("/", app_mode)}, ports=BENCH, model_path=model, nodes=nodes, app_args=app_args,
                      overrides={"llm": {**overrides, **extra}}, object_store_bytes=2 * 1024**3 if a.device == "gpu" else 256 * 1024**2,
                      deploy_timeout_s=1800)


def run_locust(url: str, rate: float, sizes: tuple[int, int], duration: int, prefix: Path, request_ids: str,
               calibration: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-H", url.removesuffix("/v1"), "-u", "1", "-r", "1", "-t", f"{duration}s", "--stop-timeout", "300",
           "--api", "completions", "--input-tokens", str(sizes[0]), "--output-tokens", str(sizes[1]),
           "--request-rate", str(rate), "--max-requests", str(int(rate * duration * 2) + 10),
           "--samples-jsonl", f"{prefix}.samples.jsonl", "--summary-json", f"{prefix}.summary.json",
           "--request-id-prefix", request_ids, "--calibration-file", str(calibration)]
    log_file = open(f"{prefix}.locust.log", "w")
    return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)


def measure(records: list[dict[str, Any]], *, workload: str, mode: str, rate: float, gpus: int, duration: int,
            slo_ttft_ms: float, slo_tpot_ms: float, traces: dict[str, dict[str, Any]]) -> Step:
    if not records:
        return Step(workload, mode, rate, gpus, 0, 0, 0.0, 0.0, math.nan, math.nan, math.nan, math.nan, 1.0)
    t0 = min(r["start"] for r in records)
    window = [r for r in records if r["start"] <= t0 + duration]
    ok = [r for r in window if r["ok"] and r["ttft_ms"] is not None]
    good = [r for r in ok if r["ttft_ms"] <= slo_ttft_ms and (r["itl_ms"] or 0.0) <= slo_tpot_ms]
    ttft = [r["ttft_ms"] for r in ok]
    tpot = [r["itl_ms"] for r in ok if r["itl_ms"] is not None]
    traced = [traces[r["id"]]["segments_ms"] for r in ok if r.get("id") in traces]
    hop_p50 = ({h: median([t[h] for t in traced if h in t]) for h in hops.SEGMENTS if any(h in t for t in traced)}
               if traced else None)
    return Step(workload, mode, rate, gpus, requests=len(window), ok=len(ok),
                achieved_rps=len(ok) / duration, goodput_rps=len(good) / duration,
                ttft_p50_ms=percentile(ttft, 50), ttft_p95_ms=percentile(ttft, 95),
                tpot_p50_ms=percentile(tpot, 50), tpot_p95_ms=percentile(tpot, 95),
                error_rate=1 - len(ok) / len(window), hops_p50_ms=hop_p50)


def ladder(mode: str, urls: list[str], a: argparse.Namespace, gpus: int, out: Path) -> list[Step]:
    steps: list[Step] = []
    for workload, sizes in a.workload_sizes.items():
        calibration = out / f"calibration-{mode}-{workload}.json"
        for rate in a.rates:
            tag = f"{mode}-{workload}-r{rate:g}"
            procs = [run_locust(url, rate / len(urls), sizes, a.duration, out / f"{tag}-{i}", f"{tag}-{i}", calibration)
                     for i, url in enumerate(urls)]
            for proc in procs:
                proc.wait(timeout=a.duration + 900)
            records = [json.loads(line) for i in range(len(urls))
                       for line in (out / f"{tag}-{i}.samples.jsonl").read_text().splitlines()
                       if (out / f"{tag}-{i}.samples.jsonl").exists()]
            traces = {r["id"]: r["server_trace"] for r in records if r.get("server_trace")}
            step = measure(records, workload=workload, mode=mode, rate=rate, gpus=gpus, duration=a.duration,
                           slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms, traces=traces)
            steps.append(step)
            log(f"{tag}: {step.ok}/{step.requests} ok, {step.achieved_rps:.2f} req/s, goodput {step.goodput_rps:.2f} "
                f"req/s ({step.goodput_per_gpu:.2f}/GPU), TTFT p50/p95 {step.ttft_p50_ms:.0f}/{step.ttft_p95_ms:.0f} ms, "
                f"TPOT p50/p95 {step.tpot_p50_ms:.1f}/{step.tpot_p95_ms:.1f} ms")
            (out / "steps.json").write_text(json.dumps([dataclasses.asdict(s) for s in steps], indent=1))
            if step.saturated(a.slo_ttft_ms):
                log(f"{mode} {workload}: saturated at {rate:g} req/s")
                break
    return steps


def run_mode(mode: str, a: argparse.Namespace, gpus: int, out: Path, model: Path, engine: dict[str, Any],
             env: dict[str, str]) -> list[Step]:
    if mode == "vllm":
        servers: list[ServerProcess] = []
        try:
            for i in range(gpus):
                dev_env = ({**env, "CUDA_VISIBLE_DEVICES": str(i)} if a.device == "gpu"
                           else {**env, "VLLM_CPU_OMP_THREADS_BIND": str(i % 2)})
                server = vllm_server(BENCH.aux(i), str(model), out / f"server-vllm-{i}.log", served_name=a.model_id,
                                     engine_args=engine, env=dev_env)
                server.start()
                servers.append(server)
            for server in servers:
                server.wait_ready(1800)
            return ladder(mode, [s.base_url for s in servers], a, gpus, out)
        finally:
            for server in servers:
                server.stop()
    stack = app_stack(mode, gpus, a, model, engine, env)
    try:
        stack.start()
        (out / f"serve_config-{mode}.json").write_text(json.dumps(stack.serve_config, indent=1))
        return ladder(mode, [stack.base_url("llm")], a, gpus, out)
    finally:
        stack.stop(keep_logs=True)


def summarize(steps: list[Step], a: argparse.Namespace, device: str, gpus: int) -> dict[str, Any]:
    lowest = {(s.workload, s.mode): s for s in reversed(steps)}  # the lowest rate of each ladder
    best: dict[str, dict[str, float]] = {}
    for s in steps:
        cur = best.setdefault(s.workload, {})
        cur[s.mode] = max(cur.get(s.mode, 0.0), s.goodput_per_gpu)
    return {
        "device": device, "compiled": not a.eager, "gpus": gpus,
        "slo": {"ttft_p95_ms": a.slo_ttft_ms, "tpot_p95_ms": a.slo_tpot_ms, "per_request": True},
        "workloads": {w: {"input_tokens": i, "output_tokens": o} for w, (i, o) in a.workload_sizes.items()},
        # at the lowest offered rate of each ladder (requests rarely overlap there), by prompt tokens
        "ttft_p50_ms": {m: {str(a.workload_sizes[w][0]): lowest[(w, m)].ttft_p50_ms for w in a.workloads
                            if (w, m) in lowest} for m in a.modes},
        "goodput": [{"workload": s.workload, "mode": s.mode, "gpus": s.gpus, "rate_rps": s.rate_rps,
                     "goodput_rps": round(s.goodput_rps, 3), "goodput_rps_per_gpu": round(s.goodput_per_gpu, 3),
                     "achieved_rps": round(s.achieved_rps, 3), "ttft_p50_ms": s.ttft_p50_ms,
                     "ttft_p95_ms": s.ttft_p95_ms, "tpot_p50_ms": s.tpot_p50_ms, "tpot_p95_ms": s.tpot_p95_ms,
                     "error_rate": s.error_rate} for s in steps],
        "best_goodput_per_gpu": best,
        "disaggregated_hops_p50_ms": {f"{s.workload}@{s.rate_rps:g}": s.hops_p50_ms for s in steps
                                      if s.mode == "disaggregated" and s.hops_p50_ms},
    }


def table(summary: dict[str, Any]) -> str:
    rows = ["| workload | mode | rate (req/s) | achieved | goodput/GPU | TTFT p50 / p95 (ms) | TPOT p50 / p95 (ms) | "
            "errors |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for g in summary["goodput"]:
        rows.append(f"| {g['workload']} | {g['mode']} | {g['rate_rps']:g} | {g['achieved_rps']:.2f} | "
                    f"{g['goodput_rps_per_gpu']:.2f} | {g['ttft_p50_ms']:.0f} / {g['ttft_p95_ms']:.0f} | "
                    f"{g['tpot_p50_ms']:.1f} / {g['tpot_p95_ms']:.1f} | {g['error_rate']:.1%} |")
    rows += ["", "Best goodput per GPU (req/s meeting the SLO):", ""]
    for w, by_mode in summary["best_goodput_per_gpu"].items():
        rows.append(f"- {w}: " + ", ".join(f"{m} {v:.2f}" for m, v in by_mode.items()))
    return "\n".join(rows)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(summary["workloads"])
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.6 * len(workloads)), squeeze=False)
    for row, w in enumerate(workloads):
        for mode in MODES:
            pts = [g for g in summary["goodput"] if g["workload"] == w and g["mode"] == mode]
            if not pts:
                continue
            rates = [g["rate_rps"] for g in pts]
            axes[row][0].plot(rates, [g["goodput_rps_per_gpu"] for g in pts], marker="o", label=mode)
            axes[row][1].plot(rates, [g["ttft_p95_ms"] for g in pts], marker="o", label=f"{mode} TTFT p95")
        axes[row][0].set_title(f"{w}: goodput per GPU ({summary['device']})")
        axes[row][0].set_xlabel("offered req/s")
        axes[row][0].set_ylabel("req/s meeting SLO, per GPU")
        axes[row][1].set_yscale("log")
        axes[row][1].axhline(summary["slo"]["ttft_p95_ms"], color="grey", linestyle="--", label="TTFT SLO")
        axes[row][1].set_title(f"{w}: TTFT p95")
        axes[row][1].set_xlabel("offered req/s")
        for ax in axes[row]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    a = parse_args(argv)
    started = time.monotonic()
    out = a.out or REPO_ROOT / "bench" / "out" / time.strftime(f"pd-{a.device}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "commands.txt").write_text("python -m bench.gpu.pd " + " ".join(
        shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:])) + "\n")
    gpus, device = gpu_count(a.device, a.modes)
    model, engine, env = engine_setup(a, out)
    log(f"{device}; modes {a.modes}; workloads {a.workload_sizes}; rates {a.rates}; {a.duration} s each")
    steps: list[Step] = []
    for mode in a.modes:
        t = time.monotonic()
        steps += run_mode(mode, a, gpus, out, model, engine, env)
        log(f"{mode}: done in {time.monotonic() - t:.0f} s")
    summary = summarize(steps, a, device, gpus)
    return save_run(out, summary, table(summary), plot, "goodput.png", started)


if __name__ == "__main__":
    sys.exit(main())
