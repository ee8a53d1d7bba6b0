"""One rule set: values -> AppConfig is a plain mirror, and the chart's rules and the app's agree.

- The app-facing part of values.schema.json is generated from serve_app.config.AppConfig
  (hack/values-schema.py); it must be current, and cover every AppConfig field at its camelCase path.
- The chart's rendered args are exactly the values at AppConfig's paths, renamed, plus what the chart
  derives (documented in templates/_appconfig.tpl): checked against an independent Python mirror.
- Every invalid case of test_chart_invalid.py marked `app` is refused by AppConfig too (forward), and every
  way to break AppConfig listed here is refused by the chart (reverse).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import pytest
from pydantic import BaseModel, ValidationError

from serve_app.config import RESERVED_ENGINE_ARGS, AppConfig

from .conftest import CHART, EXAMPLES, REPO, effective_values, load_values, render, render_error
from .expect import accelerator_type, backend, buffer_device, hosts, roles_of
from .test_chart_invalid import INVALID
from .test_chart_render import MATRIX

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
GENERATOR = REPO / "hack" / "values-schema.py"


def generator():
    spec = importlib.util.spec_from_file_location("values_schema", GENERATOR)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


# ------------------------------------------------------------------------------------------------
# the generated schema
# ------------------------------------------------------------------------------------------------

def test_generated_files_are_current():
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _node(schema: dict, node: dict) -> dict:
    """Follow $ref and the generated reason carriers to the rule itself."""
    while True:
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].split("/")[-1]]
        elif "anyOf" in node and str(node["anyOf"][-1].get("const", "")).startswith("rule: "):
            node = node["anyOf"][0]
        else:
            return node


def _walk_model(model: type[BaseModel], node: dict, path: str, seen: list[str]) -> None:
    node = _node(SCHEMA, node)
    assert node.get("additionalProperties") is False, f"{path or 'values'}: unknown keys must be refused (extra=forbid)"
    props = node["properties"]
    for name, info in model.model_fields.items():
        key = camel(name)
        where = f"{path}.{key}".lstrip(".")
        assert key in props, f"AppConfig field {name} has no values key {where} in values.schema.json"
        seen.append(where)
        sub = _node(SCHEMA, props[key])
        tp = info.annotation
        args = [a for a in getattr(tp, "__args__", ()) if a is not type(None)]
        inner = args[0] if len(args) == 1 else tp
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            _walk_model(inner, props[key], where, seen)
            continue
        for meta in info.metadata:  # numeric bounds: the same in both
            for attr, kw in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum")):
                if getattr(meta, attr, None) is not None and kw in sub:
                    assert sub[kw] >= getattr(meta, attr) if kw != "maximum" else sub[kw] <= getattr(meta, attr), where


def test_every_appconfig_field_is_a_values_key_with_the_same_rules():
    seen: list[str] = []
    _walk_model(AppConfig, SCHEMA, "", seen)
    assert {"kvTransfer.allowPrefillTpGreaterThanDecode", "prefill.engineEnv", "frontend.numCpus",
            "placement.frontendLabel", "decode.acceleratorType", "auth.apiKeysFile"} <= set(seen)


def test_reserved_engine_args_come_from_the_app():
    role = _node(SCHEMA, SCHEMA["properties"]["decode"])
    forbidden = {k for k, v in role["properties"]["engineArgs"]["properties"].items() if "const" in v}
    assert forbidden == set(RESERVED_ENGINE_ARGS), "the reserved engine-args table exists once: serve_app.config"
    tpl = (CHART / "templates" / "_generated.tpl").read_text()
    for arg in RESERVED_ENGINE_ARGS:
        assert f'"{arg}"' in tpl


def test_generator_detects_a_new_app_field(monkeypatch):
    """--check must fail the day AppConfig grows a field the chart's schema does not have yet."""
    from pydantic import Field, create_model

    from serve_app import config

    gen = generator()
    schema_now, _ = gen.build()
    Grown = create_model("Grown", __base__=config.AppConfig, new_knob=(int, Field(default=1, ge=0)))
    monkeypatch.setattr(config, "AppConfig", Grown)
    schema_grown, tpl_grown = gen.build()
    assert schema_grown != schema_now
    assert '"newKnob"' in schema_grown and '"new_knob"' in tpl_grown


# ------------------------------------------------------------------------------------------------
# values -> args: a plain mirror plus the documented derivations
# ------------------------------------------------------------------------------------------------

def mirror(model: type[BaseModel], values: dict) -> dict:
    """AppConfig's fields, taken from the values at the same path (camelCase), optional empties left out."""
    out = {}
    for name, info in model.model_fields.items():
        key = camel(name)
        if key not in values:
            continue
        val = values[key]
        args = [a for a in getattr(info.annotation, "__args__", ()) if a is not type(None)]
        inner = args[0] if len(args) == 1 else info.annotation
        optional = not info.is_required() and info.default is None
        if isinstance(inner, type) and issubclass(inner, BaseModel) and isinstance(val, dict):
            out[name] = mirror(inner, val)
        elif not (optional and val in ("", {}, None)):
            out[name] = copy.deepcopy(val)
    return out


def frontend_per_node(v: dict) -> int | None:
    """frontend.maxReplicasPerNode as given; null: 1 when the Ray pods that can take a frontend replica (workers
    up to their autoscaling max, the head when a replica needs no CPU) hold frontend.replicas one per pod."""
    fe = v["frontend"]
    if fe.get("maxReplicasPerNode") is not None:
        return int(fe["maxReplicasPerNode"])
    if fe["directStreaming"]:
        return None
    pods = sum((v[r]["autoscaling"]["maxReplicas"] if v[r]["autoscaling"]["enabled"] else v[r]["replicas"]) * hosts(v, r)
               for r in roles_of(v))
    return 1 if fe["replicas"] <= pods + (float(fe["numCpus"]) == 0) else None


def expected_args(v: dict) -> dict:
    args = mirror(AppConfig, v)
    if v["mode"] == "aggregated":
        for k in ("prefill", "kv_transfer", "remote_prefill_min_tokens"):
            args.pop(k, None)
    else:
        args["kv_transfer"].update(backend=backend(v), buffer_device=buffer_device(v))
    for role in roles_of(v):
        args[role].pop("accelerator_type", None)
        if accelerator_type(v, role):
            args[role]["accelerator_type"] = accelerator_type(v, role)
    per_node = frontend_per_node(v)
    args["frontend"].pop("max_replicas_per_node", None)
    if per_node is not None:
        args["frontend"]["max_replicas_per_node"] = per_node
    keys = v["auth"]["apiKeySecret"]
    if keys["name"]:
        args.setdefault("auth", {})["api_keys_file"] = f"/etc/ray-llm-disagg/api-keys/{keys['key']}"
    overflow_key = v["overflow"]["apiKeySecret"]
    if overflow_key["name"]:
        args.setdefault("overflow", {})["api_key_file"] = f"/etc/ray-llm-disagg/overflow-key/{overflow_key['key']}"
    return args


CASES = {**{f"example:{e.stem}": ([e], {}) for e in EXAMPLES}, **{f"matrix:{k}": ([], v) for k, v in MATRIX.items()}}


@pytest.mark.parametrize("case", CASES)
def test_args_are_the_values_mirrored(case):
    files, layer = CASES[case]
    r = render(files, layer)
    assert r.args == expected_args(r.values)


# ------------------------------------------------------------------------------------------------
# the same mistakes, both ways
# ------------------------------------------------------------------------------------------------

APP_CASES = [c for c in INVALID if c.app]


def test_enough_shared_rules():
    assert len(APP_CASES) >= 15


@pytest.mark.parametrize("case", APP_CASES, ids=lambda c: c.id)
def test_app_refuses_what_the_chart_refuses(case):
    """Forward: the chart's invalid values, mirrored into args without the chart's checks, fail AppConfig."""
    v = effective_values(case.values)
    with pytest.raises(ValidationError):
        AppConfig.model_validate(expected_args(v))


# Reverse: ways to break AppConfig (snake_case patches of valid args); the same values must fail the chart.
APP_INVALID = {
    "decode-pp": {"decode": {"pipeline_parallel_size": 2}},
    "prefill-pp-pull": {"prefill": {"pipeline_parallel_size": 2}},
    "prefill-tp-above-decode": {"prefill": {"tensor_parallel_size": 2}},
    "cpu-accelerator-type": {"accelerator": "cpu", "kv_transfer": {"buffer_device": "cpu"}, "decode": {"accelerator_type": "H100"}},
    "cpu-cuda-buffers": {"accelerator": "cpu", "kv_transfer": {"buffer_device": "cuda"}},
    "reserved-engine-arg": {"decode": {"engine_args": {"served_model_name": "x"}}},
    "data-parallel": {"prefill": {"engine_args": {"data_parallel_size": 4}}},
    "autoscaling-min-above-max": {"decode": {"autoscaling": {"enabled": True, "min_replicas": 3, "max_replicas": 2}}},
    "negative-replicas": {"decode": {"replicas": -1}},
    "zero-tp": {"prefill": {"tensor_parallel_size": 0}},
    "side-channel-port-low": {"kv_transfer": {"connector": "NixlPushConnector"}, "decode": {"side_channel_port": 80}},
    "frontend-zero": {"frontend": {"replicas": 0}},
    "frontend-negative-cpus": {"frontend": {"num_cpus": -1}},
    "timeout-negative": {"timeouts": {"between_tokens_s": -5}},
    "remote-prefill-negative": {"remote_prefill_min_tokens": -1},
    "empty-model-id": {"model": {"id": ""}},
    "unknown-field": {"frontend": {"replica": 2}},
    "unknown-mode": {"mode": "hybrid"},
    "env-not-string": {"engine_env": {"A": 1}},
    "overflow-without-base-url": {"overflow": {"enabled": True}},
    "overflow-base-url-not-http": {"overflow": {"base_url": "api.example.com/v1"}},
    "overflow-base-url-cleartext": {"overflow": {"base_url": "http://api.example.com/v1"}},
    "overflow-key-file-and-env": {"overflow": {"enabled": True, "base_url": "https://api.example.com/v1",
                                               "api_key_file": "/keys/k", "api_key_env": "OVERFLOW_KEY"}},
    "admission-above-frontend": {"admission": {"max_in_flight": 900, "max_queued": 200}},
    "admission-in-flight-above-frontend": {"frontend": {"max_ongoing_requests": 100}, "admission": {"max_in_flight": 101}},
    "overflow-above-frontend": {"frontend": {"max_ongoing_requests": 50},
                                "overflow": {"enabled": True, "base_url": "https://api.example.com/v1", "max_in_flight": 64}},
    "limits-max-n-zero": {"limits": {"max_n": 0}},
    "limits-body-tiny": {"limits": {"max_body_bytes": 10}},
    "admission-queue-negative": {"admission": {"max_queued": -1}},
    "failover-timeout-zero": {"failover": {"prefill_timeout_s": 0}},
    "load-failure-policy-unknown": {"kv_transfer": {"load_failure_policy": "retry"}},
    "cors-not-a-list": {"auth": {"cors_allow_origins": "https://chat.example.com"}},
}


def camelize(patch):
    if isinstance(patch, dict):
        out = {}
        for k, v in patch.items():
            # user maps (engine_args, engine_env contents) keep their keys
            out[camel(k)] = v if k in ("engine_args", "engine_env") else camelize(v)
        return out
    return patch


def deep_update(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize("name", APP_INVALID)
def test_chart_refuses_what_the_app_refuses(name):
    patch = APP_INVALID[name]
    valid = render(values={}).args
    with pytest.raises(ValidationError):
        AppConfig.model_validate(deep_update(valid, patch))
    stderr = render_error(values=camelize(patch))
    assert "invalid values" in stderr or "values don't meet the specifications of the schema" in stderr, stderr


def test_cpu_example_mirrors_cleanly():
    """The CPU example is what the local stack runs: its args are AppConfig-valid and mirror its values."""
    cpu = next(e for e in EXAMPLES if e.stem == "cpu-tiny")
    v = effective_values(load_values(cpu))
    assert AppConfig.model_validate(expected_args(v)).accelerator == "cpu"
