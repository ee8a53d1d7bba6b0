"""Markdown table + PNG from bench/gpu_bench.py results (run here, with the project venv: matplotlib).

  $(hack/pyenv.sh python) bench/gpu_report.py bench/results/h200x2-<date>
"""
from __future__ import annotations

import json, sys
from pathlib import Path

d = Path(sys.argv[1])
rows = []
for f in sorted(d.glob("results_*.json")):
    tag = "+fcn" if "_fcn" in f.name else ""
    for r in json.loads(f.read_text()):
        r["mode"] = r["mode"] + tag
        rows.append(r)


def f1(x):
    return "—" if x is None else f"{x:.1f}"


lines = ["| mode | input | conc | n | err | TTFT p50 | TTFT p95 | TPOT p50 | TPOT p95 | chunk gap p50 | chunk gap p95 | out tok/s | req/s |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
for r in rows:
    if "failed" in r:
        lines.append(f"| {r['mode']} | FAILED: {r['failed'][:200]} |"); continue
    lines.append(f"| {r['mode']} | {r['input']} | {r['conc']} | {r['n']} | {r['errors']} | {f1(r['ttft_p50_ms'])} | "
                 f"{f1(r['ttft_p95_ms'])} | {f1(r.get('tpot_p50_ms'))} | {f1(r.get('tpot_p95_ms'))} | {f1(r['itl_p50_ms'])} | "
                 f"{f1(r['itl_p95_ms'])} | {r['out_tok_s']:.0f} | {r['req_s']:.2f} |")
bd = ["", "Breakdown, disaggregated app, conc 1 (before/after diff of each run, warm-ups included, n=10). Ray 2.58 exports these",
      "histograms with sums built from bucket values, so means are bucket-quantized (coarse above 50 ms); ms:", "",
      "| input | series (node, role/path) | mean ms | count |", "| ---: | --- | ---: | ---: |"]
for r in rows:
    for k, v in sorted((r.get("breakdown") or {}).items()):
        if "tokens" in k or "queue" in k or "request_seconds" in k or "descriptors" in k or "bytes" in k or "prefill_time" in k or r["mode"] != "disagg":
            continue
        bd.append(f"| {r['input']} | `{k}` | {v['mean_ms']:.1f} | {v['count']:.0f} |")
(d / "table.md").write_text("\n".join(lines + bd) + "\n")
print("\n".join(lines + bd))

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
modes = sorted({r["mode"] for r in rows if "failed" not in r})
for m in modes:
    c1 = sorted((r for r in rows if r.get("mode") == m and r.get("conc") == 1 and "failed" not in r), key=lambda r: r["input"])
    if c1:
        axes[0].plot([r["input"] for r in c1], [r["ttft_p50_ms"] for r in c1], "o-", label=m)
    lad = sorted((r for r in rows if r.get("mode") == m and r.get("input") == 4096 and "failed" not in r), key=lambda r: r["conc"])
    if len(lad) > 1:
        axes[1].plot([r["conc"] for r in lad], [r["ttft_p50_ms"] for r in lad], "o-", label=m)
axes[0].set(xlabel="input tokens", ylabel="TTFT p50 (ms)", title="TTFT at concurrency 1 (64 out tokens)")
axes[1].set(xlabel="concurrency", ylabel="TTFT p50 (ms)", title="TTFT vs concurrency, 4k input", xscale="log")
for a in axes:
    a.grid(alpha=.3); a.legend()
fig.suptitle("2xH200, Llama-3-8B-shaped dummy model, vLLM 0.26 eager, Ray 2.58")
fig.tight_layout(); fig.savefig(d / "ttft.png", dpi=110)
