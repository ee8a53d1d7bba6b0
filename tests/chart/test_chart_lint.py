"""helm lint --strict on every example and ct variant; ct lint with the repository's ct.yaml."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import BIN, CHART, CI_VALUES, EXAMPLES, KUBE_VERSION, REPO, tool


@pytest.mark.parametrize("values", EXAMPLES + CI_VALUES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_helm_lint_strict(values: Path):
    proc = subprocess.run([tool("helm"), "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "-f", str(values)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_helm_lint_strict_rejects_schema_violations():
    """lint (hence ct lint) enforces values.schema.json, cross-field rules included."""
    for flag, path in (("decode.tensorParallelSize=0", "/decode/tensorParallelSize"),
                       ("decode.pipelineParallelSize=2", "/decode/pipelineParallelSize"),  # an if/then rule
                       ("serve.port=8265", "/serve/port")):
        proc = subprocess.run([tool("helm"), "lint", "--strict", str(CHART), "--set", flag],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0, flag
        assert path in proc.stdout + proc.stderr


def test_helm_lint_reports_template_checks_as_info_only():
    """Helm's lint mode turns `fail` into an [INFO] line (so charts with required values lint): the template
    checks show in lint output but only `helm template/install` fails on them (test_chart_invalid.py).
    This pins the Helm behaviour the chart README documents; the day lint fails on them, update the docs."""
    proc = subprocess.run([tool("helm"), "lint", "--strict", str(CHART), "--set", "prefill.autoscaling.enabled=true",
                           "--set", "prefill.autoscaling.minReplicas=3", "--set", "prefill.autoscaling.maxReplicas=1"],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert "[INFO]" in out and "prefill.autoscaling.minReplicas" in out
    assert proc.returncode == 0, out


def test_ct_lint(tools_on_path):
    """chart-testing lint (yamllint, yamale Chart.yaml schema, helm lint per ci/ variant), offline."""
    ct = Path(tool("ct"))
    etc = ct.resolve().parent / "etc"  # hack/toolchain.sh copies ct's lintconf.yaml and chart_schema.yaml here
    assert (etc / "lintconf.yaml").is_file() and (etc / "chart_schema.yaml").is_file(), etc
    git = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True, text=True)
    assert git.stdout.strip() == "true", "ct must run inside a git work tree"
    proc = subprocess.run(
        [str(ct), "lint", "--config", str(REPO / "ct.yaml"),
         "--lint-conf", str(etc / "lintconf.yaml"), "--chart-yaml-schema", str(etc / "chart_schema.yaml")],
        cwd=REPO, env=tools_on_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "All charts linted successfully" in out
    for ci in CI_VALUES:  # every ci/ variant was linted
        assert ci.name in out, f"{ci.name} not linted:\n{out}"
    assert str(BIN) in tools_on_path["PATH"]


def test_yamllint_examples_and_ci_values(tools_on_path):
    """ct yamllints Chart.yaml and values.yaml only; hold the example and ci files to the same rules."""
    etc = Path(tool("ct")).resolve().parent / "etc"
    files = [str(p) for p in EXAMPLES + CI_VALUES] + [str(REPO / "ct.yaml")]
    proc = subprocess.run([tool("yamllint"), "-c", str(etc / "lintconf.yaml"), "--strict", *files],
                          env=tools_on_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
