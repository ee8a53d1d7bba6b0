"""The PromQL the chart ships: its rules' and its dashboard's queries, and Prometheus' parser over them.

Used by tests/chart/test_chart_monitoring.py (queries parse, are scoped to the release) and by
tests/monitoring (every metric, label and bucket they select exists in a real scrape of the app).
"""

from __future__ import annotations

import json
import re
import subprocess

from .conftest import render, tool

ALL_ON = {"monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                         "dashboards": {"enabled": True}}}

# What Grafana substitutes before a query reaches Prometheus (release llm in namespace llm).
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "30s", "$namespace": "llm", "$release": "llm",
                "${namespace}": "llm", "${release}": "llm"}


def grafana_substitute(expr: str) -> str:
    for var in sorted(GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, GRAFANA_VARS[var])
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def dashboard_queries(dashboard: dict) -> dict[str, str]:
    """'panel title/refId' (or 'variable NAME') -> PromQL, Grafana variables substituted."""
    out = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out[f"{panel['title']}/{target['refId']}"] = grafana_substitute(target["expr"])
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            assert m, f"variable {var['name']}: {q}"
            out[f"variable {var['name']}"] = grafana_substitute(m.group(1))
    return out


def rule_queries(spec: dict) -> dict[str, str]:
    """'alert or record name #i' -> PromQL of every rule."""
    out = {}
    for group in spec["groups"]:
        for i, rule in enumerate(group["rules"]):
            out[f"{rule.get('alert') or rule.get('record')} #{i}"] = rule["expr"]
    return out


def parse_promql(exprs: dict[str, str]) -> dict[str, dict]:
    """Prometheus' own parser (promql-selectors): id -> {selectors: [{name, matchers}], grouping}."""
    proc = subprocess.run([tool("promql-selectors")], input=json.dumps(exprs), capture_output=True, text=True, timeout=60)
    out = json.loads(proc.stdout)
    bad = {k: v["error"] for k, v in out.items() if v.get("error")}
    assert not bad and proc.returncode == 0, f"queries that do not parse: {bad}"
    return out


def rendered(values: dict | None = None, release: str = "llm", namespace: str = "llm"):
    return render(values=[ALL_ON, values or {}], release=release, extra=("--namespace", namespace))


def rendered_dashboard(values: dict | None = None) -> dict:
    cm = rendered(values).one("ConfigMap")
    (name, text), = cm["data"].items()
    assert name == "ray-llm-disagg.json"
    return json.loads(text)


def shipped_queries(values: dict | None = None) -> dict[str, str]:
    """Every query the chart ships with these values: rules and dashboard."""
    r = rendered(values)
    return {**{f"rule {k}": v for k, v in rule_queries(r.one("PrometheusRule")["spec"]).items()},
            **{f"dashboard {k}": v for k, v in dashboard_queries(rendered_dashboard(values)).items()}}


def recorded_names(values: dict | None = None) -> set[str]:
    spec = rendered(values).one("PrometheusRule")["spec"]
    return {rule["record"] for group in spec["groups"] for rule in group["rules"] if "record" in rule}
