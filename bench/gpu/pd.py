"""Disaggregated against aggregated on the same GPUs: an open-loop request-rate ladder and goodput per GPU.

    python -m bench.gpu.pd                              # every GPU here (an even number, >= 2)
    python -m bench.gpu.pd --workloads 4k-256 --rates 1,2,4,8 --duration 60
    python -m bench.gpu.pd --device cpu                 # the same code on the tiny CPU model: a check that it runs,
                                                        # not a measurement (2 cores cannot host a fair comparison)

Modes, each on all G GPUs, one after the other:
  aggregated     our app as configured by default, G replicas of one engine, one per GPU (since 2026-12-06 the
                 default is frontend.direct_streaming: the frontend inside each engine replica; results before
                 that date ran the separate frontend under this name);
  aggregated-direct  the same with frontend.direct_streaming set explicitly (the default now);
  aggregated-separate  the same with frontend.direct_streaming false (a frontend deployment in front);
  disaggregated  our app, G/2 prefill + G/2 decode engines, one per GPU, the KV cache moved by NIXL;
  vllm           G direct vLLM servers, one per GPU, each offered 1/G of the rate by its own Locust process.
Engines are started by the same launcher as `make demo` (devstack.stack.LocalStack), compiled (CUDA
graphs) unless --eager, with the same engine arguments in every mode.

For each workload (prompt tokens - output tokens) and offered rate: the project's locustfile, headless, open
loop (--request-rate, Poisson arrivals) for --duration seconds, every request recorded (--samples-jsonl),
then the requests still running finish (--drain-s at most) before the next rate starts. The rate is split over
--clients Locust processes per server (each its own seed, so no two send the same prompts), whose CPU use is
sampled (a client near one core would be the bottleneck); no client caps its requests in flight
(--max-in-flight far above what a step can reach; a request refused by a client would count as failed).
Before each mode's ladder of a workload a few closed-loop requests warm it up (and calibrate prompts).
A mix (`--workloads mixed`, MIXES: 3 requests of 1k-1k to 1 of 4k-256) sends each part as its own Poisson
stream at its share of the rate (their sum is one Poisson stream of randomly drawn parts), with seeds of its own;
its step is measured pooled and per part (`parts` in summary.json, TPOT per part against vLLM's).
Goodput = requests per second that started in the window and met the SLO per request (TTFT <= --slo-ttft-ms
and time per output token <= --slo-tpot-ms), per GPU. A workload's ladder stops once a mode saturates
(it completed under 80 % of the offered rate, failed over 5 %, or its TTFT p95 passed 10x the SLO), unless
--keep-going. Per step: TTFT, TPOT (per request: (last token - first token) / (tokens - 1)) with a bootstrap
95 % interval of its median, ITL (gaps between text chunks at the client, pooled over the step's requests),
the most requests in flight at once, client CPU, and for app modes the ratio to vllm at the same rate.
--profile WORKLOAD@RATE also samples the serving processes during that step (bench/gpu/procprof.py: CPU
cores per process, py-spy stacks). Disaggregated requests are joined to the app's per-hop trace lines
(serve_app/telemetry/hops.py) by request id.

Writes into --out: summary.json, table.md, goodput.png, commands.txt, steps.json, per step the Locust
samples and summary, per profiled step profile-<tag>.json and the collapsed stacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import psutil

from bench.gpu.procprof import ClientCpu, StepProfile, labelled
from bench.report import save_run
from bench.servers import BENCH_API_KEY, REPO_ROOT, ServerProcess, vllm_server
from bench.ttft import cpu_app_args, gpu_app_args, median
from loadtests.openai_load.samples import percentile
from loadtests.openai_load.sse import hist_percentile
from serve_app.telemetry import hops
from devstack import serve_config as cpu_config
from devstack.cluster import NodeSpec
from devstack.ports import BENCH
from devstack.stack import LocalStack
from devstack.tiny_model import ensure_tiny_model

LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"
WORKLOADS = {"4k-256": (4096, 256), "1k-1k": (1024, 1024), "2k-512": (2048, 512)}
CPU_WORKLOADS = {"256-32": (256, 32), "1k-16": (1024, 16), "256-256": (256, 256)}
# Blends of the workloads above by request count: each part is its own Poisson stream at rate x its share, so the
# sum is one Poisson stream in which each arrival is of a part with probability its share (seeded per client).
MIXES = {"mixed": (("1k-1k", 3), ("4k-256", 1))}
CPU_MIXES = {"mixed": (("256-256", 3), ("1k-16", 1))}
MODES = ("aggregated", "aggregated-direct", "aggregated-separate", "disaggregated", "vllm")
APP_MODES = {"aggregated": ("aggregated", {}), "aggregated-direct": ("aggregated", {"frontend.direct_streaming": True}),
             "aggregated-separate": ("aggregated", {"frontend.direct_streaming": False}),
             "disaggregated": ("disaggregated", {})}  # bench mode -> (app mode, AppConfig overrides)
MAX_IN_FLIGHT = 100_000  # per client: no cap a step can reach (Locust's default, 512, capped the 2026-12-01 ladder)


def log(msg: str) -> None:
    print(f"[bench.gpu.pd {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Part:
    """One stream of a step: a workload's sizes at a share of the step's rate."""
    name: str
    sizes: tuple[int, int]
    share: float


def workload_parts(workload: str, table: dict[str, tuple[int, int]],
                   mixes: dict[str, tuple[tuple[str, int], ...]]) -> list[Part]:
    """A plain workload is one part with the whole rate; a mix (MIXES) one part per workload, by weight."""
    if workload in table:
        return [Part(workload, table[workload], 1.0)]
    total = sum(weight for _, weight in mixes[workload])
    return [Part(name, table[name], weight / total) for name, weight in mixes[workload]]


@dataclasses.dataclass(frozen=True)
class Client:
    """One Locust process of a step."""
    part: str
    sizes: tuple[int, int]
    server: int
    rate_rps: float
    seed: int
    suffix: str  # of the step's tag: names its files and request ids


def step_clients(base_seed: int, workload: str, parts: list[Part], rate: float, servers: int,
                 clients: int) -> list[Client]:
    """The Locust processes of one step: `clients` per server and part, the rate split evenly over servers and
    clients and by share over parts. A plain workload keeps its seeds (step_seed); a mix's parts get their own,
    so a mix never repeats a plain step's prompts."""
    plain = len(parts) == 1 and parts[0].name == workload
    return [Client(p.name, p.sizes, i, rate * p.share / (servers * clients),
                   step_seed(base_seed, workload if plain else f"{workload}/{p.name}", rate, j),
                   f"{i}-{j}" if plain else f"{i}-{p.name}-{j}")
            for i in range(servers) for p in parts for j in range(clients)]


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
    tpot_p50_ci95_ms: Optional[tuple[float, float]] = None
    itl_p50_ms: float = math.nan
    itl_p95_ms: float = math.nan
    max_in_flight: int = 0
    clients: int = 1
    client_cpu: Optional[dict[str, Optional[float]]] = None
    client_refused: int = 0
    parts: Optional[dict[str, dict[str, float]]] = None  # a mix's parts measured alone (ok, TTFT, TPOT, goodput)

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
    p.add_argument("--modes", default=",".join(m for m in MODES if m != "aggregated-direct"))  # that one is the default now
    p.add_argument("--workloads", default=None, help=f"of {', '.join([*WORKLOADS, *MIXES])} "
                   f"(CPU: {', '.join([*CPU_WORKLOADS, *CPU_MIXES])}); a mix: {MIXES}")
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
    p.add_argument("--clients", type=int, default=None, help="Locust processes per server, each offered rate/N "
                   "(default GPU 4, CPU 1)")
    p.add_argument("--drain-s", type=int, default=300, help="longest wait for a step's requests to finish")
    p.add_argument("--keep-going", action="store_true", help="run every rate, also past a mode's saturation")
    p.add_argument("--seed", type=int, default=0, help="base of the clients' prompt seeds")
    p.add_argument("--profile", action="append", default=[], metavar="WORKLOAD@RATE",
                   help="sample the serving processes during this step (CPU per process, py-spy); repeatable")
    p.add_argument("--profile-s", type=int, default=30, help="seconds sampled, ending with the arrival window")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=JSON",
                   help="vLLM engine argument for every mode, direct vLLM included; repeatable")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=BASE:PATH=JSON[;PATH=JSON]",
                   help="one more app mode: BASE (an app mode) with these AppConfig overrides; list NAME in --modes")
    p.add_argument("--cluster-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment of every Ray process of the app's cluster; repeatable")
    p.add_argument("--only", action="append", default=[], metavar="MODE=WORKLOAD@RATE[,WORKLOAD@RATE]",
                   help="run only these steps of MODE (e.g. a variant measured at one rate); repeatable")
    p.add_argument("--warm-up", type=int, default=2, help="closed-loop requests before each mode's workload")
    p.add_argument("--workload-rates", action="append", default=[], metavar="WORKLOAD=R1,R2",
                   help="this workload's offered rates instead of --rates; repeatable")
    p.add_argument("--merge", action="append", type=Path, default=[], metavar="DIR",
                   help="measure nothing: summarize the steps.json of these earlier runs' --out folders together "
                   "(e.g. the modes of one machine run in two invocations); --device-name names the machine")
    p.add_argument("--device-name", default=None)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    cpu = a.device == "cpu"
    a.app_modes = dict(APP_MODES)
    for spec in a.variant:
        name, _, rest = spec.partition("=")
        base, _, overrides = rest.partition(":")
        if not name or base not in APP_MODES:
            p.error(f"--variant {spec!r}: NAME=BASE:PATH=JSON[;PATH=JSON], BASE one of {', '.join(APP_MODES)}")
        app_mode, extra = APP_MODES[base]
        extra = dict(extra)
        for item in filter(None, overrides.split(";")):
            path, _, value = item.partition("=")
            extra[path] = json.loads(value)
        a.app_modes[name] = (app_mode, extra)
    a.modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in a.modes if m not in MODES and m not in a.app_modes]:
        p.error(f"--modes: unknown {bad}")
    a.engine_extra = {k: json.loads(v) for k, _, v in (e.partition("=") for e in a.engine_arg)}
    a.cluster_env = dict(e.split("=", 1) for e in a.cluster_env)
    a.clients = a.clients or (1 if cpu else 4)
    a.profile = {tuple(x.split("@")) for x in a.profile}
    a.only = {m: {tuple(x.split("@")) for x in steps.split(",")} for m, _, steps in (o.partition("=") for o in a.only)}
    a.rates_of = {w: [float(r) for r in rates.split(",") if r]
                  for w, _, rates in (x.partition("=") for x in a.workload_rates)}
    table, mixes = (CPU_WORKLOADS, CPU_MIXES) if cpu else (WORKLOADS, MIXES)
    a.workloads = [w for w in (a.workloads or ",".join(list(table)[:2])).split(",") if w]
    if bad := [w for w in a.workloads if w not in table and w not in mixes]:
        p.error(f"--workloads: unknown {bad}; known: {', '.join([*table, *mixes])}")
    a.workload_parts = {w: workload_parts(w, table, mixes) for w in a.workloads}
    a.workload_sizes = {w: table[w] for w in a.workloads if w in table}
    a.rates = [float(r) for r in (a.rates or ("0.5,1,2" if cpu else "0.5,1,2,4,6,8,12,16")).split(",") if r]
    a.duration = a.duration or (15 if cpu else 60)
    a.model_id = a.model_id or ("tiny" if cpu else "m8b")
    return a


def gpu_count(device: str, modes: list[str]) -> tuple[int, str]:
    if device == "cpu":
        return 2, "2xCPU (check only)"
    import torch

    count = torch.cuda.device_count()
    if any(m.startswith("disaggregated") for m in modes) and (count < 2 or count % 2):
        raise SystemExit(f"bench.gpu.pd: disaggregated needs an even number of GPUs >= 2, this machine has {count}")
    if count < 1:
        raise SystemExit("bench.gpu.pd: no CUDA GPU")
    return count, f"{count}x{torch.cuda.get_device_name(0).replace('NVIDIA ', '')}"


def engine_setup(a: argparse.Namespace, out: Path) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """Model, engine arguments and engine environment shared by every mode."""
    if a.device == "cpu":
        return ensure_tiny_model(), {**cpu_config.CPU_ENGINE_ARGS, **a.engine_extra}, dict(cpu_config.CPU_LOOPBACK_ENV)
    import importlib.util

    from bench.gpu.model import dummy_model

    longest = max(i + o for parts in a.workload_parts.values() for i, o in (p.sizes for p in parts)) + 256
    engine: dict[str, Any] = {"max_model_len": longest, "gpu_memory_utilization": 0.85, "dtype": "bfloat16"}
    if a.model is None:
        engine["load_format"] = "dummy"
    if a.eager:
        engine["enforce_eager"] = True
    engine.update(a.engine_extra)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if importlib.util.find_spec("flashinfer") is None:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    model = a.model or a.model_config or dummy_model("llama3-8b", out / "model", longest + 1024, ensure_tiny_model())
    return Path(model), engine, env


def app_stack(mode: str, gpus: int, a: argparse.Namespace, model: Path, engine: dict[str, Any],
              env: dict[str, str]) -> LocalStack:
    half = gpus // 2
    app_mode, extra = a.app_modes[mode]
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
                      deploy_timeout_s=1800, api_keys=(BENCH_API_KEY,), cluster_env=dict(a.cluster_env))


def run_locust(url: str, rate: float, sizes: tuple[int, int], duration: int, prefix: Path, request_ids: str,
               calibration: Path, *, seed: int, drain_s: int, warm_up: int = 0) -> subprocess.Popen:
    """One Locust process: open loop at `rate` for `duration` s (then up to `drain_s` for what is in flight),
    or with `warm_up` > 0 that many closed-loop requests, one at a time."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-H", url.removesuffix("/v1"), "-u", "1", "-r", "1", "--api", "completions", "--input-tokens",
           str(sizes[0]), "--output-tokens", str(sizes[1]), "--api-key", BENCH_API_KEY, "--seed", str(seed),
           "--summary-json", f"{prefix}.summary.json", "--calibration-file", str(calibration)]
    if warm_up:
        cmd += ["-t", "600s", "--max-requests", str(warm_up), "--stop-timeout", "120"]
    else:
        cmd += ["-t", f"{duration}s", "--stop-timeout", str(drain_s), "--request-rate", str(rate),
                "--max-requests", str(int(rate * duration * 2) + 10), "--max-in-flight", str(MAX_IN_FLIGHT),
                "--samples-jsonl", f"{prefix}.samples.jsonl", "--request-id-prefix", request_ids]
    log_file = open(f"{prefix}.locust.log", "w")
    return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)


def step_seed(base: int, workload: str, rate: float, client: int) -> int:
    """A seed per (workload, rate, client): no two clients, steps or workloads send the same prompts (a
    repeated prompt would be served from the prefix cache); the same in every mode, so modes see the same ones."""
    return random.Random(f"{base}-{workload}-{rate:g}-{client}").randrange(1 << 30)


def max_in_flight(records: list[dict[str, Any]]) -> int:
    """The most requests in flight at once (start..end intervals of the records)."""
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def median_ci95(values: list[float], resamples: int = 400, seed: int = 0) -> Optional[tuple[float, float]]:
    """Bootstrap 95 % interval of the median of `values` (None below 10 values)."""
    if len(values) < 10:
        return None
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(percentile([values[rng.randrange(n)] for _ in range(n)], 50) for _ in range(resamples))
    return (round(meds[int(0.025 * resamples)], 3), round(meds[int(0.975 * resamples) - 1], 3))


def measure(records: list[dict[str, Any]], *, workload: str, mode: str, rate: float, gpus: int, duration: int,
            slo_ttft_ms: float, slo_tpot_ms: float, traces: dict[str, dict[str, Any]],
            t0: Optional[float] = None) -> Step:
    """`t0`: the start of the arrival window (default: the first record's start)."""
    if not records:
        return Step(workload, mode, rate, gpus, 0, 0, 0.0, 0.0, math.nan, math.nan, math.nan, math.nan, 1.0)
    t0 = min(r["start"] for r in records) if t0 is None else t0
    window = [r for r in records if r["start"] <= t0 + duration]
    # Arrivals span a little less than `duration` (each client starts its -t clock before its first request):
    # rates are per second of the arrival window actually covered.
    span = max(r["start"] for r in window) - t0
    seconds = span if span >= duration / 2 else duration
    ok = [r for r in window if r["ok"] and r["ttft_ms"] is not None]
    good = [r for r in ok if r["ttft_ms"] <= slo_ttft_ms and (r["itl_ms"] or 0.0) <= slo_tpot_ms]
    ttft = [r["ttft_ms"] for r in ok]
    tpot = [r["itl_ms"] for r in ok if r["itl_ms"] is not None]
    gaps: dict[int, int] = {}
    for r in ok:
        for b, n in (r.get("gaps") or {}).items():
            gaps[int(b)] = gaps.get(int(b), 0) + n
    traced = [traces[r["id"]]["segments_ms"] for r in ok if r.get("id") in traces]
    hop_p50 = ({h: median([t[h] for t in traced if h in t]) for h in hops.SEGMENTS if any(h in t for t in traced)}
               if traced else None)
    return Step(workload, mode, rate, gpus, requests=len(window), ok=len(ok),
                achieved_rps=len(ok) / seconds, goodput_rps=len(good) / seconds,
                ttft_p50_ms=percentile(ttft, 50), ttft_p95_ms=percentile(ttft, 95),
                tpot_p50_ms=percentile(tpot, 50), tpot_p95_ms=percentile(tpot, 95),
                error_rate=1 - len(ok) / len(window), hops_p50_ms=hop_p50, tpot_p50_ci95_ms=median_ci95(tpot),
                itl_p50_ms=hist_percentile(gaps, 50), itl_p95_ms=hist_percentile(gaps, 95),
                max_in_flight=max_in_flight([r for r in records if r.get("id")]),
                client_refused=sum(1 for r in window if r.get("client_saturated")))


def measure_parts(records: list[dict[str, Any]], step: Step, duration: int, slo_ttft_ms: float,
                  slo_tpot_ms: float, parts: list[Part]) -> Optional[dict[str, dict[str, float]]]:
    """A mix's parts measured alone, over the step's own arrival window (None for a plain workload)."""
    if len(parts) < 2 or not records:
        return None
    t0 = min(r["start"] for r in records)
    found = {}
    for p in parts:
        mine = [r for r in records if r.get("part") == p.name]
        if not mine:
            continue
        s = measure(mine, workload=p.name, mode=step.mode, rate=step.rate_rps * p.share, gpus=step.gpus,
                    duration=duration, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, traces={}, t0=t0)
        found[p.name] = {"share": p.share, "requests": s.requests, "ok": s.ok,
                         "achieved_rps": round(s.achieved_rps, 3), "goodput_rps": round(s.goodput_rps, 3),
                         "ttft_p50_ms": s.ttft_p50_ms, "ttft_p95_ms": s.ttft_p95_ms,
                         "tpot_p50_ms": s.tpot_p50_ms, "tpot_p95_ms": s.tpot_p95_ms}
    return found


def ladder(mode: str, urls: list[str], a: argparse.Namespace, gpus: int, out: Path,
           processes: Optional[Any] = None) -> list[Step]:
    """`processes()`: the serving processes by label (bench/gpu/procprof.py), for --profile steps."""
    steps: list[Step] = []
    for workload, parts in a.workload_parts.items():
        only = a.only.get(mode)
        rates = [r for r in a.rates_of.get(workload, a.rates) if only is None or (workload, f"{r:g}") in only]
        if not rates:
            continue
        # one calibration per prompt size (a mix's parts share their plain workloads')
        calibration = {p.name: out / f"calibration-{mode}-{p.name}.json" for p in parts}
        warm = [run_locust(url, 0, p.sizes, 0, out / (f"{mode}-{workload}-warmup-{i}"
                                 + ("" if len(parts) == 1 else f"-{p.name}")), "", calibration[p.name],
                           seed=a.seed + 999, drain_s=0, warm_up=a.warm_up)
                for i, url in enumerate(urls) for p in parts]
        for proc in warm:
            proc.wait(timeout=900)
        for rate in rates:
            tag = f"{mode}-{workload}-r{rate:g}"
            prefixes, procs = [], []
            for c in step_clients(a.seed, workload, parts, rate, len(urls), a.clients):
                prefix = out / f"{tag}-{c.suffix}"
                prefixes.append((c.part, prefix))
                procs.append(run_locust(urls[c.server], c.rate_rps, c.sizes, a.duration, prefix, f"{tag}-{c.suffix}",
                                        calibration[c.part], seed=c.seed, drain_s=a.drain_s))
            cpu = ClientCpu([p.pid for p in procs]).start()
            profile = None
            if (workload, f"{rate:g}") in a.profile and processes is not None:
                seconds = min(a.profile_s, a.duration - 10)
                profile = StepProfile(processes(), out, tag, delay_s=a.duration - seconds, seconds=seconds).start()
            for proc in procs:
                proc.wait(timeout=a.duration + a.drain_s + 300)
            client_cpu = cpu.stop()
            records = [{**json.loads(line), "part": part} for part, prefix in prefixes
                       if Path(f"{prefix}.samples.jsonl").exists()
                       for line in Path(f"{prefix}.samples.jsonl").read_text().splitlines()]
            traces = {r["id"]: r["server_trace"] for r in records if r.get("server_trace")}
            step = measure(records, workload=workload, mode=mode, rate=rate, gpus=gpus, duration=a.duration,
                           slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms, traces=traces)
            step = dataclasses.replace(step, clients=len(procs), client_cpu=client_cpu,
                                       parts=measure_parts(records, step, a.duration, a.slo_ttft_ms, a.slo_tpot_ms,
                                                           parts))
            steps.append(step)
            log(f"{tag}: {step.ok}/{step.requests} ok, {step.achieved_rps:.2f} req/s, goodput {step.goodput_rps:.2f} "
                f"req/s ({step.goodput_per_gpu:.2f}/GPU), TTFT p50/p95 {step.ttft_p50_ms:.0f}/{step.ttft_p95_ms:.0f} ms, "
                f"TPOT p50/p95 {step.tpot_p50_ms:.1f}/{step.tpot_p95_ms:.1f} ms, ITL p50/p95 {step.itl_p50_ms:.1f}/"
                f"{step.itl_p95_ms:.1f} ms, max in flight {step.max_in_flight}, client CPU {client_cpu}")
            if profile is not None:
                summary = profile.result()
                log(f"{tag}: profile " + ", ".join(f"{k} {v.get('cores')}" for k, v in summary.get("processes", {}).items()))
            (out / "steps.json").write_text(json.dumps([dataclasses.asdict(s) for s in steps], indent=1))
            if step.saturated(a.slo_ttft_ms) and not a.keep_going:
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

            def processes() -> dict[str, psutil.Process]:
                found: list[psutil.Process] = []
                for server in servers:
                    if server.proc is not None:
                        root = psutil.Process(server.proc.pid)
                        found += [root, *root.children(recursive=True)]
                return labelled(found)

            return ladder(mode, [s.base_url for s in servers], a, gpus, out, processes)
        finally:
            for server in servers:
                server.stop()
    stack = app_stack(mode, gpus, a, model, engine, env)
    try:
        stack.start()
        (out / f"serve_config-{mode}.json").write_text(json.dumps(stack.serve_config, indent=1))
        return ladder(mode, [stack.base_url("llm")], a, gpus, out, lambda: labelled(stack.cluster.processes()))
    finally:
        stack.stop(keep_logs=True)


BAR_TPOT = 1.05  # issue 19: app TPOT p50 at most 1.05x direct vLLM's at the same offered rate
BAR_GOODPUT = 0.95  # and app goodput at least 0.95x


def versus_vllm(row: dict[str, Any], base: Optional[dict[str, Any]]) -> dict[str, Any]:
    """An app step's ratios to direct vLLM's step at the same workload and rate, and whether it meets the bar."""
    if base is None:
        return {}
    tpot = row["tpot_p50_ms"] / base["tpot_p50_ms"] if base["tpot_p50_ms"] else math.nan
    out: dict[str, Any] = {"tpot_p50_x_vllm": round(tpot, 3),
                           "ttft_p50_x_vllm": round(row["ttft_p50_ms"] / base["ttft_p50_ms"], 3) if base["ttft_p50_ms"] else math.nan}
    if base["goodput_rps"]:
        out["goodput_x_vllm"] = round(row["goodput_rps"] / base["goodput_rps"], 3)
        out["meets_bar"] = bool(tpot <= BAR_TPOT and out["goodput_x_vllm"] >= BAR_GOODPUT)
    else:  # vLLM met the SLO with no request: no ratio; the goodput half of the bar says nothing here
        out["goodput_x_vllm"] = None
        out["meets_bar"] = bool(tpot <= BAR_TPOT and row["goodput_rps"] >= 0)
        out["bar_note"] = "vLLM goodput 0: only the TPOT half of the bar applies"
    return out


def summarize(steps: list[Step], a: argparse.Namespace, device: str, gpus: int) -> dict[str, Any]:
    lowest = {(s.workload, s.mode): s for s in reversed(steps)}  # the lowest rate of each ladder
    best: dict[str, dict[str, float]] = {}
    for s in steps:
        cur = best.setdefault(s.workload, {})
        cur[s.mode] = max(cur.get(s.mode, 0.0), s.goodput_per_gpu)
    rows = [{"workload": s.workload, "mode": s.mode, "gpus": s.gpus, "rate_rps": s.rate_rps,
             "goodput_rps": round(s.goodput_rps, 3), "goodput_rps_per_gpu": round(s.goodput_per_gpu, 3),
             "achieved_rps": round(s.achieved_rps, 3), "requests": s.requests, "ok": s.ok,
             "ttft_p50_ms": s.ttft_p50_ms, "ttft_p95_ms": s.ttft_p95_ms, "tpot_p50_ms": s.tpot_p50_ms,
             "tpot_p95_ms": s.tpot_p95_ms, "tpot_p50_ci95_ms": s.tpot_p50_ci95_ms, "itl_p50_ms": s.itl_p50_ms,
             "itl_p95_ms": s.itl_p95_ms, "error_rate": s.error_rate, "max_in_flight": s.max_in_flight,
             "clients": s.clients, "client_cpu": s.client_cpu, "client_refused": s.client_refused,
             **({"parts": s.parts} if s.parts else {})} for s in steps]
    base = {(r["workload"], r["rate_rps"]): r for r in rows if r["mode"] == "vllm"}
    for r in rows:
        if r["mode"] != "vllm":
            r.update(versus_vllm(r, base.get((r["workload"], r["rate_rps"]))))
            for name, part in (r.get("parts") or {}).items():
                other = (base.get((r["workload"], r["rate_rps"])) or {}).get("parts", {}).get(name)
                if other and other["tpot_p50_ms"]:
                    part["tpot_p50_x_vllm"] = round(part["tpot_p50_ms"] / other["tpot_p50_ms"], 3)
    return {
        "device": device, "compiled": not a.eager, "gpus": gpus,
        "slo": {"ttft_ms": a.slo_ttft_ms, "tpot_ms": a.slo_tpot_ms, "per_request": True},
        "bar": {"tpot_p50_x_vllm_max": BAR_TPOT, "goodput_x_vllm_min": BAR_GOODPUT},
        "duration_s": a.duration, "clients_per_server": a.clients, "modes": a.modes,
        "app_modes": {m: {"app_mode": a.app_modes[m][0], "overrides": a.app_modes[m][1]} for m in a.modes if m in a.app_modes},
        "engine_args_extra": a.engine_extra, "cluster_env": a.cluster_env,
        "workloads": {w: ({"input_tokens": parts[0].sizes[0], "output_tokens": parts[0].sizes[1]} if w in a.workload_sizes
                          else {"parts": {p.name: {"input_tokens": p.sizes[0], "output_tokens": p.sizes[1],
                                                   "share": p.share} for p in parts}})
                      for w, parts in a.workload_parts.items()},
        # at the lowest offered rate of each ladder (requests rarely overlap there), by prompt tokens
        "ttft_p50_ms": {m: {str(a.workload_sizes[w][0]): lowest[(w, m)].ttft_p50_ms for w in a.workload_sizes
                            if (w, m) in lowest} for m in a.modes},
        "goodput": rows,
        "best_goodput_per_gpu": best,
        "disaggregated_hops_p50_ms": {f"{s.workload}@{s.rate_rps:g}": s.hops_p50_ms for s in steps
                                      if s.mode == "disaggregated" and s.hops_p50_ms},
    }


def _f(value: Any, fmt: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def table(summary: dict[str, Any]) -> str:
    rows = ["| workload | mode | rate | achieved | goodput | TTFT p50 / p95 (ms) | TPOT p50 [95 % CI] / p95 (ms) | "
            "ITL p50 / p95 (ms) | in flight max | client CPU max | errors | TPOT x vLLM | goodput x vLLM |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for g in summary["goodput"]:
        ci = g.get("tpot_p50_ci95_ms")
        ci_text = f" [{ci[0]:.1f}-{ci[1]:.1f}]" if ci else ""
        cpu = (g.get("client_cpu") or {}).get("max_cores_per_client")
        mark = "" if "meets_bar" not in g else (" **miss**" if not g["meets_bar"] else " ok" if g.get("goodput_x_vllm") is not None else " (TPOT only)")
        rows.append(f"| {g['workload']} | {g['mode']} | {g['rate_rps']:g} | {g['achieved_rps']:.2f} | "
                    f"{g['goodput_rps_per_gpu']:.2f} | {_f(g['ttft_p50_ms'], '{:.0f}')} / {_f(g['ttft_p95_ms'], '{:.0f}')} | "
                    f"{_f(g['tpot_p50_ms'], '{:.1f}')}{ci_text} / {_f(g['tpot_p95_ms'], '{:.1f}')} | "
                    f"{_f(g['itl_p50_ms'], '{:.1f}')} / {_f(g['itl_p95_ms'], '{:.1f}')} | {g['max_in_flight']} | "
                    f"{_f(cpu, '{:.2f}')} x{g['clients']} | {g['error_rate']:.1%} | "
                    f"{_f(g.get('tpot_p50_x_vllm'), '{:.2f}')} | {_f(g.get('goodput_x_vllm'), '{:.2f}')}{mark} |")
    mixed = [g for g in summary["goodput"] if g.get("parts")]
    if mixed:
        rows += ["", "Mixed workloads, each part alone (TTFT p50 / TPOT p50 ms, goodput req/s, TPOT x vLLM):", ""]
        for g in mixed:
            rows.append(f"- {g['workload']} @ {g['rate_rps']:g}, {g['mode']}: " + "; ".join(
                f"{name} ({part['share']:.0%}) {_f(part['ttft_p50_ms'], '{:.0f}')} / {_f(part['tpot_p50_ms'], '{:.1f}')}, "
                f"goodput {part['goodput_rps']:.2f}" + (f", x{part['tpot_p50_x_vllm']:.2f}" if "tpot_p50_x_vllm" in part else "")
                for name, part in g["parts"].items()))
    rows += ["", "Best goodput per GPU (req/s meeting the SLO):", ""]
    for w, by_mode in summary["best_goodput_per_gpu"].items():
        rows.append(f"- {w}: " + ", ".join(f"{m} {v:.2f}" for m, v in by_mode.items()))
    return "\n".join(rows)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(summary["workloads"])
    panels = (("goodput_rps_per_gpu", None, "goodput per GPU (req/s meeting the SLO)", False),
              ("tpot_p50_ms", "tpot_p95_ms", "TPOT ms (p50 solid, p95 dashed)", False),
              ("ttft_p50_ms", "ttft_p95_ms", "TTFT ms (p50 solid, p95 dashed)", True))
    fig, axes = plt.subplots(len(workloads), len(panels), figsize=(15, 3.8 * len(workloads)), squeeze=False)
    for row, w in enumerate(workloads):
        for col, (key, key95, title, log_y) in enumerate(panels):
            ax = axes[row][col]
            for i, mode in enumerate(summary["modes"]):
                pts = [g for g in summary["goodput"] if g["workload"] == w and g["mode"] == mode]
                if not pts:
                    continue
                rates = [g["rate_rps"] for g in pts]
                ax.plot(rates, [g[key] for g in pts], "o-", color=f"C{i}", label=mode)
                if key95:
                    ax.plot(rates, [g[key95] for g in pts], "s--", color=f"C{i}", alpha=0.5)
            if key == "ttft_p50_ms":
                ax.axhline(summary["slo"]["ttft_ms"], color="grey", linestyle=":", label="TTFT SLO")
            if key == "tpot_p50_ms":
                ax.axhline(summary["slo"]["tpot_ms"], color="grey", linestyle=":", label="TPOT SLO")
            if log_y:
                ax.set_yscale("log")
            ax.set_title(f"{w}: {title}", fontsize=10)
            ax.set_xlabel("offered req/s")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"{summary['device']}, {summary['duration_s']} s per rate", fontsize=11)
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
    if a.merge:
        steps = [Step(**step) for folder in a.merge for step in json.loads((folder / "steps.json").read_text())]
        steps = [dataclasses.replace(s, tpot_p50_ci95_ms=tuple(s.tpot_p50_ci95_ms) if s.tpot_p50_ci95_ms else None)
                 for s in steps if s.mode in a.modes and s.workload in a.workloads]
        summary = summarize(steps, a, a.device_name or a.device, max((s.gpus for s in steps), default=1))
        summary["merged_from"] = [str(folder) for folder in a.merge]
        return save_run(out, summary, table(summary), plot, "goodput.png", started)
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
