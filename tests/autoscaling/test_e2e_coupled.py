"""Coupled autoscaling on the real local stack: each role scales in the phase that pressures it, not in the other,
both come back to their minimum once the load stops, and no request fails on the way (scale-in included).

Phases (closed-loop clients against the OpenAI endpoint):
  prefill-heavy  long prompts (~1500 tokens, remote prefill), 1 output token: the prefill queue grows
  decode-heavy   short prompts (prefilled on decode: selective disaggregation), 300 output tokens: decode runs many
  trickle        one client, alternating both kinds, while both roles scale back in
What the policy decided is read from its RLD_AUTOSCALE lines in the Serve controller's log; what Serve did, from
serve.status() (RUNNING replicas per role).

Then the chart's dashboard row and alert on the policy's gauges are checked against a scrape of this stack (the
shared stack of tests/monitoring runs perDeployment and never exports them).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import pytest

from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack
from serve_app.autoscaling.ray_policy import LOG_PREFIX
from tests.chart.monitoring_queries import parse_promql, recorded_names, shipped_queries
from tests.monitoring.monitoring_live import Scrape, scrape_all, scrape_node
from tests.monitoring.test_metric_names import COUPLED_ONLY, PROMETHEUS_MADE, Exported, check

from .conftest import API_KEY, APP, DOWNSCALE_DELAY_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3000)]

DEPLOYMENT = {"prefill": f"Prefill:{MODEL_ID}", "decode": f"Decode:{MODEL_ID}"}
WORDS = "the quick brown fox jumps over lazy dog model token cache request server hello world".split()
REPLICA_START_S = 600  # a CPU engine replica on a busy 2-core machine
CLIENTS = 12


def long_prompt(words: int = 1500) -> str:
    rng = random.Random(uuid.uuid4().int)  # fresh: no prefix-cache hit
    return " ".join(rng.choice(WORDS) for _ in range(words))


def prefill_heavy() -> dict:
    return {"model": MODEL_ID, "prompt": long_prompt(), "max_tokens": 1, "temperature": 0}


def decode_heavy() -> dict:
    return {"model": MODEL_ID, "prompt": "once upon a time", "max_tokens": 300, "ignore_eos": True, "temperature": 0}


@dataclass
class Load:
    """`clients` threads sending `body()` back to back until stopped; every outcome is kept."""

    stack: LocalStack
    body: Callable[[], dict]
    clients: int
    phase: str
    failures: list[str] = field(default_factory=list)
    done: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
        with httpx.Client(base_url=self.stack.base_url(APP), headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=300) as client:
            while not self._stop.is_set():
                try:
                    r = client.post("/completions", json=self.body())
                    ok = r.status_code == 200 and r.json().get("choices")
                    problem = None if ok else f"{r.status_code} {r.text[:300]}"
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.done += 1
                    if problem:
                        self.failures.append(f"{self.phase} at {time.strftime('%H:%M:%S')}: {problem}")

    def __enter__(self) -> "Load":
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=330)


def running(role: str) -> int:
    from ray import serve

    status = serve.status().applications.get(APP)
    if status is None or DEPLOYMENT[role] not in status.deployments:
        return 0
    states = status.deployments[DEPLOYMENT[role]].replica_states
    return sum(n for s, n in states.items() if str(getattr(s, "value", s)) == "RUNNING")


def decisions(stack: LocalStack) -> list[dict]:
    """The policy's logged decisions, oldest first (`t`: the controller's wall clock; `line`: the whole line)."""
    out = []
    for path in sorted((stack.log_dir / "serve").glob("controller_*.log")):
        for line in Path(path).read_text(errors="replace").splitlines():
            if LOG_PREFIX in line and " | " in line:
                out.append({**json.loads(line.rsplit(" | ", 1)[1]), "line": line})
    return sorted(out, key=lambda d: d["t"])


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, stack: LocalStack, load: Load | None = None) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if check():
            return time.monotonic() - t0
        time.sleep(2)
    last = [d["line"] for d in decisions(stack)][-5:]
    pytest.fail(f"{what}: not within {timeout_s:.0f} s (prefill running {running('prefill')}, decode running "
                f"{running('decode')}; requests done {load.done if load else '-'}). Last decisions:\n" + "\n".join(last))


def targets(records: list[dict], role: str) -> list[int]:
    return [r["roles"][role]["to"] for r in records]


def remote_prefills(stack: LocalStack) -> float:
    """Requests decode took with a remote prefill (its `ray_rld_requests_total{path="remote"}`)."""
    return sum(s.value for s in scrape_node(stack, "decode")
               if s.name == "ray_rld_requests_total" and s.label("path") == "remote")


def failovers(stack: LocalStack) -> list[str]:
    """Decode's `prefill failover` log lines (serve_app/engine/failover.py): requests whose prefill decode ran
    itself (or answered 503), with the reason."""
    return [line for path in sorted((stack.log_dir / "serve").glob("replica_*Decode*.log"))
            for line in Path(path).read_text(errors="replace").splitlines() if "prefill failover" in line]


def wait_remote_prefill(stack: LocalStack, timeout_s: float = 300) -> float:
    """Until decode's NIXL pre-warm (its first KV hand-off with prefill) is done, decode prefills every request
    itself (failover reason `kv_handshake_pending`): a prefill-heavy phase started before that loads decode's
    engine, not prefill's. One long prompt at a time until one is prefilled remotely."""
    t0 = time.monotonic()
    before = remote_prefills(stack)
    with httpx.Client(base_url=stack.base_url(APP), headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=300) as client:
        while time.monotonic() - t0 < timeout_s:
            r = client.post("/completions", json=prefill_heavy())
            assert r.status_code == 200, r.text[:300]
            for _ in range(8):  # Ray's agent exports every 2 s here (devstack.cluster.METRICS_REPORT_INTERVAL_MS)
                if remote_prefills(stack) > before:
                    return time.monotonic() - t0
                time.sleep(1)
    pytest.fail(f"no request was prefilled remotely within {timeout_s:.0f} s; decode's failovers:\n"
                + "\n".join(failovers(stack)[-10:]))


def test_each_role_scales_on_its_own_pressure_and_both_come_back(stack: LocalStack) -> None:
    assert (running("prefill"), running("decode")) == (1, 1)
    failures: list[str] = []
    timeline: list[str] = []
    timeline.append(f"remote prefill on after {wait_remote_prefill(stack):.0f} s")

    # 1. prefill-heavy: prefill goes to 2 replicas (and they run); decode is never asked to scale
    n0 = len(decisions(stack))
    with Load(stack, prefill_heavy, CLIENTS, "prefill-heavy") as load:
        took = wait_for("prefill scaled to 2 running replicas under prefill-heavy load",
                        lambda: running("prefill") == 2, REPLICA_START_S, stack, load)
        timeline.append(f"prefill-heavy: prefill 2 running after {took:.0f} s ({load.done} requests)")
    failures += load.failures
    phase_a = decisions(stack)[n0:]
    assert max(targets(phase_a, "prefill")) == 2
    assert set(targets(phase_a, "decode")) == {1}, "decode scaled under prefill-heavy load:\n" + "\n".join(
        d["line"] for d in phase_a if d["roles"]["decode"]["to"] != 1) + "\ndecode's prefill failovers so far:\n" + (
        "\n".join(failovers(stack)[-20:]) or "none")
    assert any("waiting_per_replica" in d["line"] and d["roles"]["prefill"]["to"] == 2 for d in phase_a)

    # 2. decode-heavy: decode goes to 2; prefill, idle now, is never raised (it comes back down instead)
    n1 = len(decisions(stack))
    with Load(stack, decode_heavy, CLIENTS, "decode-heavy") as load:
        took = wait_for("decode scaled to 2 running replicas under decode-heavy load",
                        lambda: running("decode") == 2, REPLICA_START_S, stack, load)
        timeline.append(f"decode-heavy: decode 2 running after {took:.0f} s ({load.done} requests)")
    failures += load.failures
    phase_b = decisions(stack)[n1:]
    assert max(targets(phase_b, "decode")) == 2
    assert all(r["roles"]["prefill"]["to"] <= r["roles"]["prefill"]["from"] for r in phase_b), \
        "prefill was raised under decode-heavy load"
    assert any("running_per_replica" in d["line"] and d["roles"]["decode"]["to"] == 2 for d in phase_b)

    # 3. the load stops (one client keeps going): both roles back to 1, not before downscale_delay_s, no failure
    stopped = time.time()
    trickle_bodies = [prefill_heavy, decode_heavy]
    with Load(stack, lambda: random.choice(trickle_bodies)(), 1, "scale-in") as load:
        took = wait_for("both roles back to 1 running replica after the load stopped",
                        lambda: (running("prefill"), running("decode")) == (1, 1), 300, stack, load)
        timeline.append(f"scale-in: both at 1 after {took:.0f} s ({load.done} trickle requests)")
        assert load.done > 0
    failures += load.failures
    after = [d for d in decisions(stack) if d["t"] >= stopped]
    assert (after[-1]["roles"]["prefill"]["to"], after[-1]["roles"]["decode"]["to"]) == (1, 1)
    decode_down = [d["t"] for d in after if d["roles"]["decode"]["to"] < d["roles"]["decode"]["from"]]
    assert decode_down and decode_down[0] - stopped >= DOWNSCALE_DELAY_S, "decode scaled in before downscale_delay_s"
    assert not failures, f"{len(failures)} failed requests:\n" + "\n".join(failures[:10])
    print("\n".join(timeline))


def test_the_dashboard_row_and_alert_select_what_the_coupled_app_exports(stack: LocalStack) -> None:
    """tests/monitoring's check, on the queries it defers here: every rule and panel query that selects a coupled
    policy gauge (COUPLED_ONLY) finds each metric, label and label value it selects in a scrape of this stack, every
    node labelled as the chart's PodMonitor labels it. Nothing is allowed but series Prometheus makes itself."""
    t0 = time.monotonic()
    scrapes = []
    for _ in range(3):  # Ray's agent exports every 2 s here (devstack.cluster.METRICS_REPORT_INTERVAL_MS)
        scrapes.append(Scrape(time.monotonic() - t0, scrape_all(stack)))
        time.sleep(3)
    exported = Exported(scrapes)
    queries = shipped_queries()
    parsed = parse_promql(queries)
    ours = {k: q for k, q in queries.items() if any(s["name"] in COUPLED_ONLY for s in parsed[k]["selectors"])}
    assert {s["name"] for k in ours for s in parsed[k]["selectors"]} >= COUPLED_ONLY
    report = check(ours, exported, PROMETHEUS_MADE | recorded_names())
    assert not report, "queries that select what the coupled app does not export:\n" + "\n".join(
        f"  {k}: {p}" for k, ps in report.items() for p in ps)
    # the controller (head pod) exports them for both roles; both nodes have room for 2 replicas: never unreachable
    for name in COUPLED_ONLY:
        assert exported.labels[name]["role"] == {"prefill", "decode"}, name
        assert exported.labels[name]["ray_io_group"] == {"headgroup"}, name
        assert exported.labels[name]["application"] == {APP}, name
    last = scrapes[-1].samples
    assert {s.value for s in last if s.name == "ray_rld_role_target_unreachable"} == {0.0}
    targets = {s.label("role"): s.value for s in last if s.name == "ray_rld_role_target_replicas"}
    assert set(targets) == {"prefill", "decode"} and set(targets.values()) <= {1.0, 2.0}, targets
    print(f"{len(ours)} queries on {sorted(COUPLED_ONLY)} checked against the coupled stack: {sorted(ours)}")
