"""Device-side GPU benchmark (run by bench/gpu_run.sh on the lent 2xH200): direct vLLM vs the app, aggregated
and disaggregated, 8B-shaped dummy model. Streams /v1/completions with a small async client (aiohttp) and writes
per-request records + summaries to $OUT/results_<modes>.json, and the app's Prometheus text to $OUT.

  python3 bench/gpu_bench.py --modes vllm,agg  |  --modes disagg  [--ladder 4,16,32]
"""
from __future__ import annotations

import argparse, asyncio, json, os, random, statistics, subprocess, sys, time, urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
MODEL = os.environ.get("RLD_MODEL8B", "/tmp/model8b")
MID = "m8b"
ENGINE = {"max_model_len": 8192, "max_num_batched_tokens": 8192, "max_num_seqs": 32,
          "gpu_memory_utilization": 0.5, "enforce_eager": True, "load_format": "dummy", "dtype": "bfloat16"}
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


# ---------------- prompts ----------------
_tok = None


def prompt_of(n_tokens: int, rng: random.Random) -> str:
    """Random words of the tiny tokenizer's corpus, cut to exactly n tokens (re-encoding may differ by a few)."""
    global _tok
    from tokenizers import Tokenizer
    from serve_app.local.tiny_model import WORDS
    if _tok is None:
        _tok = Tokenizer.from_file(f"{MODEL}/tokenizer.json")
    words = " ".join(rng.choice(WORDS) for _ in range(n_tokens + 64))
    ids = _tok.encode(words, add_special_tokens=False).ids[: n_tokens - 1]
    return _tok.decode(ids)


# ---------------- client ----------------
async def one(session, url, prompt, max_tokens):
    import aiohttp
    body = {"model": MID, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter(); times = []; usage = None; err = None
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=300)) as r:
            if r.status != 200:
                return {"error": f"HTTP {r.status}: {(await r.text())[:300]}"}
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    usage = ev["usage"]
                if ev.get("choices") and ev["choices"][0].get("text"):
                    times.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001
        err = repr(e)[:300]
    if err or not times:
        return {"error": err or "no tokens"}
    end = time.perf_counter()
    gaps = [b - a for a, b in zip(times, times[1:])]
    out_tokens = (usage or {}).get("completion_tokens", len(times))
    return {"ttft": times[0] - t0, "e2e": end - t0, "chunks": len(times), "itl": gaps,
            "tpot": (times[-1] - times[0]) / max(out_tokens - 1, 1), "out_tokens": out_tokens,
            "prompt_tokens": (usage or {}).get("prompt_tokens")}


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    f = int(k); c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def ms(xs, q):
    return 1e3 * pct(xs, q) if xs else None


async def run_load(url, n_tokens, conc, n_req, max_tokens, warm, seed):
    import aiohttp
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as s:
        for _ in range(warm):
            await one(s, url, prompt_of(n_tokens, rng), max_tokens)
        prompts = [prompt_of(n_tokens, rng) for _ in range(n_req)]
        q = list(prompts); res = []

        async def worker():
            while q:
                p = q.pop()
                res.append(await one(s, url, p, max_tokens))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    ok = [r for r in res if "error" not in r]
    itl = [g for r in ok for g in r["itl"]]
    summ = {"input": n_tokens, "conc": conc, "n": len(res), "errors": len(res) - len(ok), "wall_s": wall,
            "ttft_p50_ms": ms([r["ttft"] for r in ok], .5), "ttft_p95_ms": ms([r["ttft"] for r in ok], .95),
            "ttft_mean_ms": 1e3 * statistics.mean([r["ttft"] for r in ok]) if ok else None,
            "itl_p50_ms": 1e3 * pct(itl, .5) if itl else None, "itl_p95_ms": 1e3 * pct(itl, .95) if itl else None,
            "tpot_p50_ms": 1e3 * pct([r["tpot"] for r in ok], .5) if ok else None,
            "tpot_p95_ms": 1e3 * pct([r["tpot"] for r in ok], .95) if ok else None,
            "out_tok_s": sum(r["out_tokens"] for r in ok) / wall, "req_s": len(ok) / wall,
            "prompt_tokens": ok[0]["prompt_tokens"] if ok else None,
            "first_error": next((r["error"] for r in res if "error" in r), None)}
    return summ, res


# ---------------- servers ----------------
def wait_http(url, timeout_s, proc=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001
            pass
        time.sleep(1)
    raise TimeoutError(url)


def start_vllm(gpu="0", port=8300):
    env = {**os.environ, **ENV, "CUDA_VISIBLE_DEVICES": gpu}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name", MID,
           "--port", str(port)]
    for k, v in ENGINE.items():
        flag = "--" + k.replace("_", "-")
        cmd += [flag] if v is True else [flag, str(v)]
    logf = open(OUT / "vllm_direct.log", "w")
    p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/health", 400, p)
    return p, f"http://127.0.0.1:{port}/v1/completions"


def gpu_cluster(mode):
    from serve_app.config import DEFAULT_ROLE_LABEL_KEY
    from serve_app.local.cluster import LocalRayCluster, NodeSpec

    nodes = [NodeSpec("head", num_cpus=4)]
    gpu_of = {"decode": "0"} if mode == "aggregated" else {"prefill": "0", "decode": "1"}
    nodes += [NodeSpec(r, num_cpus=8, role=r) for r in gpu_of]

    class GpuCluster(LocalRayCluster):
        def _start_command(self, index, node):
            return super()._start_command(index, node) + [f"--num-gpus={1 if node.role else 0}"]

        def _start_nodes(self, timeout_s):
            for index, node in enumerate(self.nodes):
                env = self.env()
                env["CUDA_VISIBLE_DEVICES"] = gpu_of.get(node.role or "", "")
                r = subprocess.run(self._start_command(index, node), env=env, capture_output=True, text=True,
                                   timeout=timeout_s)
                if r.returncode:
                    raise RuntimeError(f"ray start {node.name}: {r.stderr[-2000:]}")
                log(f"ray node {node.name} up (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r})")

    return GpuCluster(role_label_key=DEFAULT_ROLE_LABEL_KEY, nodes=tuple(nodes), object_store_bytes=2 * 1024**3)


def app_args(mode):
    from serve_app.config import AppConfig
    role = {"replicas": 1, "engine_args": dict(ENGINE)}
    args = {"mode": mode, "model": {"id": MID, "source": MODEL}, "accelerator": "gpu", "decode": role,
            "frontend": {"replicas": 1, "num_cpus": 0}, "engine_env": dict(ENV)}
    if mode == "disaggregated":
        args.update(prefill=role, kv_transfer={"connector": "NixlConnector", "backend": "UCX", "buffer_device": "cuda"},
                    remote_prefill_min_tokens=0)
    return AppConfig.model_validate(args).model_dump(mode="json")


def start_app(mode):
    import yaml  # noqa: F401
    import ray
    from ray.serve._private import api as serve_api
    from ray.serve.schema import ServeDeploySchema
    from ray import serve
    from serve_app.local.serve_config import serve_deploy_config

    cl = gpu_cluster(mode)
    cl.start()
    cfg = serve_deploy_config({"app": {"route_prefix": "/", "args": app_args(mode)}}, http_port=8000)
    (OUT / f"serve_config_{mode}.json").write_text(json.dumps(cfg, indent=1))
    ray.init(address=cl.address, logging_level="WARNING", log_to_driver=False)
    schema = ServeDeploySchema.model_validate(cfg)
    client = serve_api.serve_start(http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location)
    client.deploy_apps(schema)
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        st = serve.status().applications.get("app")
        s = st.status.value if st else "NOT_STARTED"
        if s == "RUNNING":
            break
        if s in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(st.message)
        time.sleep(2)
    else:
        raise TimeoutError("app not RUNNING")
    ray.shutdown()
    return cl, "http://127.0.0.1:8000/v1/completions"


def scrape(cl):
    text = {}
    for n in cl.nodes:
        try:
            with urllib.request.urlopen(cl.metrics_url(n.name), timeout=10) as r:
                text[n.name] = r.read().decode()
        except Exception as e:  # noqa: BLE001
            text[n.name] = f"# scrape error {e!r}\n"
    return text


def hist_sums(text_by_node, names=("ray_rld_", "ray_vllm_nixl", "ray_vllm_time_to_first_token", "ray_vllm_request_prefill",
                                   "ray_vllm_request_queue", "ray_vllm_inter_token")):
    """{metric{role/path labels}: (sum, count)} for *_sum/*_count series of interest, summed over other labels."""
    import re
    out = {}
    for node, text in text_by_node.items():
        for line in text.splitlines():
            if line.startswith("#") or not any(line.startswith(p) for p in names):
                continue
            m = re.match(r"^(\w+?)_(sum|count)(\{[^}]*\})?\s+([0-9.eE+-]+)", line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
            key = f"{m.group(1)}|node={node}|" + ",".join(f"{k}={labels[k]}" for k in ("role", "path") if k in labels)
            s, c = out.get(key, (0.0, 0.0))
            out[key] = (s + float(m.group(4)), c) if m.group(2) == "sum" else (s, c + float(m.group(4)))
    return out


def diff_means(before, after):
    res = {}
    for k, (s, c) in after.items():
        s0, c0 = before.get(k, (0.0, 0.0))
        if c - c0 > 0:
            res[k] = {"mean_ms": 1e3 * (s - s0) / (c - c0), "count": c - c0}
    return res


# ---------------- main ----------------
def bench(mode, url, args, results, cl=None):
    for n in args.lengths:
        before = hist_sums(scrape(cl)) if cl else None
        summ, recs = asyncio.run(run_load(url, n, 1, args.n, args.max_tokens, args.warm, seed=n))
        summ["mode"] = mode
        if cl:
            time.sleep(5)  # Ray exports every 2 s here (RAY_metrics_report_interval_ms)
            summ["breakdown"] = diff_means(before, hist_sums(scrape(cl)))
        results.append(summ)
        log(f"{mode} in={n} c=1: ttft p50 {summ['ttft_p50_ms'] or 0:.1f} ms, tpot p50 {summ['tpot_p50_ms'] or 0:.1f} ms, "
            f"err {summ['errors']} {summ['first_error'] or ''}")
        save(results, args)
    for c in args.ladder:
        summ, _ = asyncio.run(run_load(url, args.ladder_len, c, max(2 * c, 8), args.max_tokens, 0, seed=1000 + c))
        summ["mode"] = mode
        results.append(summ)
        log(f"{mode} in={args.ladder_len} c={c}: ttft p50 {summ['ttft_p50_ms'] or 0:.1f} p95 {summ['ttft_p95_ms'] or 0:.1f} ms, "
            f"{summ['out_tok_s']:.0f} tok/s, err {summ['errors']}")
        save(results, args)


def save(results, args):
    (OUT / f"results_{args.modes.replace(',', '-')}{'_fcn' if args.first_chunk_now else ''}.json").write_text(json.dumps(results, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="vllm,agg")
    ap.add_argument("--lengths", default="1024,4096,7936")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ladder", default="")
    ap.add_argument("--ladder-len", type=int, default=4096)
    ap.add_argument("--first-chunk-now", action="store_true",
                    help="put bench/experiments/first_chunk_now on every Ray process's PYTHONPATH")
    args = ap.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    args.ladder = [int(x) for x in args.ladder.split(",") if x]
    OUT.mkdir(parents=True, exist_ok=True)
    if args.first_chunk_now:
        os.environ["PYTHONPATH"] = f"{REPO}/bench/experiments/first_chunk_now:" + os.environ.get("PYTHONPATH", "")
    results = []
    for mode in args.modes.split(","):
        log(f"=== {mode}")
        try:
            if mode == "vllm":
                p, url = start_vllm()
                log("vllm up")
                try:
                    bench("vllm", url, args, results)
                finally:
                    p.terminate(); p.wait(30)
            else:
                full = {"agg": "aggregated", "disagg": "disaggregated"}[mode]
                cl = None
                try:
                    cl, url = start_app(full)
                    log(f"app {full} RUNNING")
                    bench(mode, url, args, results, cl)
                    (OUT / f"metrics_{mode}.txt").write_text("".join(f"### node {k}\n{v}" for k, v in scrape(cl).items()))
                finally:
                    if cl is not None:
                        logs = cl.temp_dir / "session_latest" / "logs"
                        subprocess.run(f"tail -n 60 {logs}/serve/*.log {logs}/worker-*.err 2>/dev/null | tail -c 400000 "
                                       f"> {OUT}/ray_logs_{mode}.txt", shell=True)
                        cl.stop()
        except Exception as e:  # noqa: BLE001
            log(f"{mode} FAILED: {e!r}")
            results.append({"mode": mode, "failed": repr(e)[:2000]})
            save(results, args)
    log("done")


if __name__ == "__main__":
    main()
