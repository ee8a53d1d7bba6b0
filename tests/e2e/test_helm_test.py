"""`helm test`: the chart's test pod runs for real (the runtime image: curl, non-root, read-only root) and passes."""

from __future__ import annotations

from .conftest import Node


def test_helm_test_passes(node: Node) -> None:
    proc = node.helm("test", node.release, "-n", node.namespace, "--timeout", "5m", "--logs", timeout=400)
    assert "Phase:          Succeeded" in proc.stdout or "Phase: Succeeded" in " ".join(proc.stdout.split()), proc.stdout
    assert "ok: tiny is served" in proc.stdout, proc.stdout
