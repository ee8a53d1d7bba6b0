"""The bench's table (each figure with its ratio to direct vLLM) and its plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

from bench.ladder import LevelResult

# (key, header, format); "lower is better" for latencies, higher for throughput.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
    ("ttft_p95_ms", "TTFT p95 ms", "{:.1f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.2f}"),
    ("itl_p95_ms", "ITL p95 ms", "{:.2f}"),
    ("e2e_p50_ms", "E2E p50 ms", "{:.0f}"),
    ("requests_per_s", "req/s", "{:.2f}"),
    ("output_tokens_per_s", "out tok/s", "{:.0f}"),
    ("error_rate", "errors", "{:.1%}"),
)
BASELINE = "vllm"


def ratio(value: float, base: float) -> float:
    if base == 0 or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


def _cell(key: str, fmt: str, value: float, base: float | None) -> str:
    text = "n/a" if math.isnan(value) else fmt.format(value)
    if base is None or key == "error_rate":
        return text
    r = ratio(value, base)
    return f"{text} ({'n/a' if math.isnan(r) else f'{r:.2f}x'})"


def table(results: Sequence[LevelResult]) -> str:
    """Markdown table: one row per (mode, concurrency); ratios to vLLM at the same concurrency."""
    base = {r.concurrency: r.row() for r in results if r.mode == BASELINE}
    head = "| mode | users | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for r in results:
        row = r.row()
        b = base.get(r.concurrency) if r.mode != BASELINE else None
        cells = [_cell(k, f, row[k], b[k] if b else None) for k, _, f in COLUMNS]
        lines.append(f"| {r.mode} | {r.concurrency} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ttft_ratio_at(results: Sequence[LevelResult], mode: str, concurrency: int) -> float:
    by = {(r.mode, r.concurrency): r.row() for r in results}
    if (mode, concurrency) not in by or (BASELINE, concurrency) not in by:
        return math.nan
    return ratio(by[(mode, concurrency)]["ttft_p50_ms"], by[(BASELINE, concurrency)]["ttft_p50_ms"])


def plot(results: Sequence[LevelResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("ttft_p50_ms", "ttft_p95_ms", "TTFT (ms), p50 solid / p95 dashed"),
        ("itl_p50_ms", "itl_p95_ms", "ITL (ms), p50 solid / p95 dashed"),
        ("e2e_p50_ms", None, "E2E latency p50 (ms)"),
        ("output_tokens_per_s", None, "output tokens/s (all users)"),
    )
    modes = list(dict.fromkeys(r.mode for r in results))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, key95, label) in zip(axes.flat, panels):
        for i, mode in enumerate(modes):
            rs = sorted((r for r in results if r.mode == mode), key=lambda r: r.concurrency)
            xs = [r.concurrency for r in rs]
            color = f"C{i}"
            ax.plot(xs, [r.row()[key] for r in rs], "o-", color=color, label=mode)
            if key95:
                ax.plot(xs, [r.row()[key95] for r in rs], "s--", color=color, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r.concurrency for r in results}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrent users")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
        if key95:  # latencies span orders of magnitude across modes: log scale
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
    axes.flat[0].legend()
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load(out: Path) -> list[LevelResult]:
    """LevelResults from a bench output folder's <mode>_c<N>.summary.json files."""
    import json
    import re

    from bench.servers import MODES

    found = []
    for f in out.glob("*_c*.summary.json"):
        m = re.fullmatch(r"(\w+)_c(\d+)\.summary\.json", f.name)
        if m and m.group(1) in MODES:
            stem = f.with_name(f"{m.group(1)}_c{m.group(2)}")
            found.append(LevelResult(m.group(1), int(m.group(2)), json.loads(f.read_text()),
                                     stem.with_suffix(".html"), stem, 0, (0.0, 0.0, 0.0)))
    return sorted(found, key=lambda r: (MODES.index(r.mode), r.concurrency))


if __name__ == "__main__":  # re-render a run: python -m bench.report bench/out/<timestamp> [title]
    import sys

    folder = Path(sys.argv[1])
    rs = load(folder)
    print(table(rs))
    plot(rs, folder / "latency.png", sys.argv[2] if len(sys.argv) > 2 else folder.name)
    print(f"wrote {folder / 'latency.png'}")


def save_run(out: Path, summary: dict, table_md: str, plot: Callable[[dict, Path], None], plot_name: str,
             started: float) -> int:
    """Write a finished run's summary.json, table.md and plot into `out`, print the table; exit status 0."""
    import json
    import time

    summary["wall_s"] = time.monotonic() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text(table_md + "\n")
    plot(summary, out / plot_name)
    print(table_md)
    print(f"files in {out}; {summary['wall_s']:.0f} s")
    return 0
