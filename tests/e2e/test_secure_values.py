"""ci/secure-values.yaml on real pods: non-root (uid 1000), read-only root filesystem, a sidecar reading Ray's
logs, API keys from the chart's extraObjects Secret, and the serve port only from the `gateway` namespace.
It installs and serves. Runs last: it first uninstalls the example release (one 2-core node holds one)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time

import yaml

from .conftest import ROOT, SCRIPT, Node, record
from .test_network_policy import connects, probe_pod

ORDER = 2  # last: it replaces the example release
NS, RELEASE, GATEWAY, OUTSIDER = "rld-e2e-secure", "secure", "gateway", "rld-e2e-secure-outsider"
CHART = ROOT / "charts" / "ray-llm-disagg"


def test_secure_values_install_and_serve(node: Node) -> None:
    node.helm("uninstall", node.release, "-n", node.namespace, "--wait", "--timeout", "3m", check=False)
    node.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "3m", check=False)  # a failed earlier run's
    secure = yaml.safe_load((CHART / "ci" / "secure-values.yaml").read_text())
    # the sidecar exactly as ci/secure-values.yaml has it, on an image this node has (no registry here)
    sidecars = [{**s, "image": node.image, "imagePullPolicy": "Never"} for s in secure["head"]["sidecars"]]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"head": {"sidecars": sidecars}}, f)
    t0 = time.monotonic()
    up = subprocess.run([str(SCRIPT), "install", RELEASE, NS, "-f", str(CHART / "ci" / "secure-values.yaml"),
                         "-f", str(ROOT / "hack" / "k8s" / "e2e-values.yaml"), "-f", f.name],
                        capture_output=True, text=True, env=node.env, timeout=1800)
    assert up.returncode == 0, f"installing ci/secure-values.yaml failed:\n{up.stderr[-5000:]}"
    record("secure-values release Ready", time.monotonic() - t0)

    groups = node.ray_pods(NS)
    assert sorted(groups) == ["decode", "head", "prefill"]
    for group, pods in groups.items():
        pod = pods[0]["metadata"]["name"]
        container = "ray-head" if group == "head" else "ray-worker"
        uid = node.kubectl("exec", "-n", NS, pod, "-c", container, "--", "id", "-u").strip()
        assert uid == "1000", (group, uid)
        ro = node.kubectl("exec", "-n", NS, pod, "-c", container, "--", "bash", "-c",
                          "touch /opt/x 2>/dev/null && echo WRITABLE || echo READONLY").strip()
        assert ro == "READONLY", (group, ro)
    sidecar = next(c for c in groups["head"][0]["status"]["containerStatuses"] if c["name"] == "log-shipper")
    assert sidecar["ready"], sidecar

    node.kubectl("create", "namespace", GATEWAY, check=False)
    node.kubectl("create", "namespace", OUTSIDER, check=False)
    gw = probe_pod(node, GATEWAY, "client", {"app": "client"})
    out = probe_pod(node, OUTSIDER, "outsider", {"app": "outsider"})
    svc = f"http://{RELEASE}-ray-llm-disagg-serve-svc.{NS}.svc.cluster.local:8000/v1"
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
    reply = node.kubectl("exec", "-n", GATEWAY, gw, "--", "curl", "-sS", "--max-time", "60", "-H",
                         "Authorization: Bearer ci-key-1", "-H", "Content-Type: application/json", "-d", body,
                         f"{svc}/chat/completions", timeout=90)
    assert json.loads(reply)["usage"]["completion_tokens"] > 0, reply
    head = groups["head"][0]
    ip = head["status"]["podIP"]
    assert connects(node, GATEWAY, gw, ip, 8000)
    assert not connects(node, OUTSIDER, out, ip, 8000), "serve.from admits only the gateway namespace"
    for ns in (GATEWAY, OUTSIDER):
        node.kubectl("delete", "namespace", ns, "--wait=false", check=False)
