"""Chart metadata vs versions.env, the values documentation, the schema itself, and NOTES.txt."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from .conftest import CHART, EXAMPLES, KUBE_VERSION, REPO, chart_defaults, deep_merge, load_values, render, tool, versions_env

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES_DOC = REPO / "hack" / "values-doc.py"


# ------------------------------------------------------------------------------------------------
# versions: one source of truth (versions.env)
# ------------------------------------------------------------------------------------------------

def test_chart_yaml_basics():
    assert CHART_YAML["apiVersion"] == "v2"
    assert CHART_YAML["type"] == "application"
    assert CHART_YAML["kubeVersion"]
    assert CHART_YAML["annotations"]


def test_app_version_and_annotations_match_versions_env():
    env = versions_env()
    ann = CHART_YAML["annotations"]
    assert ann["ray-llm-disagg.io/ray-version"] == env["RAY_VERSION"]
    assert ann["ray-llm-disagg.io/vllm-version"] == env["VLLM_VERSION"]
    assert ann["ray-llm-disagg.io/kuberay-version"] == env["KUBERAY_VERSION"]
    assert CHART_YAML["appVersion"] == f"ray{env['RAY_VERSION']}-vllm{env['VLLM_VERSION']}"
    supported = ann["ray-llm-disagg.io/kuberay-supported"]
    # worker-group labels need KubeRay >= 1.5; Ray token auth (rayAuth.mode: token, the default) needs
    # authOptions, added in 1.5.1: an older CRD would drop it silently
    assert supported == ">=1.5.1"
    assert supported.lstrip(">=") == env["KUBERAY_VERSION"].lstrip("v")


def test_rendered_versions_derive_from_chart_yaml():
    env = versions_env()
    r = render(values={})
    assert r.cluster["rayVersion"] == env["RAY_VERSION"]
    image = r.head["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(":" + CHART_YAML["appVersion"]), "default image tag is appVersion"
    assert r.rayservice["metadata"]["labels"]["app.kubernetes.io/version"] == CHART_YAML["appVersion"]


def test_kube_version_constraint():
    ok = subprocess.run([tool("helm"), "template", "x", str(CHART), "--kube-version", KUBE_VERSION],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    old = subprocess.run([tool("helm"), "template", "x", str(CHART), "--kube-version", "1.27.0"],
                         capture_output=True, text=True, timeout=120)
    assert old.returncode != 0 and "kubeVersion" in old.stderr


def test_artifacthub_images_annotation_matches_defaults():
    images = yaml.safe_load(CHART_YAML["annotations"]["artifacthub.io/images"])
    by_name = {i["name"]: i["image"] for i in images}
    d = chart_defaults()
    assert by_name["ray-llm-disagg"] == f"{d['image']['repository']}:{CHART_YAML['appVersion']}"
    assert by_name["curl"] == f"{d['tests']['image']['repository']}:{d['tests']['image']['tag']}"


# ------------------------------------------------------------------------------------------------
# schema and values documentation
# ------------------------------------------------------------------------------------------------

def test_schema_is_draft07_and_closed():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"].startswith("http://json-schema.org/draft-07/")
    assert SCHEMA["additionalProperties"] is False
    role = SCHEMA["definitions"]["role"]
    assert role["additionalProperties"] is False
    assert SCHEMA["properties"]["prefill"] == SCHEMA["properties"]["decode"] == {"$ref": "#/definitions/role"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_values_and_examples_validate_against_schema(example):
    merged = deep_merge(chart_defaults(), load_values(example))
    jsonschema.Draft7Validator(SCHEMA).validate(merged)
    jsonschema.Draft7Validator(SCHEMA).validate(chart_defaults())


def test_every_values_key_is_documented_and_in_the_schema():
    proc = subprocess.run([sys.executable, str(VALUES_DOC), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_values_doc_renders_a_table():
    proc = subprocess.run([sys.executable, str(VALUES_DOC)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "| Key | Type | Default | Description |"
    keys = {line.split("|")[1].strip().strip("`") for line in lines[2:]}
    for k in ("mode", "model.source", "model.hfTokenSecret.name", "prefill.tensorParallelSize", "decode.gpusPerHost",
              "prefill.efaDevicesPerHost", "kvTransfer.connector", "capabilitiesCheck", "placement.roleLabelKey"):
        assert k in keys, k
    row = next(line for line in lines if line.startswith("| `kvTransfer.connector`"))
    assert "`NixlConnector` \\| `NixlPushConnector`" in row  # type from the schema enum
    assert all(line.count("|") >= 5 for line in lines)


def test_values_doc_check_catches_an_undocumented_key(tmp_path):
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    with open(chart / "values.yaml", "a") as f:
        f.write("undocumentedKey: 1\n")
    proc = subprocess.run([sys.executable, str(VALUES_DOC), "--check", "--chart", str(chart)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "undocumentedKey" in proc.stderr


# ------------------------------------------------------------------------------------------------
# NOTES.txt (helm template does not print it: render a copy of it as a normal template)
# ------------------------------------------------------------------------------------------------

def render_notes(values: dict, release: str = "llm") -> str:
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "ray-llm-disagg"
        shutil.copytree(CHART, chart)
        notes = (chart / "templates" / "NOTES.txt").read_text()
        (chart / "templates" / "NOTES.txt").unlink()
        (chart / "templates" / "_notes.tpl").write_text('{{- define "t.notes" -}}\n' + notes + "\n{{- end -}}\n")
        (chart / "templates" / "notes-rendered.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
            '  notes: {{ include "t.notes" . | toJson }}\n')
        vf = Path(tmp) / "v.yaml"
        vf.write_text(yaml.safe_dump(values))
        proc = subprocess.run([tool("helm"), "template", release, str(chart), "-n", "llm", "-f", str(vf),
                               "--show-only", "templates/notes-rendered.yaml"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["data"]["notes"]


def test_notes_say_how_to_reach_and_call_the_endpoint():
    notes = render_notes(load_values(next(e for e in EXAMPLES if e.name == "p5-llama3-70b.yaml")))
    assert "kubectl -n llm port-forward svc/llm-ray-llm-disagg-serve-svc 8000:8000" in notes
    assert "$BASE_URL/v1/models" in notes
    assert "$BASE_URL/v1/chat/completions" in notes
    assert '"model": "meta-llama/Meta-Llama-3-70B-Instruct"' in notes
    assert "get rayservice llm-ray-llm-disagg" in notes
    assert "prefill: TP 8 x PP 2, 2 pod(s) per replica" in notes
    assert "NixlPushConnector over LIBFABRIC" in notes
    assert "helm test llm" in notes


def test_notes_with_ingress():
    notes = render_notes({"ingress": {"enabled": True, "host": "llm.example.com"}})
    assert "get ingress llm-ray-llm-disagg" in notes
    assert "BASE_URL=http://llm.example.com" in notes
    assert "port-forward svc/llm-ray-llm-disagg-serve-svc" not in notes
    assert "the Ingress routes only: /v1 (Prefix), /health (Exact)" in notes
    assert "exposeSystemPaths" not in notes
    notes = render_notes({"ingress": {"enabled": True, "exposeSystemPaths": True, "paths": [{"path": "/"}]}})
    assert "the Ingress routes only: / (Prefix)" in notes
    assert "WARNING: ingress.exposeSystemPaths is on" in notes


def test_chart_readme_values_table_is_current():
    proc = subprocess.run([sys.executable, str(VALUES_DOC)], capture_output=True, text=True, timeout=60)
    readme = (CHART / "README.md").read_text()
    start, end = "<!-- values-table:start -->", "<!-- values-table:end -->"
    block = readme[readme.index(start) + len(start): readme.index(end)].strip()
    assert block == proc.stdout.strip(), "stale: run hack/values-doc.py --write charts/ray-llm-disagg/README.md"


# ------------------------------------------------------------------------------------------------
# packaging: license, icon, maintainers, kubeVersion, umbrella charts
# ------------------------------------------------------------------------------------------------

def test_license_icon_and_maintainer():
    lic = (REPO / "LICENSE").read_text()
    assert lic.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in lic
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'license = { text = "Apache-2.0" }' in pyproject
    assert CHART_YAML["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    icon = CHART_YAML["icon"]
    assert icon.startswith("https://") and icon.endswith("/charts/ray-llm-disagg/icon.svg")
    svg = (CHART / "icon.svg").read_text()
    assert svg.startswith("<svg") and "viewBox" in svg
    (m,) = CHART_YAML["maintainers"]
    assert m["name"] and m["url"].startswith("https://github.com/") and m["url"].endswith("/issues")


@pytest.mark.parametrize(("kube", "ok"), [("1.27.9", False), ("1.28.0", True), ("1.28.15-eks-1234", True),
                                          ("1.29.3", True), (KUBE_VERSION, True)])
def test_kube_versions_admitted(kube, ok):
    """EKS 1.28/1.29 install: nothing rendered needs a newer API server."""
    proc = subprocess.run([tool("helm"), "template", "x", str(CHART), "--kube-version", kube],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode == 0) == ok, proc.stderr
    if not ok:
        assert "kubeVersion" in proc.stderr


def test_umbrella_condition_enabled_and_aliases(tmp_path):
    """An umbrella chart lists the chart with `condition: <alias>.enabled`: the schema accepts `enabled`,
    the enabled copies render with their own names, the disabled one renders nothing."""
    root = tmp_path / "repo"
    (root / "charts").mkdir(parents=True)
    (root / "charts" / "ray-llm-disagg").symlink_to(CHART)
    umbrella = root / "tests" / "umbrella"
    shutil.copytree(REPO / "tests" / "umbrella", umbrella)
    dep = subprocess.run([tool("helm"), "dependency", "build", str(umbrella)], capture_output=True, text=True, timeout=120)
    assert dep.returncode == 0, dep.stderr
    proc = subprocess.run([tool("helm"), "template", "models", str(umbrella), "-n", "llm", "--kube-version", KUBE_VERSION],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    names = {d["metadata"]["labels"]["app.kubernetes.io/name"] for d in docs}
    assert names == {"llama", "qwen"}
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "RayService"} == {"models-llama", "models-qwen"}
    values = yaml.safe_load((REPO / "tests" / "umbrella" / "values.yaml").read_text())
    assert values["llama"]["enabled"] is True and values["mistral"]["enabled"] is False
