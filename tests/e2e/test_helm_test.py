"""`helm test`: the chart's test pod runs for real (the runtime image's curl, non-root, read-only root) on the node,
calls /v1/models through the serve Service's DNS name with the release's API key, and passes only if the model is
listed (its pod is deleted on success, so its log is gone: the phase is the verdict)."""

from __future__ import annotations

import re

from .conftest import Node


def test_helm_test_passes(node: Node) -> None:
    proc = node.helm("test", node.release, "-n", node.namespace, "--timeout", "5m", timeout=400)
    suites = re.findall(r"TEST SUITE:\s+(\S+)\n.*?Phase:\s+(\S+)", proc.stdout, re.S)
    assert (f"{node.release}-ray-llm-disagg-test-models", "Succeeded") in suites, proc.stdout
