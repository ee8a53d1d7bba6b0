"""Time to first token of our app against direct vLLM, and where the app's time goes, hop by hop.

    python -m bench.ttft --device gpu                 # (= python -m bench.gpu) 8B-shaped dummy model, compiled
    python -m bench.ttft --device cpu                 # the tiny model on this machine's CPU (also: make bench-ttft)
    python -m bench.ttft --device gpu --model /models/Llama-3.1-8B --model-id llama --lengths 1024,4096

Phase `vllm-vs-aggregated` (always): direct vLLM (`python -m vllm.entrypoints.openai.api_server`) and our app
in aggregated mode, started by the same launcher as `make demo` and the tests (devstack.stack.LocalStack:
loopback Ray cluster, the app deployed from a serve config), both up at once with the same engine arguments
(on a GPU machine both on GPU 0, each taking --gpu-memory-utilization of it). For each prompt length: --warm
unpaired warm-ups, then paired time to first token at concurrency 1 (bench/paired.py: identical prompts to
both servers, alternately, timed with the locustfile's own SSE code).

Phase `disaggregated-vs-aggregated` (CPU only; on GPUs the equal-budget comparison is `python -m bench.gpu.pd`):
one stack serving both
modes, paired the same way: what prefill on another engine plus the KV hand-off costs at each length.

The app's per-request trace lines (serve_app/telemetry/hops.py) are joined to the client's measurements by request
id: per-hop medians, the engine's own time to its first chunk, the overhead (client TTFT minus engine),
and what the record leaves unaccounted (client TTFT minus the frontend's first byte out: the Serve proxy
and the HTTP client).

Writes into --out: results.json (every request), summary.json, table.md, ttft.png, commands.txt, and the
servers' logs. The targets are reported, not enforced.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from bench.ladder import Workload
from bench.paired import INSTRUCTION, pair_of, stream_once, ttft_rounds
from bench.report import save_run
from bench.servers import BENCH_API_KEY, REPO_ROOT, vllm_server
from loadtests.openai_load.prompts import Calibration, PromptFactory, calibrate
from loadtests.openai_load.samples import describe
from loadtests.openai_load.server import Endpoints, ServerProbe, SetupClient
from serve_app.telemetry import hops
from serve_app.config import AppConfig
from devstack import serve_config as cpu_config
from devstack.cluster import DEFAULT_NODES, NodeSpec
from devstack.ports import BENCH
from devstack.stack import LocalStack
from devstack.tiny_model import ensure_tiny_model

TARGET_RATIO = {"gpu": 1.10, "cpu": 1.5}  # issue 9: aggregated TTFT p50 vs direct vLLM
TARGET_UNACCOUNTED_MS = 5.0  # the per-hop record accounts for the client's TTFT within 5 ms
PHASES = ("vllm-vs-aggregated", "disaggregated-vs-aggregated")


def log(msg: str) -> None:
    print(f"[bench.ttft {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None, device: Optional[str] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ttft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["gpu", "cpu"], default=device or "gpu")
    p.add_argument("--model", type=Path, help="a Hugging Face model folder (GPU; default: --shape, dummy weights)")
    p.add_argument("--model-id", default=None, help="the name clients send (default: m8b on GPU, tiny on CPU)")
    p.add_argument("--shape", default="llama3-8b", help="dimensions of the dummy GPU model (bench/gpu/model.py)")
    p.add_argument("--model-config", type=Path, help="GPU: a folder with config.json and tokenizer files, served "
                   "with dummy weights (default: --shape's dimensions and the tiny test tokenizer, built here)")
    p.add_argument("--lengths", default=None, help="prompt tokens, comma-separated (default GPU 1024,4096,8192; "
                   "CPU 256,1024,1900: the tiny model's context is 2048)")
    p.add_argument("--phases", default=None, help=f"comma-separated of {', '.join(PHASES)} (default: both on "
                   "CPU, the first on GPU)")
    p.add_argument("--pairs", type=int, default=None, help="paired requests per length (default GPU 10, CPU 30)")
    p.add_argument("--warm", type=int, default=3, help="unpaired warm-up requests per server and length")
    p.add_argument("--output-tokens", type=int, default=None, help="default GPU 64, CPU 16")
    p.add_argument("--eager", action="store_true", help="GPU: enforce_eager (no torch.compile, no CUDA graphs)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.45,
                   help="GPU: at most this share per engine (they share GPU 0: 0.9 / number of engines)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=JSON",
                   help="extra vLLM engine argument for every engine, e.g. max_num_seqs=32; repeatable")
    p.add_argument("--app-arg", action="append", default=[], metavar="PATH=JSON",
                   help="AppConfig override for every app, e.g. streaming.batch_interval_ms=0; repeatable")
    p.add_argument("--serve-mode", choices=["high-throughput", "standard"], default="high-throughput",
                   help="the app's Ray Serve mode (devstack/cluster.py): HAProxy + throughput-optimized "
                        "(the default, as the chart deploys it) or Serve's Python proxy")
    p.add_argument("--cluster-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment of every Ray process of the app's cluster, e.g. Ray Serve's "
                        "RAY_SERVE_THROUGHPUT_OPTIMIZED=1; repeatable")
    p.add_argument("--stack-variant", action="append", default=[], metavar="NAME=KEY=VALUE[;KEY=VALUE]",
                   help="in the vllm-vs-aggregated phase, run the app once more on a new cluster with this "
                        "environment added to --cluster-env, against the same direct vLLM server; repeatable")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=PATH=JSON[;PATH=JSON]",
                   help="in the vllm-vs-aggregated phase, one more aggregated app with these AppConfig overrides "
                        "(same engine arguments), measured in the same rounds: an A/B of a setting in one run, "
                        "e.g. ray-batcher=streaming.first_chunk_immediately=false; repeatable")
    p.add_argument("--out", type=Path, default=None, help="default: bench/out/ttft-<device>-<timestamp>")
    a = p.parse_args(argv)
    cpu = a.device == "cpu"
    a.model_id = a.model_id or ("tiny" if cpu else "m8b")
    a.lengths = [int(x) for x in (a.lengths or ("256,1024,1900" if cpu else "1024,4096,8192")).split(",") if x]
    a.phases = [x for x in (a.phases or (",".join(PHASES) if cpu else PHASES[0])).split(",") if x]
    if bad := [x for x in a.phases if x not in PHASES]:
        p.error(f"--phases: unknown {bad}; known: {', '.join(PHASES)}")
    a.pairs = a.pairs or (30 if cpu else 10)
    a.output_tokens = a.output_tokens or (16 if cpu else 64)
    a.engine_arg = dict(_kv(item, p) for item in a.engine_arg)
    a.app_arg = dict(_kv(item, p) for item in a.app_arg)
    a.cluster_env = {k: str(v) for k, v in (item.split("=", 1) for item in a.cluster_env if "=" in item)}
    stack_variants = {}
    for item in a.stack_variant:
        name, sep, rest = item.partition("=")
        pairs = [x.split("=", 1) for x in rest.split(";") if x]
        if not sep or not name.replace("-", "").isalnum() or not pairs or any(len(kv) != 2 for kv in pairs):
            p.error(f"--stack-variant {item!r}: expected NAME=KEY=VALUE[;KEY=VALUE]")
        stack_variants[name] = dict(pairs)
    a.stack_variant = stack_variants
    variants = {}
    for item in a.variant:
        name, sep, rest = item.partition("=")
        if not sep or not name.replace("-", "").isalnum() or name in ("vllm", "aggregated", "disaggregated"):
            p.error(f"--variant {item!r}: expected NAME=PATH=JSON[;PATH=JSON] with a plain NAME")
        variants[name] = dict(_kv(x, p) for x in rest.split(";") if x)
    a.variant = variants
    if cpu and a.model:
        p.error("--model: the CPU run serves the tiny test model")
    if cpu and max(a.lengths) + a.output_tokens + 64 > cpu_config.MAX_MODEL_LEN:
        p.error(f"--lengths: the tiny model's context is {cpu_config.MAX_MODEL_LEN} tokens")
    return a


def _kv(item: str, p: argparse.ArgumentParser) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        p.error(f"{item!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


# ----------------------------------------------------------------------------------------------
# What runs where: one profile per device kind


@dataclasses.dataclass
class Profile:
    device: str  # e.g. "1xH200", "2xCPU"
    compiled: bool
    model_path: Path
    engine_args: dict[str, Any]
    engine_env: dict[str, str]
    vllm_env: dict[str, str]  # direct vLLM's own extra environment (its device)
    app_args: Callable[..., dict[str, Any]]  # LocalStack's hook
    nodes: tuple[NodeSpec, ...]
    gpus: int


def _override(args: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for path, value in overrides.items():
        node = args
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return AppConfig.model_validate(args).model_dump(mode="json")


def cpu_app_args(model_path: str, *, overrides: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return _override(cpu_config.local_app_args(model_path, **kwargs), overrides)


def gpu_app_args(model_path: str, *, mode: str, role_label_key: str, side_channel_ports: dict[str, int],
                 model_id: str, engine: dict[str, Any], env: dict[str, str], overrides: dict[str, Any]) -> dict[str, Any]:
    """AppConfig args of the bench's GPU app (LocalStack's `app_args` hook)."""
    role = {"replicas": 1, "engine_args": dict(engine)}
    args: dict[str, Any] = {
        "mode": mode, "model": {"id": model_id, "source": model_path}, "accelerator": "gpu",
        "decode": {**role, "side_channel_port": side_channel_ports["decode"]},
        "placement": {"role_label_key": role_label_key, "pin_roles": True},
        "frontend": {"replicas": 1, "num_cpus": 0}, "engine_env": dict(env),
    }
    if mode == "disaggregated":
        args["prefill"] = {**role, "side_channel_port": side_channel_ports["prefill"]}
        args["kv_transfer"] = {"connector": "NixlConnector", "backend": "UCX", "buffer_device": "cuda"}
    return _override(args, overrides)


def cpu_profile(a: argparse.Namespace) -> Profile:
    import os

    engine = {**cpu_config.CPU_ENGINE_ARGS, **a.engine_arg}
    env = dict(cpu_config.CPU_LOOPBACK_ENV)
    return Profile(
        device=f"{os.cpu_count()}xCPU", compiled=False, model_path=ensure_tiny_model(), engine_args=engine,
        # Direct vLLM on the prefill core: phase 1 runs no prefill engine, so each engine has a core to itself
        # (two engines bound to one core slow each other down, unevenly).
        engine_env=env, vllm_env={**env, "VLLM_CPU_OMP_THREADS_BIND": cpu_config.CORE_OF_ROLE["prefill"]},
        app_args=functools.partial(cpu_app_args, overrides=a.app_arg), nodes=DEFAULT_NODES, gpus=0)


def gpu_profile(a: argparse.Namespace, out: Path) -> Profile:
    import torch

    from bench.gpu.model import dummy_model

    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit("bench.ttft --device gpu: no CUDA GPU visible (torch.cuda.device_count() == 0)")
    name = torch.cuda.get_device_name(0).replace("NVIDIA ", "")
    longest = max(a.lengths) + a.output_tokens + 256  # room for the instruction and template
    # Direct vLLM and every app engine share GPU 0: split 90 % of its memory between them.
    share = min(a.gpu_memory_utilization, round(0.9 / (2 + len(a.variant)), 3))
    engine: dict[str, Any] = {"max_model_len": longest, "max_num_batched_tokens": longest, "max_num_seqs": 64,
                              "gpu_memory_utilization": share, "dtype": "bfloat16"}
    if a.model is None:
        engine["load_format"] = "dummy"
    if a.eager:
        engine["enforce_eager"] = True
    engine.update(a.engine_arg)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
    if importlib.util.find_spec("flashinfer") is None:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"  # vLLM's top-k/p sampler check imports it otherwise
    model = a.model or a.model_config or dummy_model(a.shape, out / "model", longest + 1024, ensure_tiny_model())
    nodes = (NodeSpec("head", num_cpus=4), NodeSpec("prefill", num_cpus=8, role="prefill", gpus=(1,) if count > 1 else ()),
             NodeSpec("decode", num_cpus=8, role="decode", gpus=(0,)))
    return Profile(
        device=f"{count}x{name}", compiled=not a.eager, model_path=Path(model), engine_args=engine, engine_env=env,
        vllm_env={**env, "CUDA_VISIBLE_DEVICES": "0"},
        app_args=functools.partial(gpu_app_args, model_id=a.model_id, engine=engine, env=env, overrides=a.app_arg),
        nodes=nodes, gpus=count)


# ----------------------------------------------------------------------------------------------
# Measuring


def join_traces(requests: list[tuple[str, Optional[float]]], traces: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per app request: the client's TTFT beside the app's per-hop trace."""
    rows = []
    for request_id, client_ms in requests:
        trace = traces.get(request_id)
        if client_ms is None or trace is None:
            continue
        seg = trace["segments_ms"]
        rows.append({"request_id": request_id, "client_ttft_ms": client_ms, "path": trace["path"],
                     "prompt_tokens": trace.get("prompt_tokens"), "segments_ms": seg,
                     "engine_ms": seg.get("engine"), "overhead_ms": client_ms - seg.get("engine", 0.0),
                     "unaccounted_ms": client_ms - seg.get("ingress_total", 0.0)})
    return rows


def median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def traced_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    hop_names = [h for h in hops.SEGMENTS if any(h in r["segments_ms"] for r in rows)]
    return {
        "traced": len(rows),
        "engine_p50_ms": median([r["engine_ms"] for r in rows if r["engine_ms"] is not None]),
        "overhead_p50_ms": median([r["overhead_ms"] for r in rows]),
        "unaccounted_p50_ms": median([r["unaccounted_ms"] for r in rows]),
        "hops_p50_ms": {h: median([r["segments_ms"][h] for r in rows if h in r["segments_ms"]]) for h in hop_names},
    }


def run_phase(name: str, baseline: str, urls: dict[str, str], stack: LocalStack, a: argparse.Namespace,
              cal: Calibration, results: dict[str, Any], summary: dict[str, Any], out: Path) -> None:
    """Rounds over every server at each length; each app compared with `baseline`, its requests traced."""
    factory = PromptFactory(cal, "completions", INSTRUCTION)
    apps = [m for m in urls if m != "vllm"]
    compared = [m for m in urls if m != baseline]
    summary["phases"][name] = {}
    results["phases"][name] = {}
    for n in a.lengths:
        for i in range(a.warm):
            body = {"model": a.model_id, **factory.make(n, random.Random(10_000 + n + i)),
                    "max_tokens": a.output_tokens, "ignore_eos": True, "stream": True}
            for url in urls.values():
                stream_once(url, body, timeout_s=300)
        w = Workload("completions", n, a.output_tokens, 0)
        rounds = ttft_rounds(urls, cal, a.model_id, w, a.pairs, time_limit_s=900, seed=n, tag=f"{name}-L{n}")
        # The app's record of each request came back in its stream; the frontend's log lines fill any gap.
        traces = {rid: r.server_trace for results in rounds.values() for rid, r in results if r.server_trace}
        if any(rid not in traces for m in apps for rid, _ in rounds[m]):
            time.sleep(1.5)
            traces = {**hops.read_traces(stack.log_dir), **traces}
        pairs = {m: pair_of(rounds, baseline, m) for m in compared}
        client_ms = {m: [(rid, r.ttft_s * 1000 if r.problem() is None and r.ttft_s is not None else None)
                         for rid, r in rounds[m]] for m in urls}
        traced = {m: join_traces(client_ms[m], traces) for m in apps}
        s = {
            "servers": {m: {"ttft_p50_ms": describe([t for _, t in client_ms[m] if t is not None]).get("p50"),
                            "ttft_p95_ms": describe([t for _, t in client_ms[m] if t is not None]).get("p95"),
                            "errors": sum(t is None for _, t in client_ms[m])} for m in urls},
            "vs_" + baseline: {m: {"ratio_p50": pr.ttft_p50_ratio, "median_diff_ms": pr.ttft_diff_ms.get("p50")}
                               for m, pr in pairs.items()},
            "rounds": min(len(v) for v in rounds.values()),
            "app": {m: traced_stats(rows) for m, rows in traced.items()},
        }
        summary["phases"][name][str(n)] = s
        results["phases"][name][str(n)] = {"pairs": {m: dataclasses.asdict(pr) for m, pr in pairs.items()},
                                           "traced": traced}
        for pr in pairs.values():
            log(f"{name} {n} tokens: {pr.line()}")
        for m, st in s["app"].items():
            log(f"  {m}: engine p50 {_fmt(st['engine_p50_ms'])}, overhead p50 {_fmt(st['overhead_p50_ms'])}, "
                f"unaccounted p50 {_fmt(st['unaccounted_p50_ms'])} ({st['traced']} traced)")
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))


def _fmt(v: Optional[float], unit: str = " ms") -> str:
    return "n/a" if v is None else f"{v:.1f}{unit}"


def table(summary: dict[str, Any]) -> str:
    out: list[str] = []
    for phase, by_len in summary["phases"].items():
        first = next(iter(by_len.values()))
        baseline = next(k for k in first if k.startswith("vs_"))[len("vs_"):]
        servers, apps = list(first["servers"]), list(first["app"])
        compared = [m for m in servers if m != baseline]
        out += [f"### {phase.replace('-vs-', ' vs ')} ({summary['device']}, "
                f"{'compiled' if summary['compiled'] else 'eager'}, concurrency 1, {first['rounds']} rounds)", "",
                "| prompt tokens | " + " | ".join(f"{m} TTFT p50" for m in servers) + " | "
                + " | ".join(f"{m} / {baseline}" for m in compared) + " |",
                "| ---: " * (1 + len(servers) + len(compared)) + "|"]
        for n, s in by_len.items():
            cells = [n] + [_fmt(s["servers"][m]["ttft_p50_ms"]) for m in servers]
            cells += [f"{s['vs_' + baseline][m]['ratio_p50']:.3f}x ({s['vs_' + baseline][m]['median_diff_ms']:+.1f} ms)"
                      for m in compared]
            out.append("| " + " | ".join(map(str, cells)) + " |")
        out += ["", "| prompt tokens | app | engine p50 | overhead p50 (TTFT - engine) | unaccounted p50 (TTFT - "
                "frontend first byte) | traced |", "| ---: | --- | ---: | ---: | ---: | ---: |"]
        for n, s in by_len.items():
            for m in apps:
                v = s["app"][m]
                out.append(f"| {n} | {m} | {_fmt(v['engine_p50_ms'])} | {_fmt(v['overhead_p50_ms'])} | "
                           f"{_fmt(v['unaccounted_p50_ms'])} | {v['traced']} |")
        for m in apps:
            hop_names = [h for h in hops.SEGMENTS if any(h in s["app"][m]["hops_p50_ms"] for s in by_len.values())]
            out += ["", f"Per-hop p50 of `{m}` (ms, serve_app/telemetry/hops.py):", "",
                    "| hop | " + " | ".join(by_len) + " |", "| --- |" + " ---: |" * len(by_len)]
            for h in hop_names:
                cells = [s["app"][m]["hops_p50_ms"].get(h) for s in by_len.values()]
                out.append(f"| {h} | " + " | ".join("" if c is None else f"{c:.2f}" for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(summary["phases"].items())
    fig, axes = plt.subplots(len(phases), 2, figsize=(12, 4 * len(phases)), squeeze=False)
    for row, (phase, by_len) in enumerate(phases):
        lengths = list(by_len)
        servers = list(next(iter(by_len.values()))["servers"])
        x = list(range(len(lengths)))
        ax1, ax2 = axes[row]
        width = 0.8 / len(servers)
        for k, m in enumerate(servers):
            ax1.bar([i - 0.4 + width * (k + 0.5) for i in x],
                    [by_len[n]["servers"][m]["ttft_p50_ms"] or 0 for n in lengths], width, label=m)
        ax1.set_xticks(x, lengths)
        ax1.set_xlabel("prompt tokens")
        ax1.set_ylabel("TTFT p50 (ms)")
        ax1.set_title(f"{phase}: {summary['device']}, {'compiled' if summary['compiled'] else 'eager'}, conc 1")
        ax1.legend(fontsize=7)
        mode = "disaggregated" if "disaggregated" in servers else "aggregated"
        bottom = [0.0] * len(lengths)
        for h in hops.PATH_SEGMENTS["remote" if mode == "disaggregated" else "local"]:
            vals = [by_len[n]["app"][mode]["hops_p50_ms"].get(h) or 0.0 for n in lengths]
            ax2.bar(x, vals, 0.5, bottom=bottom, label=h)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax2.scatter(x, [by_len[n]["servers"][mode]["ttft_p50_ms"] or 0 for n in lengths], color="black", zorder=3,
                    label="client TTFT p50")
        ax2.set_xticks(x, lengths)
        ax2.set_xlabel("prompt tokens")
        ax2.set_title(f"{mode}: per-hop p50 (stacked) vs the client's TTFT")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------


def run_stack(label: str, phase: str, cluster_env: dict[str, str], vllm: Any, prof: Profile,
              a: argparse.Namespace, cal: Optional[Calibration], results: dict[str, Any], summary: dict[str, Any],
              out: Path) -> Calibration:
    """Start one app stack for `phase`, measure it (against `vllm` when given), stop it; the calibration."""
    if phase == "vllm-vs-aggregated":
        apps = {"aggregated": ("/", "aggregated"), **{v: (f"/{v}", "aggregated") for v in a.variant}}
        overrides = {app: {**a.app_arg, **a.variant.get(app, {})} for app in apps}
        if prof.gpus:  # every app engine and direct vLLM share GPU 0
            for app in apps:
                overrides[app]["decode.gpu_fraction"] = round(1 / len(apps), 4)
    else:
        apps = {"disaggregated": ("/", "disaggregated"), "aggregated": ("/agg", "aggregated")}
        overrides = {app: dict(a.app_arg) for app in apps}
    stack = LocalStack(apps=apps, ports=BENCH, model_path=prof.model_path, nodes=prof.nodes,
                       app_args=prof.app_args, overrides=overrides, cluster_env=cluster_env, serve_mode=a.serve_mode,
                       object_store_bytes=int((2 if prof.gpus else 0.25) * 1024**3), deploy_timeout_s=1500,
                       api_keys=(BENCH_API_KEY,))
    try:
        t = time.monotonic()
        stack.start()
        summary["startup_s"][label] = time.monotonic() - t
        summary.setdefault("cluster_envs", {})[label] = cluster_env
        (out / f"serve_config-{label}.json").write_text(json.dumps(stack.serve_config, indent=1))
        log(f"{label}: app(s) ready in {summary['startup_s'][label]:.0f} s (cluster env {cluster_env or 'none'})")
        if cal is None:
            probe_url = vllm.base_url if vllm else stack.base_url("aggregated")
            cal = calibrate(ServerProbe(SetupClient(Endpoints.from_host(probe_url.removesuffix("/v1"))),
                                        a.model_id, "completions"), "completions", INSTRUCTION)
            log(f"prompt calibration: {cal.describe()}")
        urls = {app: stack.base_url(app) for app in apps}
        if vllm is not None:
            urls = {"vllm": vllm.base_url, **urls}
        run_phase(label, "vllm" if vllm is not None else "aggregated", urls, stack, a, cal, results, summary, out)
        return cal
    finally:
        stack.stop(keep_logs=True)
        serve_logs = stack.log_dir / "serve"
        if serve_logs.exists():
            (out / f"serve-logs-{label}.txt").write_text("".join(
                f"### {f.name}\n" + "".join(f.read_text(errors="replace").splitlines(True)[-300:])
                for f in sorted(serve_logs.glob("*.log"))))


def main(argv: list[str] | None = None, device: Optional[str] = None) -> int:
    a = parse_args(argv, device)
    started = time.monotonic()
    out = a.out or REPO_ROOT / "bench" / "out" / time.strftime(f"ttft-{a.device}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    argv_text = " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    (out / "commands.txt").write_text(f"python -m bench.ttft --device {a.device} {argv_text}\n")
    prof = cpu_profile(a) if a.device == "cpu" else gpu_profile(a, out)
    if "disaggregated-vs-aggregated" in a.phases and a.device == "gpu":
        # One stack serving both modes needs a GPU per engine (3); the equal-GPU-budget comparison on
        # 2 GPUs runs each mode on its own (python -m bench.gpu.pd).
        raise SystemExit("bench.ttft: the disaggregated-vs-aggregated phase runs on CPU only; on GPUs use "
                         "python -m bench.gpu.pd")
    log(f"{prof.device}; model {prof.model_path}; engine {prof.engine_args}; phases {a.phases}")
    results: dict[str, Any] = {"device": prof.device, "engine_args": prof.engine_args, "engine_env": prof.engine_env,
                               "phases": {}}
    summary: dict[str, Any] = {"device": prof.device, "compiled": prof.compiled, "model": str(a.model or a.shape),
                               "serve_mode": a.serve_mode, "cluster_env": a.cluster_env, "app_args": a.app_arg,
                               "pairs": a.pairs, "output_tokens": a.output_tokens, "startup_s": {}, "phases": {}}
    cal: Optional[Calibration] = None
    vllm = None
    try:
        for phase in a.phases:
            stacks = [(phase, a.cluster_env)]
            if phase == "vllm-vs-aggregated":
                stacks += [(f"{phase}@{name}", {**a.cluster_env, **env}) for name, env in a.stack_variant.items()]
                if vllm is None:
                    vllm = vllm_server(BENCH.aux(0), str(prof.model_path), out / "server-vllm.log",
                                       served_name=a.model_id, engine_args=prof.engine_args, env=prof.vllm_env)
                    vllm.start()
                    summary["startup_s"]["vllm"] = vllm.wait_ready(1500)
                    log(f"direct vLLM ready in {summary['startup_s']['vllm']:.0f} s")
            for label, cluster_env in stacks:
                cal = run_stack(label, phase, cluster_env, vllm if phase == "vllm-vs-aggregated" else None,
                                prof, a, cal, results, summary, out)
            if phase == "vllm-vs-aggregated" and vllm is not None:
                vllm.stop()
                vllm = None
    finally:
        if vllm is not None:
            vllm.stop()

    first = summary["phases"].get("vllm-vs-aggregated", {})
    summary["ttft_p50_ms"] = {m: {n: s["servers"][m]["ttft_p50_ms"] for n, s in first.items()}
                              for m in ("vllm", "aggregated", *a.variant)}
    summary["overhead_p50_ms"] = {m: {n: s["app"][m]["overhead_p50_ms"] for n, s in first.items()}
                                  for m in ("aggregated", *a.variant)}
    summary["unaccounted_p50_ms"] = {m: {n: s["app"][m]["unaccounted_p50_ms"] for n, s in first.items()}
                                     for m in ("aggregated", *a.variant)}
    summary["targets"] = {"ratio_max": TARGET_RATIO[a.device], "unaccounted_max_ms": TARGET_UNACCOUNTED_MS,
                          "ratio_p50": {n: s["vs_vllm"]["aggregated"]["ratio_p50"] for n, s in first.items()}}
    second = summary["phases"].get("disaggregated-vs-aggregated")
    if second:
        summary["disaggregated_minus_aggregated_p50_ms"] = {
            n: s["vs_aggregated"]["disaggregated"]["median_diff_ms"] for n, s in second.items()}
    return save_run(out, summary, table(summary), plot, "ttft.png", started)


if __name__ == "__main__":
    sys.exit(main())
