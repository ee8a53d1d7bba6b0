#!/usr/bin/env python3
"""Generate charts/ray-llm-disagg/values.schema.json and templates/_generated.tpl.

    hack/values-schema.py           # write both files
    hack/values-schema.py --check   # exit 1 if either is stale (tests/chart runs this)

One rule set: the app-facing values are a plain mirror of serve_app.config.AppConfig (same paths,
camelCase), so their schema is AppConfig's own pydantic JSON schema, camelCased, merged with the
chart's hand-written part (charts/ray-llm-disagg/schema/chart.yaml: Kubernetes keys, "" defaults
that mean "derive it", and the cross-field rules a schema can carry, with their reasons). The
template gets AppConfig's field tree (which values keys the app reads, and their snake_case names)
and the reserved engine arguments from the same models, so the chart renders the args without a
second copy of the names.

Needs pydantic (the project venv: `hack/pyenv.sh python`) and PyYAML.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "ray-llm-disagg"
SOURCE = CHART / "schema" / "chart.yaml"
SCHEMA_OUT = CHART / "values.schema.json"
TPL_OUT = CHART / "templates" / "_generated.tpl"
RULE = "rule: "

sys.path.insert(0, str(ROOT))


def camel(name: str) -> str:
    """snake_case -> lowerCamelCase, no acronym exceptions (first_token_s -> firstTokenS)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def camel_path(path: str) -> str:
    return ".".join(camel(p) for p in path.split("."))


# ------------------------------------------------------------------------------------------------
# AppConfig -> values schema fragment and field tree
# ------------------------------------------------------------------------------------------------

def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def field_tree(model) -> dict[str, Any]:
    """{snake: {"v": camel, "f": subtree?}} for every field of a pydantic model; "f" for nested models."""
    from pydantic import BaseModel

    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        node: dict[str, Any] = {"v": camel(name)}
        tp = _strip_optional(info.annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            node["f"] = field_tree(tp)
        if not info.is_required() and info.default is None:
            node["o"] = True  # optional: "" / {} in values mean unset
        out[name] = node
    return out


def app_schema(model) -> dict:
    """The model's JSON schema, $defs inlined, property names camelCased, titles/defaults/nulls dropped."""
    raw = model.model_json_schema(mode="validation")
    defs = raw.pop("$defs", {})

    def conv(node: Any, model_object: bool = True) -> Any:
        if isinstance(node, list):
            return [conv(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return conv({**target, **rest})
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k in ("title", "default"):
                continue
            if k == "properties":
                out[k] = {camel(p): conv(s) for p, s in v.items()}
            elif k == "required":
                out[k] = [camel(p) for p in v]
            elif k == "anyOf":
                branches = [conv(b) for b in v if b != {"type": "null"}]
                if len(branches) == 1:
                    out.update(branches[0])
                else:
                    out[k] = branches
            else:
                out[k] = conv(v)
        return out

    return conv(raw)


# ------------------------------------------------------------------------------------------------
# merging and the x- extensions
# ------------------------------------------------------------------------------------------------

def merge(base: Any, over: Any, ref_wins: bool = False) -> Any:
    """Deep merge, `over` wins; `required` lists are united. With ref_wins (an AppConfig fragment under the
    chart's), a chart node that is a `$ref` replaces the app's node whole: the chart's building block is the
    stricter, values-shaped rule."""
    if ref_wins and isinstance(over, dict) and "$ref" in over:
        return copy.deepcopy(over)
    if isinstance(base, dict) and isinstance(over, dict):
        out = copy.deepcopy(base)
        for k, v in over.items():
            if k == "required" and isinstance(out.get(k), list):
                out[k] = out[k] + [r for r in v if r not in out[k]]
            elif k in out:
                out[k] = merge(out[k], v, ref_wins)
            else:
                out[k] = copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def carrier(reason: str) -> dict:
    """A schema no value satisfies, whose error message is the reason (helm prints `value must be '<const>'`)."""
    assert "'" not in reason, f"helm would print a quote in a reason as \\': {reason}"
    text = RULE + reason
    return {"const": text, "not": {"const": text}}


def expand(node: Any, defs: dict) -> Any:
    if isinstance(node, list):
        return [expand(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for name in node.pop("x-include", []):
        node = merge({k: v for k, v in defs[name].items() if not k.startswith("x-")}, node)
    node.pop("x-app", None)
    if "$ref" in node and len(node) > 1 and "x-reason" not in node and "x-forbid" not in node:
        target = defs[node["$ref"].split("/")[-1]]
        node = merge({k: v for k, v in target.items()}, {k: v for k, v in node.items() if k != "$ref"})
        return expand(node, defs)
    if "x-forbid" in node:
        return carrier(node["x-forbid"])
    reason = node.pop("x-reason", None)
    node = {k: expand(v, defs) for k, v in node.items()}
    if reason is not None:
        return {"anyOf": [node, carrier(reason)]}
    return node


# ------------------------------------------------------------------------------------------------

def ray_accelerator_types() -> list[str]:
    """The accelerator types Ray Serve LLM accepts (LLMConfig.accelerator_type: the constants of
    ray.util.accelerators.accelerators, plus the A10 alias it maps to A10G), read from the pinned Ray's
    source file without importing Ray."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        sys.exit("hack/values-schema.py needs the project venv (Ray): run it with `hack/pyenv.sh python`")
    path = Path(spec.origin).parent / "util" / "accelerators" / "accelerators.py"
    consts = {}
    exec(compile(path.read_text(), str(path), "exec"), {}, consts)  # a module of string constants
    return sorted({v for k, v in consts.items() if k.isupper() and isinstance(v, str)} | {"A10"})


def build() -> tuple[str, str]:
    from serve_app import config

    src = yaml.safe_load(SOURCE.read_text())
    defs = src.setdefault("definitions", {})
    props = src.setdefault("properties", {})

    app = app_schema(config.AppConfig)
    for name, schema in app["properties"].items():
        target = props.get(name)
        if isinstance(target, dict) and "$ref" in target and len(target) == 1:
            d = target["$ref"].split("/")[-1]
            defs[d] = merge(schema, defs[d], ref_wins=True)
        else:
            props[name] = merge(schema, target or {}, ref_wins=True)

    # Ray's accelerator types: an unknown one passes the app's model but Ray refuses it at deploy time
    defs["acceleratorType"]["enum"] = [""] + ray_accelerator_types()

    # reserved engine arguments: the app's table, once, here
    reserved = {k: camel_path(v) for k, v in config.RESERVED_ENGINE_ARGS.items()}
    engine_args = defs["role"]["properties"]["engineArgs"]
    engine_args.setdefault("properties", {})
    for arg, where in sorted(reserved.items()):
        where = where.replace("<role>.", "") + (" of the role" if where.startswith("<role>.") else "")
        engine_args["properties"][arg] = {"x-forbid": f"set by the chart; set {where} instead"}

    # resolve definitions that include others first, then the whole document
    expanded_defs: dict[str, Any] = {}
    for name, d in defs.items():
        expanded_defs[name] = d
    out = expand({k: v for k, v in src.items() if k != "definitions"}, expanded_defs)
    out["definitions"] = {name: expand(d, expanded_defs) for name, d in defs.items()}
    # drop definitions only used through x-include
    used = set(re.findall(r'"#/definitions/([^"]+)"', json.dumps(out)))
    out["definitions"] = {k: v for k, v in out["definitions"].items() if k in used}
    schema_text = json.dumps(out, indent=2, ensure_ascii=False) + "\n"

    tree = field_tree(config.AppConfig)
    tpl = (
        "{{/* GENERATED by hack/values-schema.py from serve_app.config: do not edit (make values-schema). */}}\n\n"
        "{{/* AppConfig's fields: {snake: {v: camelCase values key, f: nested fields, o: optional}}. The app's\n"
        "args are these keys of .Values, renamed; templates/_appconfig.tpl walks the tree. */}}\n"
        '{{- define "ray-llm-disagg.appFields" -}}\n'
        + json.dumps(tree, sort_keys=True)
        + "\n{{- end -}}\n\n"
        "{{/* Engine arguments the app sets itself (serve_app.config.RESERVED_ENGINE_ARGS), with the values key to use. */}}\n"
        '{{- define "ray-llm-disagg.reservedEngineArgs" -}}\n'
        + json.dumps(reserved, sort_keys=True)
        + "\n{{- end -}}\n\n"
        "{{/* The args a running app takes in place (serve_app.config.LIVE_FIELDS): every deployment's user_config,\n"
        "not args; and the deployment names the builder gives (serve_app.config.AppConfig.deployment_names). */}}\n"
        '{{- define "ray-llm-disagg.liveFields" -}}\n'
        + json.dumps(list(config.LIVE_FIELDS))
        + "\n{{- end -}}\n"
        '{{- define "ray-llm-disagg.deploymentNaming" -}}\n'
        + json.dumps({"frontend": config.FRONTEND_DEPLOYMENT, "prefix": config.ENGINE_DEPLOYMENT_PREFIX}, sort_keys=True)
        + "\n{{- end -}}\n"
    )
    return schema_text, tpl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the generated files are stale")
    a = ap.parse_args()
    schema_text, tpl = build()
    stale = [p for p, text in ((SCHEMA_OUT, schema_text), (TPL_OUT, tpl))
             if not p.exists() or p.read_text() != text]
    if a.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is stale: run `make values-schema` (hack/values-schema.py)", file=sys.stderr)
        return 1 if stale else 0
    for p, text in ((SCHEMA_OUT, schema_text), (TPL_OUT, tpl)):
        p.write_text(text)
    print(f"wrote {SCHEMA_OUT.relative_to(ROOT)} and {TPL_OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
