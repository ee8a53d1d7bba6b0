"""Render the dashboard's key series from a real scrape series of the local stack into a PNG.

    flock /tmp/rld-stack.lock $(hack/pyenv.sh python) tests/monitoring/dashboard_png.py \
        [--out charts/ray-llm-disagg/docs/dashboard.png] [--save scrapes.json] [--load scrapes.json]

Starts the stack (disaggregated, tiny CPU model), sends streamed traffic in phases (1 client, then 3, then
idle), provokes a failed NIXL transfer and an expired KV lease, and scrapes every Ray node every 2 s. The
panels compute what the dashboard's PromQL computes, over the same series: sums of rate() over a 10 s
window, and histogram_quantile() with Prometheus' linear interpolation inside a bucket.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO)]

from monitoring_live import Sample, Scrape, Traffic, log, provoke_nixl_failures, scrape_all, new_stack  # noqa: E402

WINDOW_S = 10.0
TTFT_SLO_S = 2.5  # the chart's default monitoring.slo.ttft.thresholdSeconds


def matches(s: Sample, name: str, labels: dict[str, str]) -> bool:
    return s.name == name and all(s.label(k) == v for k, v in labels.items())


def total(scrape: Scrape, name: str, **labels: str) -> float:
    return sum(s.value for s in scrape.samples if matches(s, name, labels))


def by(scrape: Scrape, name: str, label: str, **labels: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in scrape.samples:
        if matches(s, name, labels):
            out[s.label(label)] = out.get(s.label(label), 0.0) + s.value
    return out


def windows(scrapes: list[Scrape]):
    """(t, earlier scrape, later scrape) pairs at least WINDOW_S apart."""
    for i, late in enumerate(scrapes):
        early = next((e for e in reversed(scrapes[:i]) if late.t - e.t >= WINDOW_S), None)
        if early is not None:
            yield late.t, early, late


def rate(scrapes: list[Scrape], name: str, **labels: str) -> tuple[list[float], list[float]]:
    ts, ys = [], []
    for t, early, late in windows(scrapes):
        ts.append(t)
        ys.append(max(0.0, total(late, name, **labels) - total(early, name, **labels)) / (late.t - early.t))
    return ts, ys


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile over cumulative bucket counts (le -> count)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if math.isinf(b):
                return prev_bound
            return prev_bound + (b - prev_bound) * (rank - prev_count) / max(buckets[b] - prev_count, 1e-12)
        prev_bound, prev_count = b, buckets[b]
    return math.nan


def histogram_quantile(scrapes: list[Scrape], q: float, name: str, **labels: str) -> tuple[list[float], list[float]]:
    ts, ys = [], []
    for t, early, late in windows(scrapes):
        late_b, early_b = by(late, f"{name}_bucket", "le", **labels), by(early, f"{name}_bucket", "le", **labels)
        delta = {float(le): late_b[le] - early_b.get(le, 0.0) for le in late_b}
        ts.append(t)
        ys.append(quantile(q, delta))
    return ts, ys


def gauge(scrapes: list[Scrape], name: str, **labels: str) -> tuple[list[float], list[float]]:
    """Sum of a gauge; NaN where Ray dropped it (an idle engine), as Grafana shows a gap."""
    ts, ys = [], []
    for s in scrapes:
        present = [x.value for x in s.samples if matches(x, name, labels)]
        ts.append(s.t)
        ys.append(sum(present) if present else math.nan)
    return ts, ys


def collect() -> list[Scrape]:
    with new_stack().running(deploy_timeout_s=900) as stack:
        scrapes: list[Scrape] = []
        t0 = time.monotonic()

        def scrape_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                scrapes.append(Scrape(time.monotonic() - t0, scrape_all(stack)))
                time.sleep(2)

        scrape_for(6)
        for clients, seconds in ((1, 30), (3, 40)):
            traffic = Traffic(stack, clients=clients).start()
            log(f"{clients} client(s) for {seconds} s")
            try:
                scrape_for(seconds)
            finally:
                traffic.stop()
            assert not traffic.errors, traffic.errors[:3]
        log("idle; provoking a failed NIXL transfer and an expired KV lease")
        provoke_nixl_failures(stack)
        scrape_for(45)
        return scrapes


def render(scrapes: list[Scrape], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), constrained_layout=True)
    (a1, a2, a3), (a4, a5, a6) = axes
    decode = {"role": "decode"}

    for path in ("remote", "local"):
        a1.plot(*rate(scrapes, "ray_rld_requests_total", path=path, **decode), label=path)
    a1.set(title="Requests by path (decode), req/s", xlabel="s")

    for q in (0.5, 0.95):
        a2.plot(*histogram_quantile(scrapes, q, "ray_rld_time_to_first_token_seconds", **decode), label=f"p{int(q * 100)}")
    a2.axhline(TTFT_SLO_S, color="red", linestyle="--", label=f"SLO {TTFT_SLO_S} s")
    a2.set(title="Time to first token (client, by decode), s", xlabel="s")

    for q in (0.5, 0.99):
        a3.plot(*histogram_quantile(scrapes, q, "ray_vllm_inter_token_latency_seconds"), label=f"p{int(q * 100)}")
    a3.set(title="Inter-token latency (decode engines), s", xlabel="s")

    a4.plot(*histogram_quantile(scrapes, 0.99, "ray_vllm_nixl_xfer_time_seconds"), label="p99 transfer time (s)")
    a4.set(title="KV transfer (NIXL over UCX on loopback)", xlabel="s")
    right = a4.twinx()
    ts, ys = rate(scrapes, "ray_vllm_nixl_bytes_transferred_sum")
    right.plot(ts, [y / 2**20 for y in ys], color="tab:green", label="MiB/s moved")
    right.set_ylabel("MiB/s")
    for name, label, color in (("ray_vllm_nixl_num_failed_transfers_total", "failed transfer", "red"),
                               ("ray_vllm_nixl_num_kv_expired_reqs_total", "expired KV", "purple")):
        first = next((s.t for s in scrapes if total(s, name) > 0), None)
        if first is not None:
            a4.axvline(first, color=color, linestyle=":", label=f"{label} (first export)")
    a4.legend(loc="upper left", fontsize=8)
    right.legend(loc="upper right", fontsize=8)

    for source in ("external_kv_transfer", "local_compute"):
        a5.plot(*rate(scrapes, "ray_vllm_prompt_tokens_by_source_total", source=source, ray_io_group="decode"), label=source)
    a5.set(title="Decode prompt tokens by source, tokens/s", xlabel="s")

    for group in ("prefill", "decode"):
        a6.plot(*gauge(scrapes, "ray_vllm_num_requests_running", ray_io_group=group), label=f"running ({group})")
        a6.plot(*gauge(scrapes, "ray_vllm_num_requests_waiting", ray_io_group=group), linestyle="--", label=f"waiting ({group})")
    a6.set(title="Requests per role (gaps: idle engine, gauge dropped)", xlabel="s")

    for ax in (a1, a2, a3, a5, a6):
        ax.legend(fontsize=8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.suptitle("ray-llm-disagg dashboard, key series from a real scrape of the local stack "
                 "(tiny CPU model; 1 client, then 3, then idle + provoked NIXL failures)", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    log(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "charts/ray-llm-disagg/docs/dashboard.png")
    ap.add_argument("--save", type=Path, help="also write the scrape series as JSON")
    ap.add_argument("--load", type=Path, help="render from a saved scrape series instead of starting the stack")
    args = ap.parse_args()
    if args.load:
        raw = json.loads(args.load.read_text())
        scrapes = [Scrape(s["t"], [Sample(n, tuple(map(tuple, lbl)), v) for n, lbl, v in s["samples"]]) for s in raw]
    else:
        scrapes = collect()
    if args.save:
        keep = ("ray_rld_", "ray_vllm_")
        args.save.write_text(json.dumps([{"t": s.t, "samples": [(x.name, x.labels, x.value) for x in s.samples
                                                                  if x.name.startswith(keep)]} for s in scrapes]))
    render(scrapes, args.out)


if __name__ == "__main__":
    main()
