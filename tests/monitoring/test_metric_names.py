"""Every metric, label and bucket bound the chart's rules and dashboard query exists in a real scrape.

The real local stack (Ray + vLLM CPU engines + NIXL over UCX, tiny model, disaggregated) serves
streamed traffic on both paths; a failed NIXL transfer and an expired KV lease are provoked on the
prefill engine (Ray exports a counter only from its first increment). Each node's Ray metrics port is
scraped and labelled as the chart's PodMonitor labels it in a cluster. The queries come from the
rendered chart (all monitoring on), are parsed by Prometheus' own parser, and each selector must find:
its metric name, every label it matches on, and for `=`/`=~` matchers a label value that matches.
A metric, label or value renamed on either side (app, vLLM, Ray, chart) fails here.
"""

from __future__ import annotations

import re

import pytest

from .monitoring_live import Scrape
from tests.chart.monitoring_queries import parse_promql, recorded_names, shipped_queries

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

# Series Prometheus makes itself, not the target.
PROMETHEUS_MADE = {"up"}
# Metrics a rule or panel already queries, from a contract with a change that has not landed on this
# branch yet. Each entry says where it comes from; the test fails once the name shows up in the scrape
# (then it is checked like any other and must leave this list).
PENDING = {
    "ray_rld_overflow_requests_total": "issue 10 (branch issue-10-resilience, serve_app/frontend/overflow.py): requests sent "
                                       "to the external endpoint, labels reason and outcome; only with overflow on",
    # Landed (issue 10), but Ray exports a counter only from its first increment and observe() provokes neither
    # yet: a 429 needs tiny admission limits under load, a failover a dead or slow prefill replica, the
    # served_by="error" value a 503 with failover.localFallback off.
    "ray_rld_admission_rejections_total": "issue 10 (serve_app/frontend/admission.py): 429s of admission control, label reason "
                                          "(queue_full, queue_timeout); not provoked by observe()",
}

# Metrics the app exports only after an event that observe() does not provoke but a stack may see anyway: when the
# scrape has them, their label names are checked (not the values: those depend on the events seen); absent is fine.
EVENTUAL = {
    # serve_app/engine/failover.py: failed remote prefills (labels model, reason, served_by); e.g. a request that
    # reached decode during its NIXL pre-warm (reason kv_handshake_pending)
    "ray_rld_prefill_failovers_total",
}


# Metrics only an app in `autoscaling.mode: coupled` exports: the coupled policy's gauges, recorded in the Serve
# controller (serve_app/autoscaling/ray_policy.py; tests/autoscaling checks this is exactly what it records). The
# shared stack runs perDeployment, so they are not in its scrape: tests/autoscaling/test_e2e_coupled.py checks
# every rule and panel query that selects them with check() below, against a scrape of its coupled stack.
COUPLED_ONLY = {
    "ray_rld_role_target_replicas", "ray_rld_role_replicas", "ray_rld_role_pressure", "ray_rld_role_signal",
    "ray_rld_role_signal_target", "ray_rld_role_target_unreachable",
}


class Exported:
    """The union of every scrape: metric name -> label -> values seen."""

    def __init__(self, scrapes: list[Scrape]) -> None:
        self.labels: dict[str, dict[str, set[str]]] = {}
        for scrape in scrapes:
            for s in scrape.samples:
                per_label = self.labels.setdefault(s.name, {})
                for k, v in s.labels:
                    per_label.setdefault(k, set()).add(v)

    def problems(self, selector: dict, allowed: set[str]) -> list[str]:
        name = selector["name"]
        if name in allowed or (name in EVENTUAL and name not in self.labels):
            return []
        if name not in self.labels:
            return [f"metric {name} is not exported"]
        out = []
        for m in selector["matchers"]:
            values = self.labels[name].get(m["label"])
            if values is None:
                out.append(f"{name} has no label {m['label']!r} (labels: {sorted(self.labels[name])})")
            elif name in EVENTUAL:
                continue  # which values show up depends on the events the stack happened to see
            elif m["type"] == "=" and m["value"] not in values:
                out.append(f"{name}{{{m['label']}={m['value']!r}}}: value never seen (seen: {sorted(values)[:12]})")
            elif m["type"] == "=~" and not any(re.fullmatch(m["value"], v) for v in values):
                out.append(f"{name}{{{m['label']}=~{m['value']!r}}}: matches no value (seen: {sorted(values)[:12]})")
        return out


def check(queries: dict[str, str], exported: Exported, allowed: set[str]) -> dict[str, list[str]]:
    """query id -> what it selects that the scrape does not have."""
    parsed = parse_promql(queries)
    report = {}
    for key, res in parsed.items():
        problems = [p for sel in res["selectors"] for p in exported.problems(sel, allowed)]
        selected = {sel["name"] for sel in res["selectors"]} - allowed - (EVENTUAL - set(exported.labels))
        have = set().union(*(exported.labels.get(n, {}).keys() for n in selected)) if selected else set()
        for label in res["grouping"]:
            if selected and label not in have and label not in {"bottleneck"}:
                problems.append(f"groups by {label!r}, which none of {sorted(selected)} carries")
        if problems:
            report[key] = problems
    return report


@pytest.fixture(scope="module")
def exported(scrapes: list[Scrape]) -> Exported:
    return Exported(scrapes)


def test_the_scrape_has_both_paths_and_the_provoked_failures(exported: Exported, scrapes: list[Scrape]) -> None:
    paths = exported.labels["ray_rld_requests_total"]["path"]
    assert {"remote", "local"} <= paths
    for name in ("ray_vllm_nixl_num_failed_transfers_total", "ray_vllm_nixl_num_kv_expired_reqs_total"):
        assert exported.labels[name]["ray_io_group"] == {"prefill"}, name
    # busy engines export their gauges, per role
    assert exported.labels["ray_vllm_kv_cache_usage_perc"]["ray_io_group"] == {"prefill", "decode"}
    print(f"{len(scrapes)} scrapes, {len(exported.labels)} metric names, "
          f"{sum(len(s.samples) for s in scrapes[-1:])} samples in the last")


def test_every_rule_and_panel_query_selects_what_the_app_exports(exported: Exported) -> None:
    # serve.appName as the stack names its disaggregated app (queries that select Serve's `application` label)
    values = {"serve": {"appName": "disagg"}}
    queries = shipped_queries(values)
    allowed = PROMETHEUS_MADE | set(PENDING) | COUPLED_ONLY | recorded_names(values)
    report = check(queries, exported, allowed)
    assert not report, "queries that select what a real scrape does not have:\n" + "\n".join(
        f"  {k}: {p}" for k, ps in report.items() for p in ps)
    names = {sel["name"] for res in parse_promql(queries).values() for sel in res["selectors"]}
    verified = sorted(names - allowed)
    print(f"{len(queries)} queries, {len(verified)} metric names verified against the scrape: {', '.join(verified)}")
    print(f"checked by tests/autoscaling against a coupled stack: {sorted(names & COUPLED_ONLY)}")
    print(f"not verifiable here: {sorted(names & set(PENDING))} (pending: {PENDING}); "
          f"made by Prometheus: {sorted(names & PROMETHEUS_MADE)}; recording rules: {len(names & recorded_names())}")


def test_pending_names_are_not_exported_yet(exported: Exported) -> None:
    landed = set(PENDING) & set(exported.labels)
    assert not landed, f"{landed} are exported now: remove them from PENDING so they are checked"


def test_coupled_only_names_are_not_exported_by_a_per_deployment_app(exported: Exported) -> None:
    """If the shared stack ever exports them, they belong with every other name, checked here."""
    here = COUPLED_ONLY & set(exported.labels)
    assert not here, f"{here} are exported by the shared (perDeployment) stack: remove them from COUPLED_ONLY"


@pytest.mark.parametrize(("query", "why"), [
    ('sum(ray_vllm_gpu_cache_usage_perc{ray_io_group="decode"})', "vLLM's pre-V1 name"),
    ('sum(rate(ray_rld_requests_total{route="remote"}[5m]))', "a label the app does not set"),
    ('sum(rate(ray_rld_requests_total{path="prefill"}[5m]))', "a path value the app does not use"),
    ('sum(rate(ray_rld_time_to_first_token_seconds_bucket{le="3"}[5m]))', "a bucket bound that does not exist"),
    ('sum by (replica) (rate(ray_rld_requests_total[5m]))', "grouping by a label it does not carry"),
])
def test_the_check_catches_drift(exported: Exported, query: str, why: str) -> None:
    assert check({"q": query}, exported, PROMETHEUS_MADE), f"not caught: {why}"
