"""Exact per-request samples kept in the load generator, next to Locust's own statistics.

Locust rounds response times into buckets (whole ms below 100 ms, 10 ms below 1 s, 100 ms above)
before computing percentiles; inter-token latencies of a few ms need better. Each process keeps
the raw values here and writes exact percentiles to the `--summary-json` file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# Custom Locust request_type names. Latencies are ms; TOKENS_PER_S is tokens/s stored in the
# response-time field (Locust shows it in its "ms" columns; the unit is documented).
TTFT = "TTFT"
ITL = "ITL"
E2E = "E2E"
TOKENS_PER_S = "TOKENS_PER_S"
CUSTOM_TYPES: tuple[str, ...] = (TTFT, ITL, E2E, TOKENS_PER_S)
UNITS = {TTFT: "ms", ITL: "ms", E2E: "ms", TOKENS_PER_S: "tokens/s"}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def describe(values: list[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "mean": sum(values) / len(values) if values else math.nan,
        "min": min(values) if values else math.nan,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
    }


@dataclass
class SampleStore:
    """Raw values of one load-generator process."""

    values: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in CUSTOM_TYPES})
    ok: int = 0
    failed: int = 0
    output_tokens: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    tokens_per_chunk: list[float] = field(default_factory=list)
    first_start: float | None = None
    last_end: float | None = None

    def add(self, metric: str, value: float) -> None:
        self.values.setdefault(metric, []).append(value)

    def request_done(self, ok: bool, start_wall: float, end_wall: float, output_tokens: int = 0,
                     prompt_tokens: int | None = None, text_chunks: int = 0) -> None:
        if ok:
            self.ok += 1
            self.output_tokens += output_tokens
            if prompt_tokens is not None:
                self.prompt_tokens.append(prompt_tokens)
            if text_chunks:
                self.tokens_per_chunk.append(output_tokens / text_chunks)
        else:
            self.failed += 1
        self.first_start = start_wall if self.first_start is None else min(self.first_start, start_wall)
        self.last_end = end_wall if self.last_end is None else max(self.last_end, end_wall)

    @property
    def requests(self) -> int:
        return self.ok + self.failed

    @property
    def error_rate(self) -> float:
        return self.failed / self.requests if self.requests else math.nan

    @property
    def duration_s(self) -> float:
        if self.first_start is None or self.last_end is None:
            return 0.0
        return max(self.last_end - self.first_start, 1e-9)

    def summary(self) -> dict[str, Any]:
        d = self.duration_s
        return {
            "requests": self.requests,
            "ok": self.ok,
            "failed": self.failed,
            "error_rate": self.error_rate,
            "duration_s": d,
            "requests_per_s": self.ok / d if d else math.nan,
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens / d if d else math.nan,
            "prompt_tokens": describe([float(p) for p in self.prompt_tokens]),
            # > 1 means the server (or a proxy) sent several tokens per stream chunk
            "tokens_per_chunk": describe(self.tokens_per_chunk),
            "metrics": {m: {"unit": UNITS.get(m, ""), **describe(v)} for m, v in self.values.items()},
        }
