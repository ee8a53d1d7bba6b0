"""SLO thresholds and their verdict, which becomes Locust's process exit code."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

EXIT_PASS = 0
EXIT_SLO_FAILED = 3  # distinct from Locust's 1 (errors) and 2 (unhandled exception)


@dataclass(frozen=True)
class Thresholds:
    """Limits; None disables a check. Latencies in ms, error rate as a fraction (0.01 = 1%)."""

    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    error_rate: float | None = None
    min_requests: int = 1

    def __post_init__(self) -> None:
        if self.error_rate is not None and not 0 <= self.error_rate <= 1:
            raise ValueError(f"--slo-error-rate must be a fraction in [0, 1], got {self.error_rate}")
        for name in ("ttft_p95_ms", "itl_p95_ms", "e2e_p95_ms"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"--slo-{name.replace('_', '-')} must be > 0, got {v}")

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.ttft_p95_ms, self.itl_p95_ms, self.e2e_p95_ms, self.error_rate))


@dataclass(frozen=True)
class Observed:
    requests: int
    error_rate: float
    ttft_p95_ms: float
    itl_p95_ms: float
    e2e_p95_ms: float


@dataclass(frozen=True)
class Check:
    name: str
    limit: float
    value: float
    passed: bool

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        return f"  [{mark}] {self.name:<16} observed {self.value:>10.4g}  limit {self.limit:>10.4g}"


def evaluate(th: Thresholds, obs: Observed) -> list[Check]:
    """One check per enabled threshold, plus a minimum-sample check. NaN (no samples) fails."""
    checks = [Check("requests >=", th.min_requests, obs.requests, obs.requests >= th.min_requests)]

    def upper(name: str, limit: float | None, value: float) -> None:
        if limit is not None:
            checks.append(Check(name, limit, value, not math.isnan(value) and value <= limit))

    upper("ttft_p95_ms <=", th.ttft_p95_ms, obs.ttft_p95_ms)
    upper("itl_p95_ms <=", th.itl_p95_ms, obs.itl_p95_ms)
    upper("e2e_p95_ms <=", th.e2e_p95_ms, obs.e2e_p95_ms)
    upper("error_rate <=", th.error_rate, obs.error_rate)
    return checks


def exit_code(checks: list[Check]) -> int:
    return EXIT_PASS if all(c.passed for c in checks) else EXIT_SLO_FAILED


def report(checks: list[Check]) -> str:
    verdict = "PASSED" if all(c.passed for c in checks) else "FAILED"
    return "\n".join([f"SLO {verdict}:"] + [c.line() for c in checks])


def as_dicts(checks: list[Check]) -> list[dict[str, object]]:
    return [asdict(c) for c in checks]
