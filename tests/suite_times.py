"""Per-suite wall time, outcomes and slowest tests, printed at the end of every pytest run (and written as TSV
to $RLD_SUITE_TIMES_FILE when set; `.ci/run` prints that file as its closing table).

A suite is a folder under tests/. Its wall time runs from its first test's start to its last test's end, so
it includes its stack's start (setup of the first test) and stop (teardown of the last): what the suite costs
a CI run. Each test's time is setup + call + teardown. "idle CPU %" is what each local stack the suite started
used while idle (percent of one core, measured by devstack's LocalStack.running() right after its start).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TOP_LEVEL = "(tests/*.py)"
SLOWEST = 3  # tests named per suite in the table
TOP_IDLE = 4  # processes named per idle stack


def suite_of(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else TOP_LEVEL


@dataclass
class Suite:
    start: float = 0.0
    end: float = 0.0
    outcomes: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)  # nodeid -> setup + call + teardown
    idle_cpu: list[float] = field(default_factory=list)  # total % of a core of each stack it started, idle
    idle_top: list[str] = field(default_factory=list)  # per stack: its apps, window and biggest consumers

    @property
    def wall(self) -> float:
        return max(0.0, self.end - self.start)

    def slowest(self, n: int) -> list[tuple[str, float]]:
        return [(nodeid.split("::", 1)[-1], s) for nodeid, s in self.seconds.most_common(n)]


class SuiteClock:
    """A pytest plugin (registered by tests/conftest.py)."""

    def __init__(self) -> None:
        self.suites: dict[str, Suite] = {}
        self.session_start = time.monotonic()
        self._idle_seen = 0

    def _suite(self, nodeid: str) -> Suite:
        return self.suites.setdefault(suite_of(nodeid), Suite(start=time.monotonic()))

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._suite(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        suite = self._suite(nodeid)
        suite.end = time.monotonic()
        stacks = sys.modules.get("devstack.stack")  # LocalStack.running() measures each stack idle once
        measured = getattr(stacks, "IDLE_CPU", [])
        for apps, window, usage in measured[self._idle_seen:]:
            suite.idle_cpu.append(sum(usage.values()))
            top = ", ".join(f"{title} {pct:.1f}" for title, pct in sorted(usage.items(), key=lambda kv: -kv[1])[:TOP_IDLE])
            suite.idle_top.append(f"apps {apps} over {window:.0f} s: {top}")
        self._idle_seen = len(measured)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        suite = self._suite(report.nodeid)
        suite.seconds[report.nodeid] += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = report.outcome
            if report.when == "setup" and report.failed:
                outcome = "error"
            elif hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
            suite.outcomes[outcome] += 1
        elif report.when == "teardown" and report.failed:
            suite.outcomes["error"] += 1

    def rows(self) -> list[tuple[str, ...]]:
        rows = []
        for name, s in self.suites.items():
            counts = ", ".join(f"{n} {o}" for o, n in sorted(s.outcomes.items()))
            slow = "; ".join(f"{t} {sec:.0f}s" for t, sec in s.slowest(SLOWEST))
            idle = " ".join(f"{pct:.0f}" for pct in s.idle_cpu) or "-"
            rows.append((name, f"{s.wall:.0f}", idle, counts, slow))
        return rows

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.suites:
            return
        total = time.monotonic() - self.session_start
        rows = self.rows()
        terminalreporter.section("suite times")
        width = max(len(r[0]) for r in rows)
        terminalreporter.write_line(
            f"{'suite':<{width}}  {'wall s':>6}  {'idle CPU %':>10}  outcomes  |  slowest tests (setup+call+teardown)"
        )
        for name, wall, idle, counts, slow in rows:
            terminalreporter.write_line(f"{name:<{width}}  {wall:>6}  {idle:>10}  {counts}  |  {slow}")
        terminalreporter.write_line(f"{'all':<{width}}  {total:>6.0f}")
        idle = [(name, line) for name, suite in self.suites.items() for line in suite.idle_top]
        if idle:
            terminalreporter.section("idle CPU of each stack (% of a core, biggest processes)")
            for name, line in idle:
                terminalreporter.write_line(f"{name:<{width}}  {line}")
        out = os.environ.get("RLD_SUITE_TIMES_FILE")
        if out:
            lines = ["suite\twall_s\tidle_cpu_pct\toutcomes\tslowest"] + ["\t".join(r) for r in rows]
            lines.append(f"all\t{total:.0f}\t\t\t")
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text("\n".join(lines) + "\n")
