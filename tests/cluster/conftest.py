"""Fixtures for the cluster tests: ONE local control plane per session (hack/cluster.sh up), one
namespace per test, helm releases that are uninstalled (and their pods gone) before the next test.

pytest-helm-charts (pinned in pyproject.toml) provides the cluster connection (`kube_cluster`, from
KUBECONFIG), the per-test namespaces (`namespace_factory_function_scope`: created, then deleted and waited
for) and the bounded waits on API objects (`wait_for_objects_condition`). Its release fixtures drive Flux
HelmRelease / Giant Swarm App objects, which need controllers this local cluster does not run, so releases
are installed and upgraded with the helm CLI (`Release` below), as a user would.

Env: RLD_KEEP_CLUSTER=1 leaves the cluster running after the session (the next session reuses it);
RLD_STATE / RLD_PORT_BASE / RLD_CACHE as in hack/cluster.sh.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import pytest

from .kube import CHART, ROOT, Helm, Kube, computed_values, group_pods, manifest_objects, pod_summary, wait_until

CACHE_BIN = os.path.join(os.environ.get("RLD_CACHE", os.path.expanduser("~/.cache/ray-llm-disagg")), "bin")
TIMINGS: dict[str, float] = {}
POD_TIMEOUT = float(os.environ.get("RLD_POD_TIMEOUT_S", "60"))


def tool(name: str) -> str:
    path = shutil.which(name, path=f"{CACHE_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not path:
        pytest.fail(f"{name} not found in {CACHE_BIN} or on PATH: build the toolchain with hack/toolchain.sh")
    return path


def record(label: str, seconds: float) -> None:
    TIMINGS[label] = seconds
    print(f"[timing] {label}: {seconds:.1f}s")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:  # (this hook sees every collected item, not only ours)
        if str(item.path).startswith(here + os.sep):
            item.add_marker(pytest.mark.e2e)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("cluster timings")
        for label, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{seconds:8.1f}s  {label}")
        builds = os.path.join(os.path.dirname(CACHE_BIN), "build-times.tsv")
        if os.path.exists(builds):  # written by hack/toolchain.sh on each (cold) build
            terminalreporter.write_line("last cold builds (hack/toolchain.sh):")
            last = {line.split("\t")[1]: line.rstrip("\n").split("\t") for line in open(builds) if line.count("\t") == 3}
            for when, name, version, took in last.values():
                terminalreporter.write_line(f"{took:>9}  {name} {version} ({when})")


@dataclass
class Cluster:
    kubeconfig: str


@pytest.fixture(scope="package")
def cluster() -> Cluster:
    script = str(ROOT / "hack" / "cluster.sh")
    env = {**os.environ, "PATH": f"{CACHE_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.monotonic()
    up = subprocess.run([script, "up"], capture_output=True, text=True, env=env, timeout=600)
    if up.returncode != 0:
        pytest.fail(f"`hack/cluster.sh up` failed (exit {up.returncode}):\n{up.stderr[-4000:]}", pytrace=False)
    record("cluster up (hack/cluster.sh up, incl. node pools)", time.monotonic() - t0)
    for step, seconds in re.findall(r"^\[[\d:]+\] (\S.*?\S)\s+(\d+\.\d)s$", up.stderr, re.M):
        record(f"  cluster up: {step}", float(seconds))
    kubeconfig = re.search(r'KUBECONFIG="([^"]+)"', subprocess.run([script, "env"], capture_output=True, text=True, env=env).stdout)[1]
    os.environ["KUBECONFIG"] = kubeconfig  # for pytest-helm-charts' kube_cluster fixture and any kubectl
    yield Cluster(kubeconfig)
    if os.environ.get("RLD_KEEP_CLUSTER") != "1":
        down = subprocess.run([script, "down"], capture_output=True, text=True, env=env, timeout=120)
        assert down.returncode == 0, f"`hack/cluster.sh down` failed:\n{down.stderr}"


@pytest.fixture(scope="package")
def kube(cluster) -> Kube:
    return Kube(cluster.kubeconfig)


@pytest.fixture(scope="package")
def helm(cluster) -> Helm:
    return Helm(cluster.kubeconfig, tool("helm"))


@pytest.fixture
def namespace(request, cluster, kube, helm, namespace_factory_function_scope):
    """A fresh namespace per test (pytest-helm-charts' factory deletes it, and waits, after the test).
    Teardown first uninstalls its releases and waits for their pods to go."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{secrets.token_hex(2)}"
    namespace_factory_function_scope(name)
    yield name
    for rel in helm("list", "-n", name, "-q", "-a").stdout.split():
        helm("uninstall", rel, "-n", name, "--wait", "--timeout", "60s", check=False)
    wait_until(lambda: not kube.pods(name), 60, f"pods of namespace {name} to be deleted after the test",
               state=lambda: pod_summary(kube.pods(name)))


@dataclass
class Release:
    """A helm release of the chart under test in the test's namespace."""
    name: str
    namespace: str
    helm: Helm
    kube: Kube
    installed_at: float = 0.0
    rayservice_name: str = ""
    values: dict = field(default_factory=dict)

    def install(self, *args: str, chart: str = str(CHART), verb: str = "install") -> "Release":
        self.installed_at = time.monotonic()
        self.helm(verb, self.name, chart, "-n", self.namespace, *args)
        self.values = computed_values(self.helm, self.name, self.namespace)
        kinds = [o for o in manifest_objects(self.helm, self.name, self.namespace) if o["kind"] == "RayService"]
        assert kinds, f"release {self.name} rendered no RayService"
        self.rayservice_name = kinds[0]["metadata"]["name"]
        return self

    def upgrade(self, *args: str, chart: str = str(CHART)) -> "Release":
        return self.install(*args, chart=chart, verb="upgrade")

    def rayservice(self) -> dict:
        return self.kube.rayservice(self.namespace, self.rayservice_name)

    def raycluster(self, timeout: float = POD_TIMEOUT) -> dict:
        """The single RayCluster the operator created for this release's RayService."""
        def one():
            rcs = self.kube.rayclusters_of(self.namespace, self.rayservice_name)
            return rcs[0] if len(rcs) == 1 else None
        return wait_until(one, timeout, f"the KubeRay operator to create one RayCluster for RayService {self.namespace}/{self.rayservice_name}",
                          state=lambda: [rc["metadata"]["name"] for rc in self.kube.rayclusters_of(self.namespace, self.rayservice_name)])

    def wait_pods(self, cluster: str, expected: dict[str, int], phase: str = "Running", timeout: float = POD_TIMEOUT) -> dict[str, list]:
        """Wait until the RayCluster has exactly `expected` pods per group, all in `phase`."""
        def ready():
            groups = group_pods(self.kube, self.namespace, cluster)
            counts = {g: len(p) for g, p in groups.items()}
            ok = counts == expected and all(p.status.phase == phase for ps in groups.values() for p in ps)
            return groups if ok else None
        return wait_until(ready, timeout, f"pods {expected} of RayCluster {self.namespace}/{cluster} to be {phase}",
                          state=lambda: {g: pod_summary(p) for g, p in group_pods(self.kube, self.namespace, cluster).items()})


@pytest.fixture
def release(namespace, helm, kube):
    """Factory: release("name") -> Release in this test's namespace (not yet installed)."""
    return lambda name="llm": Release(name, namespace, helm, kube)
