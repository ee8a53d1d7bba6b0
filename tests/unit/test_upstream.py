"""serve_app.upstream, the seam to Ray Serve LLM / Ray Serve / vLLM internals, against the installed versions.

When a Ray or vLLM bump moves or renames something the app uses, one of these fails naming the symbol:
fix its entry in serve_app/upstream.py (and the code that uses it), nothing else.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from serve_app import upstream

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_IMPORT = re.compile(r"^\s*(from|import)\s+(ray\.llm\._internal|ray\.serve\._private|ray\._\w+|vllm)\b")


@pytest.mark.parametrize("name", sorted(upstream.NAMES))
def test_every_name_resolves(name: str) -> None:
    try:
        upstream.resolve(name)
    except ImportError as exc:
        pytest.fail(str(exc), pytrace=False)


def _assigned_in_source(cls: type, attr: str) -> bool:
    """True when some class in cls's MRO assigns `self.<attr>` (an instance attribute its constructor or
    start-up sets), defines `attr` itself or declares it as a dataclass field."""
    assign = re.compile(rf"\bself\.{re.escape(attr)}\s*(:[^=\n]+)?=(?!=)")
    for klass in cls.__mro__:
        if klass is object:
            continue
        if attr in vars(klass) or attr in getattr(klass, "__dataclass_fields__", {}):
            return True
        try:
            if assign.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):
            continue
    return False


@pytest.mark.parametrize("member", upstream.MEMBERS, ids=lambda m: f"{m.owner}.{m.name}")
def test_every_member_exists(member: upstream.Member) -> None:
    owner = upstream.resolve(member.owner)
    where = f"{owner.__module__}.{owner.__qualname__}" if inspect.isclass(owner) else owner.__name__
    if member.how == "attr":
        found = _assigned_in_source(owner, member.name)
    else:
        found = hasattr(owner, member.name)
        if found and member.how == "override":
            found = callable(getattr(owner, member.name))
    if not found:
        pytest.fail(
            f"serve_app.upstream.MEMBERS: {member.owner}.{member.name} ({member.how}) is gone from {where} "
            f"with {upstream.versions()}. Upstream renamed or dropped it; "
            + ("our override of it no longer runs. " if member.how == "override" else "")
            + "Port its use and update serve_app/upstream.py.",
            pytrace=False,
        )


def _serve_app_classes_on_upstream() -> list[type]:
    classes = []
    for path in sorted((ROOT / "serve_app").rglob("*.py")):
        module_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module_name.endswith("__init__") or module_name == "serve_app.upstream":
            continue
        module = importlib.import_module(module_name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__ == module_name and any(map(_is_upstream, obj.__mro__)):
                classes.append(obj)
    return classes


def _is_upstream(cls: type) -> bool:
    return cls.__module__.split(".")[0] in ("ray", "vllm")


def _hook(name: str) -> bool:
    """Names whose override matters: not Python's or typing's machinery (dunders other than Serve's hooks)."""
    if name in ("_abc_impl", "_is_protocol"):
        return False
    return not (name.startswith("__") and name.endswith("__")) or name.startswith("__serve_")


def test_every_override_of_an_upstream_method_is_listed() -> None:
    """A serve_app class that replaces an upstream method depends on its name: MEMBERS must say so, so that
    the check above catches a rename (which would silently bypass our override)."""
    listed = {(upstream.resolve(m.owner), m.name) for m in upstream.MEMBERS if m.how == "override"}
    missing = []
    for cls in _serve_app_classes_on_upstream():
        bases = [c for c in cls.__mro__ if _is_upstream(c)]
        ours = set().union(*(vars(c) for c in cls.__mro__ if c.__module__.startswith("serve_app")))
        for name in sorted(filter(_hook, ours)):
            defining = [b for b in bases if name in vars(b)]
            if defining and not any((b, name) in listed or (c, name) in listed for b in defining for c in bases):
                missing.append(f"{cls.__module__}.{cls.__name__}.{name} overrides {defining[0].__qualname__}.{name}")
    assert not missing, "add these to serve_app.upstream.MEMBERS as 'override':\n" + "\n".join(missing)


def test_nothing_bypasses_the_seam() -> None:
    """Private upstream modules are imported only by serve_app/upstream.py (app, devstack and tests alike)."""
    offenders = []
    for top in ("serve_app", "devstack", "tests", "bench", "loadtests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == ROOT / "serve_app" / "upstream.py":
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                for name in names:
                    if PRIVATE_IMPORT.match(f"import {name}"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not offenders, "import these through serve_app.upstream:\n" + "\n".join(offenders)


def test_an_unknown_or_moved_name_says_which() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        upstream.NoSuchThing  # noqa: B018
    upstream.NAMES["_probe"] = upstream.Name("ray.llm._internal.serve.core.protocol", "GoneName", "probe")
    try:
        with pytest.raises(ImportError, match=r"'_probe' .*GoneName.*serve_app/upstream.py"):
            upstream.resolve("_probe")
    finally:
        del upstream.NAMES["_probe"]
