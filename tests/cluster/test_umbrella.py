"""An umbrella chart with ray-llm-disagg twice (aliases llama and qwen: two models) installs cleanly:
unique names, values per alias, `global` values reaching both copies, every pod on its pool."""

import os
import shutil
import time

import pytest
import yaml

from .conftest import record
from .kube import POOL_LABEL, ROOT, computed_values, expected_pod_counts, manifest_objects

UMBRELLA = ROOT / "tests" / "umbrella"
ALIASES = ("llama", "qwen")


@pytest.fixture
def umbrella_chart(tmp_path, helm):
    """tests/umbrella with its dependencies built, in a temp copy (the work tree stays clean).
    The copy keeps the layout so `file://../../charts/ray-llm-disagg` resolves."""
    root = tmp_path / "repo"
    (root / "charts").mkdir(parents=True)
    os.symlink(ROOT / "charts" / "ray-llm-disagg", root / "charts" / "ray-llm-disagg")
    chart = root / "tests" / "umbrella"
    shutil.copytree(UMBRELLA, chart)
    helm("dependency", "update", str(chart))
    return chart


def test_umbrella_two_models_install_with_unique_names(umbrella_chart, release, kube):
    values = yaml.safe_load((UMBRELLA / "values.yaml").read_text())
    rel = release("models")
    rel.installed_at = time.monotonic()
    rel.helm("install", rel.name, str(umbrella_chart), "-n", rel.namespace)

    computed = computed_values(rel.helm, rel.name, rel.namespace)
    objects = manifest_objects(rel.helm, rel.name, rel.namespace)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), f"name collision in the umbrella release: {sorted(keys)}"
    rayservices = {o["metadata"]["labels"]["app.kubernetes.io/name"]: o["metadata"]["name"] for o in objects if o["kind"] == "RayService"}
    assert sorted(rayservices) == sorted(ALIASES), f"RayServices by chart name: {rayservices} (mistral is off: condition mistral.enabled)"
    assert not [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/name") == "mistral"]
    assert len(set(rayservices.values())) == 2

    global_labels = values["global"]["commonLabels"]
    pull_secrets = values["global"]["imagePullSecrets"]
    for alias, rs_name in rayservices.items():
        rs = kube.rayservice(rel.namespace, rs_name)
        assert values[alias]["model"]["id"] in rs["spec"]["serveConfigV2"], f"{alias}: model id not in its serve config"
        for k, v in global_labels.items():
            assert rs["metadata"]["labels"].get(k) == v, f"{alias}: global.commonLabels {k}={v} missing on RayService {rs_name}"

        rel.rayservice_name = rs_name
        rc = rel.raycluster()
        counts = expected_pod_counts(computed[alias])  # the subchart's defaults coalesced with the alias key
        pods = rel.wait_pods(rc["metadata"]["name"], counts)
        for role, role_pods in pods.items():
            for pod in role_pods:
                pool = kube.node(pod.spec.node_name).metadata.labels.get(POOL_LABEL)
                assert pool == ("cpu" if role == "head" else role), f"{alias} {role} pod {pod.metadata.name} on pool {pool}"
                secrets = [s.name for s in pod.spec.image_pull_secrets or []]
                assert all(s["name"] in secrets for s in pull_secrets), f"{alias} pod {pod.metadata.name}: imagePullSecrets {secrets}, global asks {pull_secrets}"
    record("helm install umbrella (2 models) -> all pods Running", time.monotonic() - rel.installed_at)
