"""`ct install` (chart-testing, root ct.yaml) against the local cluster: installs the chart once per
ci/*-values.yaml, runs `helm test` (the test hook pod completes through the KWOK stage
hack/k8s/kwok/pod-helm-test-complete.yaml), uninstalls."""

import os
import re
import subprocess
import time

from .conftest import CACHE_BIN, record, tool
from .kube import ROOT


def test_ct_install(cluster):
    ct = tool("ct")
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "PATH": f"{CACHE_BIN}{os.pathsep}{os.environ['PATH']}"}
    exports = subprocess.run([str(ROOT / "hack" / "toolchain.sh"), "env"], capture_output=True, text=True, check=True).stdout
    env["CT_CONFIG_DIR"] = re.search(r'^export CT_CONFIG_DIR="([^"]+)"', exports, re.M)[1]  # ct's lintconf/chart_schema
    t0 = time.monotonic()
    proc = subprocess.run([ct, "install", "--config", str(ROOT / "ct.yaml"), "--helm-extra-args", "--timeout 120s"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    record("ct install (all ci/*-values.yaml, with helm test)", time.monotonic() - t0)
    assert proc.returncode == 0, f"ct install failed (exit {proc.returncode}):\n{out[-6000:]}"
    assert "All charts installed successfully" in out, out[-3000:]
    ci_files = sorted((ROOT / "charts" / "ray-llm-disagg" / "ci").glob("*-values.yaml"))
    # per values file: the install, then its helm test suite and phase
    summary = "\n".join(re.findall(r"^(?:Installing chart with values file.*|TEST SUITE:.*|Phase:.*)$", out, re.M))
    for ci in ci_files:
        assert f'values file "charts/ray-llm-disagg/ci/{ci.name}"' in out, f"{ci.name} not installed:\n{summary}"
    suites = re.findall(r"^TEST SUITE:\s+(\S+)$(?:\n.*){0,3}?\nPhase:\s+(\w+)$", out, re.M)
    assert {phase for _, phase in suites} == {"Succeeded"}, summary
    assert len({name for name, _ in suites}) >= len(ci_files), f"expected a Succeeded helm test per ci values file ({len(ci_files)}):\n{summary}"
