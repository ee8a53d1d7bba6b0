"""Which setting costs the app its TTFT? Paired TTFT at 1 user, vLLM vs the app under variants.

    python -m bench.ablate                                  # the variants below
    python -m bench.ablate --variant batch0=RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS=0 --pairs 40

vLLM's own server is started once and stays up; for each variant the app (aggregated mode) is
started with that variant's extra environment (inherited by every Ray process, so it reaches Ray
Serve's and Ray Serve LLM's module constants), warmed up, compared with vLLM request by request
(bench.paired: identical prompts, alternating, one at a time) and stopped. Prints one row per
variant and writes <out>/ablation.json. Loopback only; bounded by --pairs and a time limit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.cpu import APP_PORT, READY_TIMEOUT_S, VLLM_PORT, log, preflight
from bench.ladder import Workload, warm_up
from bench.paired import paired_ttft
from bench.servers import REPO_ROOT, ServerStartError, app_server, tiny_model_path, vllm_server
from loadtests.openai_load.prompts import Calibration

DEFAULT_VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    # Ray Serve LLM streams through a Batcher that first yields after one interval (default 50 ms)
    "batch0": {"RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS": "0"},
    # ... plus Ray Serve's thread hops: user code and the router on the replica's main loop
    "batch0+same-loop": {"RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS": "0",
                         "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
                         "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"},
}


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, sep, rest = text.partition("=")
    env: dict[str, str] = {}
    for item in filter(None, rest.split(",")) if sep else []:
        k, s2, v = item.partition("=")
        if not s2:
            raise argparse.ArgumentTypeError(f"variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...]")
        env[k] = v
    return name, env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ablate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", type=_variant, action="append", default=[],
                    help="NAME=KEY=VALUE[,KEY=VALUE...] (repeatable; default: the built-in set)")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    variants = dict(a.variant) if a.variant else DEFAULT_VARIANTS
    out = a.out or REPO_ROOT / "bench" / "out" / time.strftime("ablate-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    preflight()
    w = Workload("chat", a.input_tokens, a.output_tokens, 60)
    rows: list[dict[str, object]] = []
    vllm = vllm_server(VLLM_PORT, tiny_model_path(), out / "server-vllm.log")
    vllm.start()
    try:
        vllm.wait_ready(READY_TIMEOUT_S["vllm"])
        warm_up("vllm", vllm.base_url, w, out)
        for name, env in variants.items():
            app = app_server("aggregated", APP_PORT, out / f"server-{name}.log", env)
            log(f"variant {name}: {env or '(no extra env)'}")
            app.start()
            try:
                app.wait_ready(READY_TIMEOUT_S["aggregated"])
                warm_up("aggregated", app.base_url, w, out / name)
                cal = Calibration.from_json(
                    json.loads((out / name / "aggregated.calibration.json").read_text())["calibration"])
                r = paired_ttft({"vllm": vllm.base_url, "aggregated": app.base_url}, cal, "tiny", w, a.pairs)
                log(f"variant {name}: {r.line()}")
                rows.append({"variant": name, "env": env, **asdict(r), "ttft_p50_ratio": r.ttft_p50_ratio})
            except (ServerStartError, RuntimeError) as e:
                log(f"variant {name}: FAILED: {e}")
                rows.append({"variant": name, "env": env, "error": str(e).splitlines()[0]})
            finally:
                app.stop()
            (out / "ablation.json").write_text(json.dumps(rows, indent=2))
    finally:
        vllm.stop()
    print(f"\n| variant | app TTFT p50 ms | vLLM TTFT p50 ms | ratio | median extra ms | app ITL p50 ms | vLLM ITL p50 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | failed: {r['error']} |||||")
            continue
        t, i, d = r["ttft_ms"], r["itl_ms"], r["ttft_diff_ms"]  # type: ignore[index]
        print(f"| {r['variant']} | {t['aggregated']['p50']:.1f} | {t['vllm']['p50']:.1f} | "  # type: ignore[index]
              f"{r['ttft_p50_ratio']:.2f}x | {d['p50']:.1f} | {i['aggregated']['p50']:.2f} | {i['vllm']['p50']:.2f} |")  # type: ignore[index]
    print(f"\nfiles in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
