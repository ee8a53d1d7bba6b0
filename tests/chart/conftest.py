"""Shared fixtures for the chart tests: locate the cached tools, render the chart, parse the output.

Tools come from ``$RLD_CACHE/bin`` (default ``~/.cache/ray-llm-disagg/bin``), built by
``hack/toolchain.sh``; offline kubeconform schemas from ``$RLD_CACHE/schemas``. Every render goes
through :func:`render` (success expected) or :func:`render_error` (failure expected), which run
``helm template`` with values given as Python dicts (written to a temp file, so types are exact)
and return parsed YAML objects keyed by kind.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ray-llm-disagg"
EXAMPLES_DIR = CHART / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))

RLD_CACHE = Path(os.environ.get("RLD_CACHE", "~/.cache/ray-llm-disagg")).expanduser()
BIN = RLD_CACHE / "bin"
SCHEMAS = RLD_CACHE / "schemas"

if str(REPO) not in sys.path:  # serve_app.config (pydantic only) validates rendered serve args
    sys.path.insert(0, str(REPO))


def versions_env() -> dict[str, str]:
    out = {}
    for line in (REPO / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


KUBE_VERSION = versions_env()["K8S_VERSION"].lstrip("v")


def tool(name: str) -> str:
    """Path of a cached tool; fails (not skips) with the command that builds it."""
    path = BIN / name
    if not (path.exists() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} not found: build the toolchain with `hack/toolchain.sh` (RLD_CACHE={RLD_CACHE})")
    return str(path)


def schema_dir(prefix: str) -> Path:
    """Offline JSON schema dir, e.g. schema_dir('kuberay') -> $RLD_CACHE/schemas/kuberay-<KUBERAY_VERSION>."""
    want = {"kuberay": versions_env()["KUBERAY_VERSION"], "k8s": versions_env()["K8S_VERSION"],
            "prometheus-operator": versions_env()["PROMETHEUS_OPERATOR_VERSION"]}[prefix]
    path = SCHEMAS / f"{prefix}-{want}"
    if not path.is_dir():
        pytest.fail(f"{path} not found: build the schemas with `hack/toolchain.sh --only pytools,schemas,promop-schemas`")
    return path


# ------------------------------------------------------------------------------------------------
# Values
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _chart_defaults() -> str:
    return json.dumps(yaml.safe_load((CHART / "values.yaml").read_text()))


def chart_defaults() -> dict:
    return json.loads(_chart_defaults())


def deep_merge(base: dict, override: dict) -> dict:
    """Helm's coalescing for plain maps: override wins, maps merge, null deletes."""
    out = copy.deepcopy(base)
    for k, v in (override or {}).items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_values(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def effective_values(*layers: dict) -> dict:
    """values.yaml with each layer merged on top, as helm computes .Values."""
    vals = chart_defaults()
    for layer in layers:
        vals = deep_merge(vals, layer)
    return vals


# ------------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------------

@dataclass
class Rendered:
    """The parsed output of one `helm template` run."""

    docs: list[dict]
    values: dict  # effective .Values (chart defaults + layers), for computing expectations
    release: str
    stdout: str = field(repr=False)

    @property
    def by_kind(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for d in self.docs:
            out.setdefault(d["kind"], []).append(d)
        return out

    def one(self, kind: str) -> dict:
        items = self.by_kind.get(kind, [])
        assert len(items) == 1, f"expected exactly one {kind}, got {len(items)}"
        return items[0]

    def all(self, kind: str) -> list[dict]:
        return self.by_kind.get(kind, [])

    @property
    def rayservice(self) -> dict:
        return self.one("RayService")

    @property
    def cluster(self) -> dict:
        return self.rayservice["spec"]["rayClusterConfig"]

    @property
    def head(self) -> dict:
        return self.cluster["headGroupSpec"]

    @property
    def groups(self) -> dict[str, dict]:
        """Worker groups by groupName (order checked separately)."""
        return {g["groupName"]: g for g in self.cluster.get("workerGroupSpecs", [])}

    @property
    def serve_config(self) -> dict:
        raw = self.rayservice["spec"]["serveConfigV2"]
        assert isinstance(raw, str), "serveConfigV2 must be a YAML string"
        (doc,) = load_all_strict(raw)
        return doc

    @property
    def app(self) -> dict:
        apps = self.serve_config["applications"]
        assert len(apps) == 1
        return apps[0]

    @property
    def raw_args(self) -> dict:
        """`applications[].args` as rendered: everything but the live fields."""
        return self.app["args"]

    @property
    def user_config(self) -> dict:
        """The live fields (serve_app.config.LIVE_FIELDS), which every deployment gets as its user_config."""
        configs = [d.get("user_config") for d in self.app.get("deployments", [])]
        assert configs, "serveConfigV2 has no deployments (the live fields' user_config)"
        assert all(c == configs[0] for c in configs), f"the deployments' user_configs differ: {configs}"
        return configs[0]

    @property
    def args(self) -> dict:
        """The app's effective args: `args` with the live fields the deployments carry as user_config."""
        return {**self.raw_args, **self.user_config}


class RenderError(AssertionError):
    def __init__(self, cmd: list[str], rc: int, stdout: str, stderr: str):
        super().__init__(f"`{' '.join(cmd)}` failed (rc={rc}):\n{stderr}")
        self.rc, self.stdout, self.stderr = rc, stdout, stderr


def _write_layers(tmp: Path, layers: Iterable[dict]) -> list[str]:
    args = []
    for i, layer in enumerate(layers):
        p = tmp / f"values-{i}.yaml"
        p.write_text(yaml.safe_dump(layer, sort_keys=False))
        args += ["-f", str(p)]
    return args


def _helm_template(layers: tuple[str, ...], release: str, extra: tuple[str, ...]) -> tuple[list[str], int, str, str]:
    with tempfile.TemporaryDirectory(prefix="rld-chart-") as tmp:
        files = _write_layers(Path(tmp), [json.loads(layer) for layer in layers])
        cmd = [tool("helm"), "template", release, str(CHART), "--namespace", "llm",
               "--kube-version", KUBE_VERSION, *files, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return cmd, proc.returncode, proc.stdout, proc.stderr


@functools.lru_cache(maxsize=512)
def _render_cached(layers: tuple[str, ...], release: str, extra: tuple[str, ...]):
    return _helm_template(layers, release, extra)


def _layers(values_files: Iterable[Path], values: Optional[dict | list[dict]]) -> list[dict]:
    layers = [load_values(Path(f)) for f in values_files]
    if isinstance(values, dict):
        layers.append(values)
    elif values:
        layers.extend(values)
    return layers


class StrictLoader(yaml.SafeLoader):
    """A YAML loader that fails on a duplicate mapping key (plain safe_load keeps the last one silently,
    which hid labels the chart emitted twice)."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        assert key not in seen, f"duplicate key {key!r} at line {key_node.start_mark.line + 1} of the rendered YAML"
        seen.add(key)
    return loader.construct_mapping(node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def load_all_strict(text: str) -> list[dict]:
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d]


def render(values_files: Iterable[Path] = (), values: Optional[dict | list[dict]] = None, *,
           release: str = "llm", extra: Iterable[str] = ()) -> Rendered:
    """helm template the chart with example files and/or dict layers; parsed docs (hooks included).
    Fails on duplicate keys anywhere in the output."""
    layers = _layers(values_files, values)
    key = tuple(json.dumps(layer, sort_keys=True) for layer in layers)
    cmd, rc, out, err = _render_cached(key, release, tuple(extra))
    if rc != 0:
        raise RenderError(cmd, rc, out, err)
    docs = load_all_strict(out)
    return Rendered(docs=docs, values=effective_values(*layers), release=release, stdout=out)


def render_error(values_files: Iterable[Path] = (), values: Optional[dict | list[dict]] = None, *,
                 release: str = "llm", extra: Iterable[str] = ()) -> str:
    """helm template expected to FAIL; returns stderr."""
    layers = _layers(values_files, values)
    key = tuple(json.dumps(layer, sort_keys=True) for layer in layers)
    cmd, rc, out, err = _render_cached(key, release, tuple(extra))
    assert rc != 0, f"expected `{' '.join(cmd)}` to fail, but it rendered:\n{out[:2000]}"
    return err


def _kubeconform_cmd() -> list[str]:
    """kubeconform, offline: KubeRay and Prometheus Operator CRD schemas + Kubernetes core schemas from the cache, -strict,
    never the default (remote) schema location."""
    k8s, kuberay, promop = schema_dir("k8s"), schema_dir("kuberay"), schema_dir("prometheus-operator")
    return [tool("kubeconform"), "-strict", "-summary", "-output", "json",
            "-kubernetes-version", KUBE_VERSION,
            "-schema-location", f"{k8s}/{{{{.ResourceKind}}}}{{{{.KindSuffix}}}}.json",
            "-schema-location", f"{kuberay}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json",
            "-schema-location", f"{promop}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json"]


def kubeconform(manifests: str) -> subprocess.CompletedProcess:
    """Validate one stream of manifests."""
    return subprocess.run(_kubeconform_cmd() + ["-"], input=manifests, capture_output=True, text=True, timeout=120)


def kubeconform_many(manifests: dict[str, str]) -> dict[str, list[dict]]:
    """Validate several renders in ONE kubeconform run (schemas load once); per-resource results by name."""
    with tempfile.TemporaryDirectory(prefix="rld-kc-") as tmp:
        paths = {}
        for i, (name, text) in enumerate(manifests.items()):
            paths[str(Path(tmp) / f"{i:03d}.yaml")] = name
            Path(tmp, f"{i:03d}.yaml").write_text(text)
        proc = subprocess.run(_kubeconform_cmd() + ["-verbose", *paths], capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)
    out: dict[str, list[dict]] = {name: [] for name in manifests}
    for res in report["resources"]:
        out[paths[res["filename"]]].append(res)
    return out


# ------------------------------------------------------------------------------------------------
# Small accessors used by several test modules
# ------------------------------------------------------------------------------------------------

def container(pod_template: dict) -> dict:
    """The pod's main container: the Ray container comes first (KubeRay uses containers[0]); sidecars follow."""
    cs = pod_template["spec"]["containers"]
    assert cs, "a pod without containers"
    return cs[0]


def env_of(c: dict) -> dict[str, dict]:
    """Container env by name (each entry as rendered)."""
    out = {}
    for e in c.get("env") or []:
        assert e["name"] not in out, f"duplicate env {e['name']}"
        out[e["name"]] = e
    return out


def ports_of(c: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports") or []}


def key_named(stderr: str, key: str) -> bool:
    """True if stderr names `key` (dotted, e.g. decode.pipelineParallelSize), either as the template
    checks write it or as helm's JSON-schema errors do (`/decode/pipelineParallelSize`, or the parent path
    plus the offending property name for additionalProperties). Map keys may contain dots themselves
    (labels such as app.kubernetes.io/name): any split of the dotted key into a JSON path counts."""
    if key in stderr:
        return True
    parts = key.split(".")
    for k in range(1, len(parts) + 1):
        segs = parts[:k] + ([".".join(parts[k:])] if parts[k:] else [])
        segs = [s.replace("~", "~0").replace("/", "~1") for s in segs]  # JSON pointer escapes
        if f"'/{'/'.join(segs)}'" in stderr:
            return True
        parent = "/" + "/".join(segs[:-1]) if len(segs) > 1 else ""
        if f"'{parent}'" in stderr and f"'{segs[-1]}'" in stderr:
            return True
    return False


@pytest.fixture(scope="session")
def tools_on_path() -> dict[str, str]:
    """Environment for tools that call other tools (ct -> helm, yamllint, yamale, git)."""
    for t in ("helm", "ct", "yamllint", "yamale"):
        tool(t)
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    assert shutil.which("git", path=env["PATH"]), "git is needed by ct"
    return env
