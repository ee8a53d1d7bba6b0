"""Drive one server over a concurrency ladder with the project's locustfile (headless, bounded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.servers import BENCH_API_KEY, REPO_ROOT

LOCUSTFILE = REPO_ROOT / "loadtests" / "locustfile.py"


@dataclass(frozen=True)
class Workload:
    api: str = "chat"
    input_tokens: int = 256
    output_tokens: int = 128
    duration_s: int = 30
    max_requests: int = 5000  # a hard cap on top of the time bound
    stop_timeout_s: int = 30  # let in-flight requests finish at the end of a level

    def locust_args(self) -> list[str]:
        return ["--workload", "chat", "--api", self.api, "--input-tokens", str(self.input_tokens),
                "--output-tokens", str(self.output_tokens), "--max-requests", str(self.max_requests),
                "--stop-timeout", str(self.stop_timeout_s), "-t", f"{self.duration_s}s"]


@dataclass(frozen=True)
class LevelResult:
    mode: str
    concurrency: int
    summary: dict[str, Any]
    html: Path
    csv_prefix: Path
    exit_code: int
    loadavg_before: tuple[float, float, float]

    def metric(self, kind: str, stat: str) -> float:
        return float(self.summary["metrics"][kind][stat])

    def row(self) -> dict[str, float]:
        s = self.summary
        return {
            "ttft_p50_ms": self.metric("TTFT", "p50"),
            "ttft_p95_ms": self.metric("TTFT", "p95"),
            "itl_p50_ms": self.metric("ITL", "p50"),
            "itl_p95_ms": self.metric("ITL", "p95"),
            "e2e_p50_ms": self.metric("E2E", "p50"),
            "requests_per_s": float(s["requests_per_s"]),
            "output_tokens_per_s": float(s["output_tokens_per_s"]),
            "error_rate": float(s["error_rate"]),
            "requests": float(s["requests"]),
            "tokens_per_chunk": float(s["tokens_per_chunk"]["mean"]),
        }


def run_level(mode: str, base_url: str, concurrency: int, w: Workload, out_dir: Path,
              seed: int = 0, calibration: Path | None = None) -> LevelResult:
    """One headless Locust run with `concurrency` closed-loop users; raises if Locust fails.

    The prompt calibration is kept in `calibration` (default <out_dir>/<mode>.calibration.json):
    the warm-up makes it, the measured levels reuse it, so no level spends its time on it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{mode}_c{concurrency}"
    summary_path = stem.with_suffix(".summary.json")
    html = stem.with_suffix(".html")
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-H", base_url, "-u", str(concurrency), "-r", str(concurrency), "--seed", str(seed),
           "--csv", str(stem), "--html", str(html), "--summary-json", str(summary_path),
           "--calibration-file", str(calibration or out_dir / f"{mode}.calibration.json"),
           "--loglevel", "WARNING", "--api-key", BENCH_API_KEY, *w.locust_args()]
    load = os.getloadavg()
    timeout = w.duration_s + w.stop_timeout_s + 120
    with open(stem.with_suffix(".locust.log"), "wb") as log:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if not summary_path.exists():
        raise RuntimeError(f"locust for {mode} c={concurrency} wrote no summary (exit {proc.returncode}); "
                           f"see {stem.with_suffix('.locust.log')}")
    summary = json.loads(summary_path.read_text())
    if not summary.get("requests"):
        raise RuntimeError(f"locust for {mode} c={concurrency} completed no request; "
                           f"see {stem.with_suffix('.locust.log')}")
    return LevelResult(mode, concurrency, summary, html, stem, proc.returncode, load)


def warm_up(mode: str, base_url: str, w: Workload, out_dir: Path) -> None:
    """A few requests of the same workload, not measured (first-request costs, caches)."""
    wu = Workload(api=w.api, input_tokens=w.input_tokens, output_tokens=w.output_tokens,
                  duration_s=60, max_requests=4, stop_timeout_s=10)
    run_level(mode, base_url, 1, wu, out_dir / "warmup", calibration=out_dir / f"{mode}.calibration.json")
