"""Helpers of the load-test suite (a module name of its own: tests/ has no packages per suite)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO / "loadtests" / "locustfile.py"


@dataclass(frozen=True)
class Server:
    base_url: str  # http://127.0.0.1:PORT/v1
    kind: str  # "app-aggregated", "vllm" or "external"
    model: str = "tiny"
    api_key: Optional[str] = None  # our app runs with auth on, as the demo does


@dataclass
class LocustRun:
    returncode: int
    output: str
    prefix: Path

    @property
    def stats(self) -> dict[tuple[str, str], dict[str, str]]:
        """Rows of <prefix>_stats.csv by (Type, Name)."""
        with open(f"{self.prefix}_stats.csv", newline="") as f:
            return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}

    @property
    def summary(self) -> dict:
        return json.loads(Path(f"{self.prefix}.summary.json").read_text())

    @property
    def html(self) -> str:
        return Path(f"{self.prefix}.html").read_text()


def run_locust(host: str, out_dir: Path, *args: str, users: int = 1, run_time_s: int = 8,
               max_requests: int = 12, timeout_s: Optional[float] = None, api_key: Optional[str] = None) -> LocustRun:
    """Headless Locust with the project's locustfile; bounded by run time and request count."""
    if api_key:
        args = ("--api-key", api_key, *args)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = out_dir / "run"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
           "-H", host, "-u", str(users), "-r", str(users), "-t", f"{run_time_s}s", "--stop-timeout", "20",
           "--max-requests", str(max_requests), "--csv", str(prefix), "--html", f"{prefix}.html",
           "--summary-json", f"{prefix}.summary.json", *args]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                       timeout=timeout_s or run_time_s + 120)
    return LocustRun(p.returncode, p.stdout + p.stderr, prefix)
