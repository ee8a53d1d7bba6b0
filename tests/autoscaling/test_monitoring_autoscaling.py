"""The coupled policy's metrics, the dashboard row and the alert on them, without a stack.

tests/monitoring checks every rule and panel query against a live scrape of the shared stack, which runs
perDeployment and so never exports the coupled policy's gauges; it defers those names (COUPLED_ONLY) to
test_e2e_coupled.py, which checks the same queries against a scrape of its coupled stack. Here: the deferred
names are exactly what the policy records, and the chart's dashboard and alert select all of them.
"""

from __future__ import annotations

import ray.util.metrics

from serve_app.autoscaling import ray_policy
from serve_app.autoscaling.policy import Decision, RoleDecision
from tests.chart.monitoring_queries import parse_promql, rendered, rule_queries, shipped_queries
from tests.monitoring.test_metric_names import COUPLED_ONLY


class FakeGauge:
    made: dict[str, "FakeGauge"] = {}

    def __init__(self, name: str, description: str = "", tag_keys: tuple = ()) -> None:
        self.name, self.tag_keys, self.values = name, tuple(tag_keys), {}
        FakeGauge.made[name] = self

    def set(self, value: float, tags: dict[str, str]) -> None:
        assert set(tags) == set(self.tag_keys), (self.name, tags)
        self.values[tuple(sorted(tags.items()))] = value


def test_the_deferred_names_are_exactly_what_the_policy_records(monkeypatch):
    FakeGauge.made = {}
    monkeypatch.setattr(ray.util.metrics, "Gauge", FakeGauge)
    metrics = ray_policy._Metrics()
    d = RoleDecision("prefill", 1, 2, 1, 2.5, "ttft_s 5 / target 2", "up", False,
                     {"ttft_s": 5.0, "waiting_per_replica": 1.0}, {"ttft_s": 2.0, "waiting_per_replica": 4.0})
    metrics.record("llm", Decision({"prefill": d}))
    # Ray exports a ray.util.metrics metric with the prefix "ray_"
    assert {f"ray_{name}" for name in FakeGauge.made} == COUPLED_ONLY
    assert all(g.values for g in FakeGauge.made.values()), "every gauge is set on every decision"
    assert FakeGauge.made["rld_role_target_replicas"].values == {(("application", "llm"), ("role", "prefill")): 2}


def test_the_dashboard_row_and_the_alert_select_every_policy_metric():
    queries = shipped_queries()
    parsed = parse_promql(queries)
    selected = {s["name"] for res in parsed.values() for s in res["selectors"]}
    assert COUPLED_ONLY <= selected, f"not on the dashboard or in a rule: {COUPLED_ONLY - selected}"
    row = [k for k in queries if k.startswith("dashboard ") and any(
        s["name"] in COUPLED_ONLY for s in parsed[k]["selectors"])]
    assert {k.split("/")[0] for k in row} == {
        "dashboard Replicas per role: target and running", "dashboard Scaling pressure per role",
        "dashboard Signals against their targets", "dashboard Target not reachable"}
    rules = rule_queries(rendered().one("PrometheusRule")["spec"])
    (alert,) = [q for k, q in rules.items() if k.startswith("RLDRoleTargetUnreachable ")]
    assert "ray_rld_role_target_unreachable{" in alert and "role" in alert
