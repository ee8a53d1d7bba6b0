"""Helpers for the cluster tests: bounded waits, helm CLI, KubeRay objects, scheduling facts.

Everything talks to the real local control plane started by hack/cluster.sh (kube-apiserver,
kube-scheduler, kube-controller-manager, kwok nodes, KubeRay operator).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ray-llm-disagg"
RAY_GROUP, RAY_VERSION = "ray.io", "v1"
POOL_LABEL = "karpenter.sh/nodepool"  # the role a node pool serves: cpu, prefill, decode


def wait_until(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.3, state: Callable[[], Any] | None = None):
    """Poll fn until it returns something truthy; fail naming `what` (and the last observed state) on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = state() if state else value
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last state: {detail}")
        time.sleep(interval)


def still_true_for(fn: Callable[[], bool], seconds: float, what: str, interval: float = 0.5) -> None:
    """Assert fn stays true for `seconds` (a bounded check that something does NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert fn(), f"{what} stopped holding within {seconds:.0f}s"
        time.sleep(interval)


@dataclass
class Helm:
    kubeconfig: str
    binary: str = "helm"

    def __call__(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        cmd = [self.binary, "--kubeconfig", self.kubeconfig, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc


@dataclass
class Kube:
    kubeconfig: str
    core: client.CoreV1Api = field(init=False)
    custom: client.CustomObjectsApi = field(init=False)
    _nodes: dict = field(default_factory=dict, init=False)

    def __post_init__(self):
        api = config.new_client_from_config(config_file=self.kubeconfig)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    # --- KubeRay objects -------------------------------------------------------------------
    def ray(self, plural: str, namespace: str) -> list[dict]:
        return self.custom.list_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, plural)["items"]

    def rayservice(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, "rayservices", name)

    def rayclusters_of(self, namespace: str, rayservice: str) -> list[dict]:
        return [rc for rc in self.ray("rayclusters", namespace)
                if any(o["kind"] == "RayService" and o["name"] == rayservice for o in rc["metadata"].get("ownerReferences", []))]

    # --- pods and nodes ----------------------------------------------------------------------
    def pods(self, namespace: str, selector: str = "") -> list:
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def node(self, name: str):
        if name not in self._nodes:
            self._nodes[name] = self.core.read_node(name)
        return self._nodes[name]

    def nodes(self, selector: dict[str, str]) -> list:
        return self.core.list_node(label_selector=",".join(f"{k}={v}" for k, v in selector.items())).items


def group_pods(kube: Kube, namespace: str, cluster: str) -> dict[str, list]:
    """Pods of a RayCluster by Ray group: 'head' and each worker groupName."""
    out: dict[str, list] = {}
    for pod in kube.pods(namespace, f"ray.io/cluster={cluster}"):
        labels = pod.metadata.labels
        key = "head" if labels.get("ray.io/node-type") == "head" else labels.get("ray.io/group", "?")
        out.setdefault(key, []).append(pod)
    return out


def pod_summary(pods) -> str:
    """name=Phase@node per pod, with the scheduler's reason for unscheduled pods."""
    def one(p):
        why = scheduling_message(p)
        return f"{p.metadata.name}={p.status.phase}@{p.spec.node_name or '-'}" + (f" ({why})" if why else "")
    return ", ".join(one(p) for p in pods) or "no pods"


def scheduling_message(pod) -> str:
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"{cond.reason}: {cond.message}"
    return ""


def limits(pod) -> dict[str, str]:
    """Summed resource limits of the pod's containers, as the API returned them (strings)."""
    total: dict[str, str] = {}
    for c in pod.spec.containers:
        for k, v in ((c.resources and c.resources.limits) or {}).items():
            total[k] = v if k not in total else str(int(total[k]) + int(v))
    return total


def manifest_objects(helm: Helm, release: str, namespace: str) -> list[dict]:
    import yaml
    out = helm("get", "manifest", release, "-n", namespace).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def computed_values(helm: Helm, release: str, namespace: str) -> dict:
    return json.loads(helm("get", "values", release, "-n", namespace, "--all", "-o", "json").stdout)


def env_with_kubeconfig(kubeconfig: str) -> dict:
    return {**os.environ, "KUBECONFIG": kubeconfig}


def expected_groups(values: dict) -> dict[str, dict[str, int]]:
    """Worker groups the chart's values ask for (the documented contract, computed independently of the
    templates): role -> {replicas, hosts}; hosts (pods per replica) = TP x PP / gpusPerHost on GPU, 1 on CPU."""
    roles = ["decode"] if values["mode"] == "aggregated" else ["prefill", "decode"]
    out = {}
    for role in roles:
        v = values[role]
        replicas = v["autoscaling"]["minReplicas"] if v["autoscaling"]["enabled"] else v["replicas"]
        hosts = 1
        if values["accelerator"] == "gpu":
            hosts = v["tensorParallelSize"] * v["pipelineParallelSize"] // max(1, v["gpusPerHost"])
        out[role] = {"replicas": replicas, "hosts": hosts}
    return out


def expected_pod_counts(values: dict) -> dict[str, int]:
    counts = {"head": 1}
    counts.update({role: g["replicas"] * g["hosts"] for role, g in expected_groups(values).items() if g["replicas"] * g["hosts"]})
    return counts
