"""The chart's NetworkPolicy, enforced on a real node (kube-router's firewall): a pod outside the release cannot
reach Ray's GCS (6379) or dashboard (8265); a pod of the release can; the serve port stays open to everyone
(networkPolicy.serve.from is empty in the example) and the app keeps serving."""

from __future__ import annotations

import json

import pytest

from .conftest import Node, wait_until

OUTSIDER_NS = "rld-e2e-outsider"


def probe_pod(node: Node, namespace: str, name: str, labels: dict[str, str]) -> str:
    """A pod of the runtime image that sleeps; tests exec `bash </dev/tcp/...` in it. Returns its name."""
    manifest = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
            "containers": [{"name": "probe", "image": node.image, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}}],
        },
    }
    node.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    node.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150)
    return name


def connects(node: Node, namespace: str, pod: str, ip: str, port: int) -> bool:
    out = node.kubectl("exec", "-n", namespace, pod, "--", "bash", "-c",
                       f"timeout 3 bash -c '</dev/tcp/{ip}/{port}' && echo OPEN || echo CLOSED", timeout=30)
    assert out.strip() in ("OPEN", "CLOSED"), out
    return out.strip() == "OPEN"


@pytest.fixture(scope="module")
def pods(node: Node):
    node.kubectl("create", "namespace", OUTSIDER_NS, check=False)
    outsider = probe_pod(node, OUTSIDER_NS, "outsider", {"app": "outsider"})
    # a pod with the release's selector labels (what the policy admits to Ray's ports)
    insider = probe_pod(node, node.namespace, "insider", {"app.kubernetes.io/name": "ray-llm-disagg",
                                                           "app.kubernetes.io/instance": node.release})
    yield outsider, insider
    node.kubectl("delete", "namespace", OUTSIDER_NS, "--wait=false", check=False)
    node.kubectl("delete", "pod", "-n", node.namespace, insider, "--wait=false", check=False)


def head(node: Node) -> tuple[str, dict[str, int]]:
    pod = node.ray_pods()["head"][0]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    return pod["status"]["podIP"], ports


def test_the_policy_is_rendered(node: Node) -> None:
    policies = node.get("networkpolicy", "-n", node.namespace)["items"]
    assert [p["metadata"]["name"] for p in policies] == [f"{node.release}-ray-llm-disagg-ray"], policies


@pytest.mark.parametrize("port_name", ["gcs-server", "dashboard"])
def test_a_pod_outside_the_release_cannot_reach_rays_ports(node: Node, pods, port_name: str) -> None:
    outsider, insider = pods
    ip, ports = head(node)
    # the positive control first: the port is open, to a pod of the release
    assert wait_until(lambda: connects(node, node.namespace, insider, ip, ports[port_name]), 30,
                      f"the release's pod to reach {port_name} {ip}:{ports[port_name]}")
    assert not connects(node, OUTSIDER_NS, outsider, ip, ports[port_name]), \
        f"a pod in {OUTSIDER_NS} reached {port_name} {ip}:{ports[port_name]}: the NetworkPolicy is not enforced"


def test_the_serve_port_is_open_to_everyone_by_default_and_the_app_serves(node: Node, pods) -> None:
    outsider, _ = pods
    ip, ports = head(node)
    assert connects(node, OUTSIDER_NS, outsider, ip, ports["serve"])
    url = f"http://{node.release}-ray-llm-disagg-serve-svc.{node.namespace}.svc.cluster.local:{ports['serve']}/v1/models"
    # from the outsider pod, through CoreDNS and kube-proxy (the Service's ClusterIP), with the key
    out = node.kubectl("exec", "-n", OUTSIDER_NS, outsider, "--", "curl", "-sS", "--max-time", "20",
                       "-H", f"Authorization: Bearer {node.api_key}", url, timeout=40)
    assert '"tiny"' in out, out
