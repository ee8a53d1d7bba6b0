#!/usr/bin/env python3
"""Render the values reference table of charts/ray-llm-disagg from values.yaml `# --` comments.

    hack/values-doc.py            # markdown table on stdout (README "Values reference")
    hack/values-doc.py --check    # exit 1 if a key lacks a `# --` comment, or values.yaml and
                                  # values.schema.json disagree on which keys exist
    hack/values-doc.py --write FILE   # replace the table between the values-table markers in FILE
                                      # (charts/ray-llm-disagg/README.md)

Comment form (helm-docs style): a `# -- text` line directly above a key documents that key;
following `#` lines continue the text. A section key (a map whose keys are all documented) needs
no comment of its own. Types come from values.schema.json, defaults from values.yaml.
Needs only Python 3 and PyYAML.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "ray-llm-disagg"

START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
KEY_RE = re.compile(r"^(?P<indent> *)(?P<key>[^\s#\-][^:#]*?|\"[^\"]+\"|'[^']+'):(?:\s|$)")


def parse_docs(text: str) -> dict[str, str]:
    """Dotted key path -> description, from `# --` comments above keys."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key)
    pending: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        if not stripped:
            pending = None
            continue
        m = KEY_RE.match(line)
        if not m:  # list items and continuation lines belong to the previous key's value
            pending = None
            continue
        indent, key = len(m.group("indent")), m.group("key").strip().strip("\"'")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            docs[".".join(k for _, k in stack)] = " ".join(p for p in pending if p)
            pending = None
    return docs


def resolve(schema: dict, node: dict | None) -> dict:
    """Follow $refs, and look through the generated reason carriers (`anyOf: [rule, {const: "rule: ..."}]`)."""
    while node:
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].split("/")[-1]]
        elif "anyOf" in node and len(node["anyOf"]) == 2 and str(node["anyOf"][1].get("const", "")).startswith("rule: "):
            node = node["anyOf"][0]
        else:
            break
    return node or {}


def schema_node(schema: dict, path: list[str]) -> dict:
    node = resolve(schema, schema)
    for p in path:
        props = node.get("properties") or {}
        if p in props:
            node = resolve(schema, props[p])
        elif isinstance(node.get("additionalProperties"), dict):
            node = resolve(schema, node["additionalProperties"])
        else:
            return {}
    return node


def type_of(schema: dict, path: list[str], default) -> str:
    node = schema_node(schema, path)
    t = node.get("type")
    if "enum" in node:
        return " \\| ".join(f"`{e}`" if e != "" else '`""`' for e in node["enum"])
    if isinstance(t, list):
        return " \\| ".join(t)
    if t:
        return t
    return type(default).__name__ if default is not None else "any"


def fmt_default(v) -> str:
    if v == "" or v is None:
        return '`""`' if v == "" else "`null`"
    s = json.dumps(v, separators=(", ", ": ")) if isinstance(v, (dict, list)) else (
        str(v).lower() if isinstance(v, bool) else str(v))
    s = s.replace("|", "\\|")
    return f"`{s}`"


def lookup(values: dict, path: list[str]):
    cur = values
    for p in path:
        cur = cur[p]
    return cur


def table(values: dict, docs: dict[str, str], schema: dict) -> str:
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for key, desc in docs.items():
        path = key.split(".")
        default = lookup(values, path)
        desc = desc.replace("|", "\\|")
        rows.append(f"| `{key}` | {type_of(schema, path, default)} | {fmt_default(default)} | {desc} |")
    return "\n".join(rows)


def check(values: dict, docs: dict[str, str], schema: dict) -> list[str]:
    problems: list[str] = []

    def documented_section(path: list[str], val) -> bool:
        node = schema_node(schema, path)
        if not (isinstance(val, dict) and node.get("properties")):
            return False
        return all(".".join(path + [k]) in docs or documented_section(path + [k], v) for k, v in val.items())

    def walk(path: list[str], val) -> None:
        node = schema_node(schema, path)
        fixed = node.get("properties") or {}
        if isinstance(val, dict) and fixed:
            for k in fixed:
                if k not in val:
                    problems.append(f"{'.'.join(path + [k])}: in values.schema.json but not in values.yaml")
            for k, v in val.items():
                p = path + [k]
                if k not in fixed:
                    problems.append(f"{'.'.join(p)}: in values.yaml but not in values.schema.json")
                    continue
                if ".".join(p) in docs:
                    continue  # a documented key covers its whole value (e.g. a resources map)
                if not documented_section(p, v):
                    problems.append(f"{'.'.join(p)}: no `# --` comment")
                walk(p, v)

    walk([], values)
    for key in docs:
        try:
            lookup(values, key.split("."))
        except (KeyError, TypeError):
            problems.append(f"{key}: documented but not a key of values.yaml (comment parsing?)")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check that every key is documented")
    ap.add_argument("--chart", type=Path, default=CHART)
    ap.add_argument("--write", type=Path, metavar="FILE", help="update the table between the markers in FILE")
    a = ap.parse_args()
    text = (a.chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((a.chart / "values.schema.json").read_text())
    docs = parse_docs(text)
    if a.check:
        problems = check(values, docs, schema)
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{len(docs)} documented keys, {len(problems)} problem(s)", file=sys.stderr)
        return 1 if problems else 0
    out = table(values, docs, schema)
    if a.write:
        text = a.write.read_text()
        start, end = text.find(START), text.find(END)
        if start < 0 or end < start:
            print(f"{a.write}: markers {START} ... {END} not found", file=sys.stderr)
            return 1
        a.write.write_text(text[: start + len(START)] + "\n" + out + "\n" + text[end:])
        return 0
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
