"""Fixtures of the real-node suite: ONE real one-node Kubernetes per session (hack/e2e.sh up: kubelet,
containerd, CNI, CoreDNS, kube-proxy, kube-router, the KubeRay operator) with the chart installed from
examples/cpu-tiny.yaml on the image built from images/ (cpu variant), torn down after the package
(hack/e2e.sh down) unless RLD_KEEP_E2E=1.

Every test here is a real request or a real pod: nothing is faked, nothing is skipped. A cold `up` builds the
image (minutes); its output goes to $RLD_E2E_STATE/../ray-llm-disagg-e2e-up.log and the timings are printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e import host_state

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "e2e.sh"
CACHE_BIN = Path(os.environ.get("RLD_CACHE", os.path.expanduser("~/.cache/ray-llm-disagg"))) / "bin"
UP_TIMEOUT_S = float(os.environ.get("RLD_E2E_UP_TIMEOUT_S", "3600"))
TIMINGS: dict[str, float] = {}


def record(label: str, seconds: float) -> None:
    TIMINGS[label] = seconds
    print(f"[timing] {label}: {seconds:.1f}s")


# `make test` (pytest tests/) runs it; RLD_E2E=0 leaves it out (a machine without root or ~31 GB of disk for the
# image, docs/real-node.md). A named run (`make test-e2e`, `pytest tests/e2e`) always runs it.
IN_DEFAULT_RUN = os.environ.get("RLD_E2E", "1") != "0"


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    mine = [i for i in items if str(i.path).startswith(here + os.sep)]
    named = any(os.path.abspath(str(a).split("::")[0]).startswith(here) for a in config.args)
    if not (IN_DEFAULT_RUN or named):
        config.hook.pytest_deselected(items=mine)
        items[:] = [i for i in items if i not in mine]
        return
    for item in mine:
        item.add_marker(pytest.mark.e2e)
    # modules that disturb the release run after the others (ORDER: pod deletions 1, replacing the release 2),
    # so the others see it as `up` left it; the suite stays one block where it was (one `up`, one `down`)
    ordered = iter(sorted(mine, key=lambda i: getattr(i.module, "ORDER", 0)))
    mine_ids = {id(i) for i in mine}
    items[:] = [next(ordered) if id(i) in mine_ids else i for i in items]


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("real-node timings")
        for label, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{seconds:8.1f}s  {label}")


# run in the head pod: Serve's live replica actors and the IP of the Ray node (pod) each runs on
SERVE_REPLICAS = """
import json, ray
from ray.util.state import list_actors
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
actors = list_actors(filters=[("state", "=", "ALIVE")], limit=10000)
print(json.dumps(sorted([a.class_name, a.actor_id, ips.get(a.node_id, "?")] for a in actors
                        if a.class_name.startswith("ServeReplica:"))))
"""


@dataclass
class Node:
    base_url: str
    api_key: str
    env: dict[str, str]

    @property
    def namespace(self) -> str:
        return self.env["RLD_E2E_NAMESPACE"]

    @property
    def release(self) -> str:
        return self.env["RLD_E2E_RELEASE"]

    @property
    def image(self) -> str:
        return self.env["RLD_E2E_IMAGE"]

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None) -> str:
        proc = subprocess.run(["kubectl", *args], capture_output=True, text=True, env=self.env, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(f"`kubectl {' '.join(args)}` failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc.stdout

    def helm(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run(["helm", *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`helm {' '.join(args)}` failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def serve_replicas(self) -> list[list[str]]:
        """Serve's live replica actors as [class name, actor id, node IP], sorted (Ray's state API, from the head)."""
        head = self.ray_pods()["head"][0]["metadata"]["name"]
        out = self.kubectl("exec", "-n", self.namespace, head, "-c", "ray-head", "--", "python", "-c", SERVE_REPLICAS,
                           timeout=120)
        return json.loads(out.strip().splitlines()[-1])

    def replica_logs(self, group: str, check: bool = True, files: str = "serve/replica_*.log") -> str:
        """The Serve replica logs of the group's first Ray pod (WARNING lines reach the file at once; Serve's
        high-throughput mode buffers INFO lines); `files`: other logs under Ray's log folder instead, e.g.
        "worker-*.out" (vLLM's engine lines)."""
        pod = self.ray_pods()[group][0]["metadata"]["name"]
        return self.kubectl("exec", "-n", self.namespace, pod, "--", "bash", "-c",
                            f"cd /tmp/ray/session_latest/logs && cat {files}", check=check)

    def ray_pods(self, namespace: str | None = None) -> dict[str, list[dict]]:
        """The release's Ray pods by group (head, prefill, decode), from KubeRay's labels."""
        pods = self.get("pods", "-n", namespace or self.namespace, "-l", "ray.io/node-type")["items"]
        out: dict[str, list[dict]] = {}
        for p in pods:
            labels = p["metadata"]["labels"]
            group = "head" if labels["ray.io/node-type"] == "head" else labels.get("ray.io/group", "?")
            out.setdefault(group, []).append(p)
        return out


def wait_until(fn, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="package")
def node() -> Node:
    env = {**os.environ, "PATH": f"{CACHE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = Path(os.environ.get("RLD_E2E_LOG", "/tmp/ray-llm-disagg-e2e-up.log"))
    # The host as it was, to hold `down` to leaving it so (not when a node kept from an earlier run is reused).
    state_dir = Path(os.environ.get("RLD_E2E_STATE", "/tmp/ray-llm-disagg-e2e"))
    host_before = None if (state_dir / "pids" / "kubelet").exists() else host_state.snapshot()
    t0 = time.monotonic()
    with open(log, "w") as err:
        up = subprocess.run([str(SCRIPT), "up"], stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                            timeout=UP_TIMEOUT_S)
    took = time.monotonic() - t0
    text = log.read_text()
    if up.returncode != 0:
        pytest.fail(f"`hack/e2e.sh up` failed (exit {up.returncode}) after {took:.0f}s; log {log}:\n{text[-5000:]}",
                    pytrace=False)
    record("hack/e2e.sh up (total)", took)
    for step, seconds in re.findall(r"^\[[\d:]+\] (\S.*?\S)\s+(\d+\.\d)s$", text, re.M):
        record(f"  up: {step}", float(seconds))
    last = up.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"READY (http://127\.0\.0\.1:\d+/v1) (\S+)", last)
    assert m, f"the last stdout line of `hack/e2e.sh up` is not `READY <base_url> <api_key>`: {last!r}"
    exports = subprocess.run([str(SCRIPT), "env"], capture_output=True, text=True, env=env, check=True).stdout
    for k, v in re.findall(r'(\w+)="?([^"\s]*)"?', exports.replace("export ", " ")):
        env[k] = v.replace("$PATH", env["PATH"]) if k == "PATH" else v
    assert shutil.which("kubectl", path=env["PATH"]), "kubectl not on the PATH hack/e2e.sh env prints"
    yield Node(base_url=m.group(1), api_key=m.group(2), env=env)
    if os.environ.get("RLD_KEEP_E2E") != "1":
        t0 = time.monotonic()
        down = subprocess.run([str(SCRIPT), "down"], capture_output=True, text=True, env=env, timeout=600)
        record("hack/e2e.sh down", time.monotonic() - t0)
        assert down.returncode == 0, f"`hack/e2e.sh down` failed:\n{down.stderr[-3000:]}"
        if host_before is not None:
            left = host_state.leftovers(host_before, host_state.snapshot())
            record("hack/e2e.sh down: host state kinds that differ from before up", len(left))
            assert not left, (
                "`hack/e2e.sh down` did not leave the host as it was before `up` (added/removed per kind):\n"
                + json.dumps(left, indent=1)[:6000] + f"\n`down`'s log:\n{down.stderr[-2000:]}")
