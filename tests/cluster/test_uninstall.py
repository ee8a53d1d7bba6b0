"""helm uninstall removes everything the release created, including what KubeRay created for it (the Ray
token Secret, owned by the RayCluster, goes with it)."""

from kubernetes import client

from .kube import CHART, expected_pod_counts, wait_until

P5 = CHART / "examples" / "p5-llama3-70b.yaml"


def leftovers(kube, ns):
    core = kube.core
    found = {
        "rayservices": [o["metadata"]["name"] for o in kube.ray("rayservices", ns)],
        "rayclusters": [o["metadata"]["name"] for o in kube.ray("rayclusters", ns)],
        "pods": [p.metadata.name for p in core.list_namespaced_pod(ns).items],
        "services": [s.metadata.name for s in core.list_namespaced_service(ns).items],
        "serviceaccounts": [s.metadata.name for s in core.list_namespaced_service_account(ns).items if s.metadata.name != "default"],
        "configmaps": [c.metadata.name for c in core.list_namespaced_config_map(ns).items if c.metadata.name != "kube-root-ca.crt"],
        "secrets": [s.metadata.name for s in core.list_namespaced_secret(ns).items],
        "networkpolicies": [n.metadata.name for n in client.NetworkingV1Api(core.api_client).list_namespaced_network_policy(ns).items],
        "poddisruptionbudgets": [p.metadata.name for p in client.PolicyV1Api(core.api_client).list_namespaced_pod_disruption_budget(ns).items],
    }
    return {k: v for k, v in found.items() if v}


def test_uninstall_removes_everything(release, kube, helm):
    rel = release("gone").install("-f", str(P5))
    rc = rel.raycluster()
    rel.wait_pods(rc["metadata"]["name"], expected_pod_counts(rel.values))
    present = leftovers(kube, rel.namespace)
    for kind in ("rayservices", "rayclusters", "pods", "services", "serviceaccounts", "secrets", "networkpolicies",
                 "poddisruptionbudgets"):
        assert present.get(kind), f"expected {kind} while installed, found {present}"

    helm("uninstall", rel.name, "-n", rel.namespace, "--wait", "--timeout", "60s")
    wait_until(lambda: not leftovers(kube, rel.namespace), 60, f"namespace {rel.namespace} to be empty after helm uninstall",
               state=lambda: leftovers(kube, rel.namespace))
