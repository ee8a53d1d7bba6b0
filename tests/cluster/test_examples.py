"""Every example values file installs on the real API server + KubeRay operator + scheduler, and each
pod lands on a node of its own pool with its GPU/EFA/hugepages requests."""

import time

import pytest
from kubernetes.utils import parse_quantity

from .conftest import record
from .kube import CHART, POOL_LABEL, expected_groups, expected_pod_counts, limits

EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))


def efa_devices(values: dict, role: str, node_labels: dict) -> int:
    """EFA devices per pod: the role's efaDevicesPerHost, else the instance type's share for gpusPerHost GPUs
    (the instance type of the node the pod landed on, from the chart's instanceTypes table)."""
    v = values[role]
    if v.get("efaDevicesPerHost") is not None:
        return v["efaDevicesPerHost"]
    t = values["instanceTypes"][node_labels["node.kubernetes.io/instance-type"]]
    return max(1, t["efa"] * v["gpusPerHost"] // t["gpus"])


def expected_pool(role: str, values: dict) -> str:
    """Head on the cpu pool; on GPU, each role on its own pool; CPU-only workers on the cpu pool."""
    if role == "head" or values["accelerator"] != "gpu":
        return "cpu"
    return role


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_installs_and_schedules_on_its_pools(example, release, kube):
    rel = release("llm").install("-f", str(example))
    values = rel.values

    rs = rel.rayservice()
    assert rs["metadata"]["name"] == rel.rayservice_name
    rc = rel.raycluster()
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    want = expected_groups(values)
    assert set(groups) == set(want), f"worker groups of RayCluster {rc['metadata']['name']}: {sorted(groups)}, expected {sorted(want)}"
    for role, g in want.items():
        assert groups[role].get("numOfHosts", 1) == g["hosts"], f"{role}: numOfHosts {groups[role].get('numOfHosts', 1)} != TPxPP/gpusPerHost {g['hosts']}"

    counts = expected_pod_counts(values)
    pods = rel.wait_pods(rc["metadata"]["name"], counts)
    record(f"helm install -> {sum(counts.values())} pods Running ({example.stem})", time.monotonic() - rel.installed_at)

    for role, role_pods in pods.items():
        for pod in role_pods:
            node = kube.node(pod.spec.node_name)
            labels = node.metadata.labels
            where = f"{role} pod {pod.metadata.name} on node {node.metadata.name}"
            assert labels.get(POOL_LABEL) == expected_pool(role, values), f"{where} is in pool {labels.get(POOL_LABEL)}, expected {expected_pool(role, values)}"
            for key, value in (pod.spec.node_selector or {}).items():
                assert labels.get(key) == value, f"{where}: nodeSelector {key}={value}, node has {labels.get(key)}"
            if role == "head":
                continue
            lim = limits(pod)
            if values["accelerator"] == "gpu":
                assert lim.get("nvidia.com/gpu") == str(values[role]["gpusPerHost"]), f"{where}: limits {lim}"
                assert labels.get("nvidia.com/gpu.present") == "true", where
            else:
                assert "nvidia.com/gpu" not in lim, f"{where}: CPU-only pod requests GPUs: {lim}"
            if values["efa"]["enabled"]:
                assert lim.get("vpc.amazonaws.com/efa") == str(efa_devices(values, role, labels)), f"{where}: limits {lim}"
                assert parse_quantity(lim.get("hugepages-2Mi", "0")) == parse_quantity(values["efa"]["hugepages2Mi"]), f"{where}: limits {lim}"
                assert labels.get("vpc.amazonaws.com/efa.present") == "true", where
            else:
                assert "vpc.amazonaws.com/efa" not in lim, f"{where}: EFA requested with efa.enabled=false: {lim}"

    for role, g in want.items():
        if g["hosts"] > 1:  # a multi-host replica spans distinct hosts
            nodes = [p.spec.node_name for p in pods[role]]
            assert len(set(nodes)) == len(nodes), f"{role} pods share nodes: {nodes}"
