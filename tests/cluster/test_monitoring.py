"""The monitoring objects on the real API server, and the PodMonitor against the pods KubeRay really creates.

The Prometheus Operator's PodMonitor and PrometheusRule CRDs (versions.env PROMETHEUS_OPERATOR_VERSION,
from its Go module) are applied to the local control plane, so the API server validates the chart's
objects with the CRDs' own schemas and CEL rules. Then the PodMonitor's pod selector and port are
matched against the RayCluster's pods as the KubeRay operator created them (KubeRay adds the `metrics`
port to worker containers; the chart declares it only on the head).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import tool
from .kube import CHART, ROOT, env_with_kubeconfig, expected_pod_counts, wait_until

MONITORING = "monitoring.coreos.com"
CRDS = ("podmonitors", "prometheusrules")
ON = ["--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
      "--set", "monitoring.dashboards.enabled=true"]


def versions() -> dict[str, str]:
    lines = (ROOT / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#") and "=" in line)


@pytest.fixture(scope="module")
def monitoring_crds(cluster):
    module = f"github.com/prometheus-operator/prometheus-operator@{versions()['PROMETHEUS_OPERATOR_VERSION']}"
    info = subprocess.run(["go", "mod", "download", "-json", module], capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, f"go mod download {module}: {info.stdout}{info.stderr}"
    crd_dir = f"{json.loads(info.stdout)['Dir']}/example/prometheus-operator-crd"
    env = env_with_kubeconfig(cluster.kubeconfig)
    kubectl = tool("kubectl")
    files = [f"{crd_dir}/{MONITORING}_{name}.yaml" for name in CRDS]
    for _attempt in range(3):  # a busy 2-core API server can time out building the OpenAPI of a new CRD
        applied = subprocess.run([kubectl, "apply", "--server-side", "--force-conflicts", *sum((["-f", f] for f in files), [])],
                                 capture_output=True, text=True, env=env, timeout=300)
        if applied.returncode == 0:
            break
    assert applied.returncode == 0, applied.stderr
    names = [f"crd/{name}.{MONITORING}" for name in CRDS]

    def established() -> bool:
        # (`kubectl wait` errors out instead of waiting while a new CRD has no status.conditions yet)
        got = subprocess.run([kubectl, "get", *names, "-o", 'jsonpath={.items[*].status.conditions[?(@.type=="Established")].status}'],
                             capture_output=True, text=True, env=env, timeout=60)
        return got.returncode == 0 and got.stdout.split() == ["True"] * len(names)

    wait_until(established, 180, f"the CRDs {names} to be Established")
    yield
    subprocess.run([kubectl, "delete", "--wait=false", *names], capture_output=True, env=env, timeout=120)


def test_monitoring_objects_install_and_the_pod_monitor_selects_every_ray_pod(monitoring_crds, release, kube):
    rel = release("llm").install("-f", str(CHART / "examples" / "cpu-tiny.yaml"), *ON)
    ns = rel.namespace
    pm = kube.custom.get_namespaced_custom_object(MONITORING, "v1", ns, "podmonitors", rel.rayservice_name)
    rule = kube.custom.get_namespaced_custom_object(MONITORING, "v1", ns, "prometheusrules", rel.rayservice_name)
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"RLDDecodeOnlyFallback", "RLDPrefillFailovers", "RLDRoleUnavailable", "RLDRequestKilledEngine"} <= alerts
    assert len(alerts) == 18, alerts
    dashboards = kube.core.list_namespaced_config_map(ns, label_selector="grafana_dashboard=1").items
    assert [cm.metadata.name for cm in dashboards] == [f"{rel.rayservice_name}-dashboard"]

    rc = rel.raycluster()
    pods = rel.wait_pods(rc["metadata"]["name"], expected_pod_counts(rel.values))
    assert set(pods) == {"head", "prefill", "decode"}
    selector = pm["spec"]["selector"]["matchLabels"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    selected = {p.metadata.name for p in kube.pods(ns, ",".join(f"{k}={v}" for k, v in selector.items()))}
    for group, group_pods_ in pods.items():
        for pod in group_pods_:
            assert pod.metadata.name in selected, f"the PodMonitor does not select the {group} pod {pod.metadata.name}"
            ray = next(c for c in pod.spec.containers if c.name.startswith("ray-"))
            ports = {p.name: p.container_port for p in ray.ports or []}
            assert ports.get(endpoint["port"]) == 8080, f"{group} pod {pod.metadata.name} ports: {ports}"
            # the target label the rules select roles by (relabelled from this pod label)
            assert pod.metadata.labels["ray.io/group"] == ("headgroup" if group == "head" else group)


def test_the_api_server_refuses_a_pod_monitor_its_crd_does_not_allow(monitoring_crds, namespace, kube):
    from kubernetes.client.exceptions import ApiException

    bad = {"apiVersion": f"{MONITORING}/v1", "kind": "PodMonitor", "metadata": {"name": "bad"},
           "spec": {"selector": {}, "podMetricsEndpoints": [{"port": "metrics", "interval": "30 seconds"}]}}
    with pytest.raises(ApiException) as err:
        kube.custom.create_namespaced_custom_object(MONITORING, "v1", namespace, "podmonitors", bad)
    assert err.value.status == 422 and "interval" in err.value.body, err.value.body
