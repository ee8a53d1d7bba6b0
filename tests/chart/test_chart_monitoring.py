"""The chart's monitoring objects: PodMonitor, PrometheusRule, Grafana dashboard ConfigMap.

Rendered with real helm, validated with kubeconform against the Prometheus Operator CRD schemas,
the rules checked and unit-tested with real promtool (tests/chart/promtool/alerts_test.yaml), the
dashboard's queries parsed by Prometheus' own parser (promql-selectors). Whether the queried metric
names exist in a real scrape of the app is tests/monitoring's job.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from serve_app.telemetry.metrics import LATENCY_BOUNDARIES_S

from .conftest import CHART, KUBE_VERSION, REPO, kubeconform_many, key_named, render, render_error, tool
from .monitoring_queries import ALL_ON, dashboard_queries, parse_promql, rendered_dashboard

PROMTOOL_TESTS = Path(__file__).parent / "promtool" / "alerts_test.yaml"
RUNBOOKS = CHART / "docs" / "runbooks.md"
DASHBOARD = CHART / "dashboards" / "ray-llm-disagg.json"

def monitoring(values: dict) -> dict:
    return {"monitoring": values}


def rule_spec(values: dict | None = None, **kw) -> dict:
    r = render(values=[ALL_ON, values or {}], **kw)
    return r.one("PrometheusRule")["spec"]


def alerts(spec: dict) -> list[dict]:
    return [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]


def alert_names(spec: dict) -> set[str]:
    return {a["alert"] for a in alerts(spec)}


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# ------------------------------------------------------------------------------------------------
# Opt-in, and the objects themselves
# ------------------------------------------------------------------------------------------------

def test_monitoring_objects_are_opt_in() -> None:
    kinds = {d["kind"] for d in render().docs}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ConfigMap"}, kinds
    on = render(values=ALL_ON)
    assert {d["kind"] for d in on.docs} >= {"PodMonitor", "PrometheusRule", "ConfigMap"}


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_pod_monitor_scrapes_the_metrics_port_of_every_ray_pod(mode: str) -> None:
    r = render(values=[ALL_ON, {"mode": mode}], release="llm")
    pm = r.one("PodMonitor")["spec"]
    selector = pm["selector"]["matchLabels"]
    assert pm["namespaceSelector"] == {"matchNames": ["llm"]}
    pods = {"head": r.head["template"]}
    pods.update({name: g["template"] for name, g in r.groups.items()})
    assert set(pods) == ({"head", "prefill", "decode"} if mode == "disaggregated" else {"head", "decode"})
    for name, template in pods.items():
        labels = template["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"PodMonitor selector misses the {name} pods: {selector} vs {labels}"
    # every Ray container names its metrics export port as the endpoint does (KubeRay's default 8080)
    (endpoint,) = pm["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["interval"] == "30s" and endpoint["path"] == "/metrics"
    for name, template in pods.items():
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0].get("ports", [])}
        assert ports.get("metrics") == 8080, f"{name}: {ports}"
    # the target labels the rules and the dashboard select by
    targets = {rl["targetLabel"]: rl["sourceLabels"] for rl in endpoint["relabelings"]}
    assert targets == {"app_kubernetes_io_instance": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                       "ray_io_group": ["__meta_kubernetes_pod_label_ray_io_group"]}


def test_a_moved_metrics_export_port_is_still_scraped() -> None:
    """The endpoint names the port, so a group's own `metrics-export-port` moves with it."""
    r = render(values=[ALL_ON, {"decode": {"rayStartParams": {"metrics-export-port": "9090"}}}])
    (endpoint,) = r.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    decode = r.groups["decode"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in decode["ports"]}[endpoint["port"]] == 9090


def test_the_helm_test_pod_is_not_scraped() -> None:
    r = render(values=ALL_ON)
    (endpoint,) = r.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    for pod in r.all("Pod"):
        ports = [p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        assert endpoint["port"] not in ports, f"{pod['metadata']['name']} would be scraped"


def test_knobs_reach_the_objects() -> None:
    relabel = [{"action": "labeldrop", "regex": "SessionName"}]
    drop = [{"action": "drop", "sourceLabels": ["__name__"], "regex": "ray_node_disk_.*"}]
    r = render(values=[ALL_ON, monitoring({
        "podMonitor": {"labels": {"release": "kps"}, "annotations": {"a": "b"}, "interval": "15s",
                       "scrapeTimeout": "10s", "honorLabels": True, "relabelings": relabel,
                       "metricRelabelings": drop, "sampleLimit": 50000, "namespace": "monitoring"},
        "prometheusRule": {"labels": {"release": "kps"}, "namespace": "monitoring", "interval": "1m",
                           "alertLabels": {"team": "ml-platform"}},
        "dashboards": {"labels": {"grafana_dashboard": "1", "team": "ml"}, "annotations": {"grafana_folder": "LLM"},
                       "namespace": "grafana"}})], release="llm")
    pm = r.one("PodMonitor")
    assert pm["metadata"]["namespace"] == "monitoring" and pm["metadata"]["labels"]["release"] == "kps"
    assert pm["metadata"]["annotations"] == {"a": "b"}
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}, "pods stay in the release namespace"
    assert pm["spec"]["sampleLimit"] == 50000
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert (ep["interval"], ep["scrapeTimeout"], ep["honorLabels"]) == ("15s", "10s", True)
    assert ep["relabelings"][-1] == relabel[0] and ep["metricRelabelings"] == drop
    pr = r.one("PrometheusRule")
    assert pr["metadata"]["namespace"] == "monitoring" and pr["metadata"]["labels"]["release"] == "kps"
    assert all(g["interval"] == "1m" for g in pr["spec"]["groups"])
    assert all(a["labels"]["team"] == "ml-platform" and a["labels"]["severity"] in ("warning", "critical")
               for a in alerts(pr["spec"]))
    cm = r.one("ConfigMap")
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["labels"]["team"] == "ml"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}


def test_an_object_label_the_chart_also_sets_is_emitted_once() -> None:
    r = render(values=[ALL_ON, monitoring({"podMonitor": {"labels": {"app.kubernetes.io/part-of": "llm-stack"}}})])
    text = r.stdout.split("kind: PodMonitor", 1)[1].split("spec:", 1)[0]
    assert text.count("app.kubernetes.io/part-of") == 1
    assert r.one("PodMonitor")["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llm-stack"


def test_monitoring_objects_validate_against_the_prometheus_operator_crds() -> None:
    variants = {
        "all-on": ALL_ON,
        "all-knobs": [ALL_ON, monitoring({
            "podMonitor": {"labels": {"release": "kps"}, "interval": "15s", "scrapeTimeout": "10s",
                           "honorLabels": True, "sampleLimit": 1000,
                           "relabelings": [{"action": "labeldrop", "regex": "SessionName"}],
                           "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "x.*"}]},
            "prometheusRule": {"interval": "30s", "alertLabels": {"team": "x"}, "disabled": ["RLDOverflowActive"]},
            "slo": {"ttft": {"objective": 0.999, "thresholdSeconds": 1}}})],
        "aggregated": [ALL_ON, {"mode": "aggregated"}],
    }
    manifests = {}
    for name, values in variants.items():
        r = render(values=values)
        manifests[name] = yaml.safe_dump_all([d for d in r.docs if d["kind"] in ("PodMonitor", "PrometheusRule", "ConfigMap")])
    results = kubeconform_many(manifests)
    for name, resources in results.items():
        kinds = sorted(res["kind"] for res in resources)
        assert kinds == ["ConfigMap", "PodMonitor", "PrometheusRule"], (name, resources)
        bad = [res for res in resources if res["status"] != "statusValid"]
        assert not bad, f"{name}: {bad}"


def test_helm_lint_strict_with_monitoring_on(tmp_path: Path) -> None:
    (tmp_path / "on.yaml").write_text(yaml.safe_dump(ALL_ON))
    proc = run([tool("helm"), "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "-f", str(tmp_path / "on.yaml")])
    assert proc.returncode == 0 and "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout
    bad = run([tool("helm"), "lint", "--strict", str(CHART), "-f", str(tmp_path / "on.yaml"),
               "--set", "monitoring.slo.ttft.thresholdSeconds=3"])
    assert bad.returncode != 0 and "/monitoring/slo/ttft/thresholdSeconds" in bad.stdout + bad.stderr


def test_kubeconform_rejects_a_podmonitor_the_crd_refuses() -> None:
    """The CRD schema is really applied: a field the CRD does not have fails -strict validation."""
    r = render(values=ALL_ON)
    pm = r.one("PodMonitor")
    pm["spec"]["podMetricsEndpoints"][0]["scrapeEvery"] = "30s"
    (res,) = kubeconform_many({"bad": yaml.safe_dump(pm)})["bad"]
    assert res["status"] == "statusInvalid" and "scrapeEvery" in res["msg"], res


# ------------------------------------------------------------------------------------------------
# Rules: promtool, unit tests, runbooks
# ------------------------------------------------------------------------------------------------

def promtool_dir(tmp_path: Path, spec: dict) -> Path:
    """rules.yaml (annotations stripped, see alerts_test.yaml), full.yaml and the unit tests, side by side."""
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(spec))
    stripped = json.loads(json.dumps(spec))
    for group in stripped["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(stripped))
    shutil.copy(PROMTOOL_TESTS, tmp_path / "alerts_test.yaml")
    return tmp_path


def test_rules_pass_promtool_check_with_every_lint(tmp_path: Path) -> None:
    d = promtool_dir(tmp_path, rule_spec(release="llm"))
    proc = run([tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", "full.yaml"], cwd=d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = sum(len(g["rules"]) for g in yaml.safe_load((d / "full.yaml").read_text())["groups"])
    assert f"SUCCESS: {n} rules found" in proc.stdout, proc.stdout
    print(proc.stdout.strip())


def test_promtool_check_catches_a_broken_rule(tmp_path: Path) -> None:
    spec = rule_spec()
    alerts(spec)[0]["expr"] = "sum by (pod) (rate(ray_rld_requests_total[5m])"
    d = promtool_dir(tmp_path, spec)
    proc = run([tool("promtool"), "check", "rules", "full.yaml"], cwd=d)
    assert proc.returncode != 0 and "unclosed left parenthesis" in proc.stdout + proc.stderr


def test_rules_pass_their_promtool_unit_tests(tmp_path: Path) -> None:
    d = promtool_dir(tmp_path, rule_spec(release="llm", extra=("--namespace", "llm")))
    proc = run([tool("promtool"), "test", "rules", "alerts_test.yaml"], cwd=d)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    print(proc.stdout.strip())


def test_unit_tests_fail_when_a_threshold_moves(tmp_path: Path) -> None:
    """The unit tests pin the behaviour: the same tests against looser thresholds must fail."""
    looser = monitoring({"alerts": {"prefillQueue": {"waitingPerEngine": 50}, "decodeKvCache": {"usage": 0.99},
                                    "admissionRejections": {"ratio": 0.5}, "overflowFailures": {"ratio": 0.5}},
                         "slo": {"ttft": {"objective": 0.5, "thresholdSeconds": 2.5}}})
    d = promtool_dir(tmp_path, rule_spec(looser, release="llm"))
    proc = run([tool("promtool"), "test", "rules", "alerts_test.yaml"], cwd=d)
    assert proc.returncode != 0
    for alert in ("RLDPrefillQueueSaturated", "RLDDecodeKVCacheNearFull", "RLDTTFTBudgetBurn", "RLDAdmissionRejections",
                  "RLDOverflowFailing"):
        assert f"alertname: {alert}" in proc.stdout + proc.stderr, f"no unit test noticed {alert}: {proc.stdout}{proc.stderr}"


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
    firing, quiet = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = alert_names(rule_spec())
    assert names - firing == set(), f"alerts without a unit test that fires them: {names - firing}"
    assert names - quiet == set(), f"alerts without a unit test that keeps them quiet: {names - quiet}"
    assert (firing | quiet) <= names, f"unit tests of alerts that do not exist: {(firing | quiet) - names}"


def test_every_alert_has_a_runbook_entry_and_says_what_happened() -> None:
    spec = rule_spec()
    anchors = {github_anchor(line.lstrip("#")) for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")}
    base = "https://github.com/ray-llm-disagg/ray-llm-disagg/blob/main/charts/ray-llm-disagg/docs/runbooks.md"
    for a in alerts(spec):
        ann = a["annotations"]
        assert ann["summary"] and ann["description"], a["alert"]
        url, _, anchor = ann["runbook_url"].partition("#")
        assert url == base and anchor == a["alert"].lower(), ann["runbook_url"]
        assert anchor in anchors, f"{RUNBOOKS.relative_to(REPO)} has no '## {a['alert']}' section"
        assert a["labels"]["severity"] in ("warning", "critical")
    assert alert_names(spec) == {
        "RLDMetricsTargetDown", "RLDKVTransferFailures", "RLDKVBlocksExpired", "RLDKVTransferSlow",
        "RLDTTFTBudgetBurn", "RLDITLBudgetBurn", "RLDPrefillQueueSaturated", "RLDDecodeKVCacheNearFull",
        "RLDPrefillDecodeImbalance", "RLDDecodeOnlyFallback", "RLDRemotePrefillWithoutKV", "RLDOverflowActive",
        "RLDOverflowFailing", "RLDAdmissionRejections", "RLDPrefillFailovers", "RLDRoleUnavailable",
        "RLDRequestKilledEngine", "RLDRoleTargetUnreachable"}
    source = yaml.safe_load((CHART / "schema" / "chart.yaml").read_text())
    disabled_enum = source["properties"]["monitoring"]["properties"]["prometheusRule"]["properties"]["disabled"]["items"]["enum"]
    assert set(disabled_enum) == alert_names(spec), "schema/chart.yaml's list of alert names is stale"


def test_runbook_base_url_and_disabled_alerts() -> None:
    spec = rule_spec(monitoring({"prometheusRule": {"runbookBaseUrl": "https://wiki.example/llm/",
                                                    "disabled": ["RLDPrefillDecodeImbalance", "RLDOverflowActive"]}}))
    assert alert_names(spec).isdisjoint({"RLDPrefillDecodeImbalance", "RLDOverflowActive"})
    assert all(a["annotations"]["runbook_url"] == f"https://wiki.example/llm#{a['alert'].lower()}" for a in alerts(spec))
    err = render_error(values=[ALL_ON, monitoring({"prometheusRule": {"disabled": ["RLDNoSuchAlert"]}})])
    assert key_named(err, "monitoring.prometheusRule.disabled.0"), err


@pytest.mark.parametrize(("values", "roles"), [
    ({}, "prefill|decode"),
    ({"mode": "aggregated"}, "decode"),
    ({"prefill": {"autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}}, "decode"),
    ({"mode": "aggregated", "decode": {"replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}}, None),
])
def test_role_unavailable_leaves_out_roles_that_scale_to_zero(values: dict, roles: str | None) -> None:
    """A role autoscaling from zero has no running replica by design; with no role left the alert is not rendered."""
    rules = [a for a in alerts(rule_spec(values)) if a["alert"] == "RLDRoleUnavailable"]
    if roles is None:
        assert not rules
    else:
        (rule,) = rules
        assert f'role=~"{roles}"' in rule["expr"], rule["expr"]


@pytest.mark.parametrize(("values", "deployment"), [
    ({}, "Decode:"),
    ({"mode": "aggregated"}, "Aggregated:"),
    ({"frontend": {"directStreaming": False}}, None),
    ({"decode": {"replicas": 0, "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2}}}, None),
])
def test_role_unavailable_reads_decode_from_serve_when_decode_is_the_frontend(values: dict, deployment) -> None:
    """With direct streaming no frontend replica is left to report decode down: the serving deployment's healthy
    replicas come from Serve's controller instead (the promtool tests fire and silence it)."""
    (rule,) = [a for a in alerts(rule_spec(values)) if a["alert"] == "RLDRoleUnavailable"]
    if deployment is None:
        assert "ray_serve_deployment_replica_healthy" not in rule["expr"], rule["expr"]
    else:
        assert f'application="llm",deployment=~"{deployment}.*"' in rule["expr"], rule["expr"]


def selectors_of(spec: dict) -> list[dict]:
    exprs = {f"{i}": rule["expr"] for i, rule in enumerate(r for g in spec["groups"] for r in g["rules"])}
    return [s for res in parse_promql(exprs).values() for s in res["selectors"]]


def test_every_raw_selector_is_scoped_to_the_release() -> None:
    """Two releases in one Prometheus never mix: every selector of a scraped metric carries the release's
    matchers (recording-rule outputs carry the release as static labels)."""
    for values, want in [({}, {("namespace", "=", "ns1"), ("app_kubernetes_io_instance", "=", "rel")}),
                         (monitoring({"prometheusRule": {"selector": 'job="ray",cluster="a"'}}),
                          {("job", "=", "ray"), ("cluster", "=", "a")})]:
        spec = rule_spec(values, release="rel", extra=("--namespace", "ns1"))
        for sel in selectors_of(spec):
            got = {(m["label"], m["type"], m["value"]) for m in sel["matchers"]}
            if sel["name"].startswith("rld:"):
                assert {("namespace", "=", "ns1"), ("app_kubernetes_io_instance", "=", "rel")} <= got, sel
            else:
                assert want <= got, sel
        for group in spec["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    assert rule["labels"] == {"namespace": "ns1", "app_kubernetes_io_instance": "rel"}


@pytest.mark.parametrize(("threshold", "matcher"), [(2.5, ("=", "2.5")), (1, ("=~", r"1|1\.0")), (60, ("=~", r"60|60\.0"))])
def test_slo_threshold_selects_its_bucket(threshold: float, matcher: tuple[str, str]) -> None:
    """Ray writes bounds as `2.5` and `1.0`; Prometheus 3 keeps `1.0`, 2.x keeps what the target wrote."""
    spec = rule_spec(monitoring({"slo": {"ttft": {"objective": 0.99, "thresholdSeconds": threshold}}}))
    les = {(m["type"], m["value"]) for s in selectors_of(spec) if s["name"] == "ray_rld_time_to_first_token_seconds_bucket"
           for m in s["matchers"] if m["label"] == "le"}
    assert les == {matcher}


def test_slo_thresholds_must_be_bucket_bounds() -> None:
    err = render_error(values=[ALL_ON, monitoring({"slo": {"ttft": {"objective": 0.99, "thresholdSeconds": 3}}})])
    assert key_named(err, "monitoring.slo.ttft.thresholdSeconds"), err
    err = render_error(values=[ALL_ON, monitoring({"slo": {"itl": {"objective": 1, "thresholdSeconds": 0.2}}})])
    assert key_named(err, "monitoring.slo.itl.objective"), err
    source = yaml.safe_load((CHART / "schema" / "chart.yaml").read_text())  # values.schema.json is generated from it
    slo = source["properties"]["monitoring"]["properties"]["slo"]["properties"]
    assert slo["ttft"]["properties"]["thresholdSeconds"]["enum"] == LATENCY_BOUNDARIES_S, (
        "the TTFT threshold enum must list serve_app.telemetry.metrics.LATENCY_BOUNDARIES_S (the histogram's buckets)")


@pytest.mark.parametrize(("bad", "key"), [
    ({"podMonitor": {"interval": "30 seconds"}}, "monitoring.podMonitor.interval"),
    ({"podMonitor": {"scrapeTimeout": "1x"}}, "monitoring.podMonitor.scrapeTimeout"),
    ({"alerts": {"decodeKvCache": {"usage": 90}}}, "monitoring.alerts.decodeKvCache.usage"),
    ({"podMonitor": {"enable": True}}, "monitoring.podMonitor.enable"),
    ({"prometheusRule": {"runbookBaseUrl": "wiki/runbooks"}}, "monitoring.prometheusRule.runbookBaseUrl"),
    ({"dashboards": {"labels": {"grafana_dashboard": 1}}}, "monitoring.dashboards.labels.grafana_dashboard"),
])
def test_schema_refuses_bad_monitoring_values(bad: dict, key: str) -> None:
    err = render_error(values=[ALL_ON, monitoring(bad)])
    assert key_named(err, key), err


# ------------------------------------------------------------------------------------------------
# Dashboard
# ------------------------------------------------------------------------------------------------

def test_dashboard_configmap_carries_the_sidecar_label_and_valid_json() -> None:
    r = render(values=ALL_ON)
    cm = r.one("ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = rendered_dashboard()
    assert dash["uid"] == "ray-llm-disagg" and dash["title"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "namespace", "release"]
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_every_dashboard_query_parses() -> None:
    queries = dashboard_queries(rendered_dashboard())
    assert len(queries) >= 20
    parsed = parse_promql(queries)
    for key, res in parsed.items():
        assert res["selectors"], f"{key} selects nothing"
        if key.startswith("variable "):  # the variables list namespaces and releases
            continue
        for sel in res["selectors"]:
            got = {(m["label"], m["value"]) for m in sel["matchers"]}
            assert {("namespace", "llm"), ("app_kubernetes_io_instance", "llm")} <= got, f"{key}: {sel}"


def test_dashboard_parser_rejects_a_broken_query() -> None:
    proc = subprocess.run([tool("promql-selectors")], input=json.dumps({"q": "sum(rate(x[5m])"}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "unclosed left parenthesis" in json.loads(proc.stdout)["q"]["error"]


def test_dashboard_draws_the_configured_slo_thresholds() -> None:
    def steps(dash: dict, title: str) -> list:
        (panel,) = [p for p in dash["panels"] if p["title"] == title]
        return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    dash = rendered_dashboard(monitoring({"slo": {"ttft": {"objective": 0.99, "thresholdSeconds": 5},
                                                  "itl": {"objective": 0.99, "thresholdSeconds": 0.1}}}))
    assert steps(dash, "Time to first token (client, by decode)") == [None, 5]
    assert steps(dash, "Inter-token latency (decode engines)") == [None, 0.1]


def test_committed_dashboard_is_the_rendered_one_before_thresholds() -> None:
    """The ConfigMap ships dashboards/ray-llm-disagg.json; only the SLO placeholders are filled in."""
    raw = DASHBOARD.read_text()
    assert '"__TTFT_SLO_SECONDS__"' in raw and '"__ITL_SLO_SECONDS__"' in raw
    filled = raw.replace('"__TTFT_SLO_SECONDS__"', "2.5").replace('"__ITL_SLO_SECONDS__"', "0.2")
    assert json.loads(filled) == rendered_dashboard()
