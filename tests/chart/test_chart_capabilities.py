"""The KubeRay presence check (`capabilitiesCheck`).

`helm template`/`helm lint` have no cluster: .Capabilities.APIVersions then holds only Kubernetes
built-ins. A live cluster (helm install/upgrade) also lists its CRD and aggregated groups, which we
simulate with --api-versions. `auto` checks only in the latter case; `always` checks every render;
`never` skips.
"""

from __future__ import annotations

import pytest

from .conftest import EXAMPLES, render, render_error

EKS_WITHOUT_KUBERAY = ["--api-versions", "vpcresources.k8s.aws/v1beta1", "--api-versions", "crd.k8s.amazonaws.com/v1alpha1"]
WITH_KUBERAY = ["--api-versions", "ray.io/v1", "--api-versions", "ray.io/v1/RayService"]


def test_auto_renders_offline():
    """`helm template` without a cluster: the default values render (no CRD groups known)."""
    assert render(values={}).rayservice


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_auto_fails_on_a_cluster_without_kuberay(example):
    stderr = render_error([example], extra=EKS_WITHOUT_KUBERAY)
    assert "capabilitiesCheck" in stderr
    assert "ray.io/v1 RayService" in stderr
    assert "Install KubeRay >=1.5.1" in stderr, "names the supported KubeRay versions"
    assert "kuberay-operator" in stderr, "says how to install the operator"


def test_auto_passes_on_a_cluster_with_kuberay():
    assert render(values={}, extra=EKS_WITHOUT_KUBERAY + WITH_KUBERAY).rayservice


def test_always_fails_offline_and_passes_with_kuberay():
    stderr = render_error(values={"capabilitiesCheck": "always"})
    assert "capabilitiesCheck" in stderr and "KubeRay" in stderr
    assert render(values={"capabilitiesCheck": "always"}, extra=WITH_KUBERAY).rayservice


def test_always_catches_a_bare_cluster_that_auto_cannot_tell_from_offline():
    bare = ["--api-versions", "apps/v1"]  # only built-in groups: looks like `helm template`
    assert render(values={}, extra=bare).rayservice
    assert "capabilitiesCheck" in render_error(values={"capabilitiesCheck": "always"}, extra=bare)


def test_never_skips_the_check():
    assert render(values={"capabilitiesCheck": "never"}, extra=EKS_WITHOUT_KUBERAY).rayservice


def test_only_the_v1_api_counts():
    """A KubeRay too old to serve ray.io/v1 (v1alpha1 only) is rejected too."""
    old = ["--api-versions", "ray.io/v1alpha1", "--api-versions", "ray.io/v1alpha1/RayService"]
    assert "capabilitiesCheck" in render_error(values={}, extra=old)
