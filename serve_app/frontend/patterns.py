"""Regular expressions inside a request's JSON schemas, weighed before an engine compiles them.

Why: vLLM turns a JSON schema into a grammar (xgrammar's `Grammar.from_json_schema`) twice: when it validates
the request, synchronously in the serving replica's process (vllm/v1/structured_output/backend_xgrammar.py
`validate_xgrammar_grammar`: every stream of that replica waits), and when the engine compiles it; a string
schema's `pattern` is expanded repetition by repetition: `{"type": "string", "pattern":
"[a-z]{1,20000}"}`, 50 bytes of schema, took 42 s of one core to compile (xgrammar in the project venv, tiny
model's tokenizer); `.{1,1000}` 0.5 s, `.{1,2000}` 2.1 s (quadratic in the count), and nested counts cost more
than their product (`((.{1,10}){1,10}){1,10}`: 12 s). The schema-size cap (`limits.max_schema_bytes`) cannot see
this, so each pattern gets a weight: the repetition counts it would expand, nested counts multiplied and doubled
per level of nesting, and a request's patterns share one budget (`limits.max_pattern_repeat`). And its groups
may nest at most MAX_PATTERN_DEPTH deep: the schema compiler recurses per level, and a 100 KB pattern of nested
parentheses crashed it (segmentation fault: the engine process with it); a 32 KB one did not.

What counts as a pattern: a string `pattern` and each key of `patternProperties`, anywhere in `response_format`,
`structured_outputs` (its `json`, also when sent as a JSON string) and each tool's `function.parameters`.
Patterns are weighed on Python's own regular-expression parser after translating the JSON-schema (ECMAScript)
forms it lacks (`(?<name>`, `\\p{...}`); one it still cannot parse is weighed on its text: every counted
repetition multiplied, which overestimates, never under.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

try:  # Python >= 3.11
    from re import _constants as _c, _parser as _p  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | ({_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set())
_CEILING = 1 << 40  # weights stop growing here (a count this large is refused whatever the budget)
_NAMED_GROUP = re.compile(r"\(\?<(?=[A-Za-z_])")
_PROPERTY_ESCAPE = re.compile(r"\\[pP]\{[^}]*\}")
_COUNT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
MAX_PATTERN_DEPTH = 32  # groups inside groups: xgrammar's schema compiler recurses per level (50000 crashed it)


def schema_patterns(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(dotted path, pattern) for each regular expression in a schema-bearing field, iteratively."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                here = f"{where}.{key}"
                if key == "pattern" and isinstance(item, str):
                    yield here, item
                elif key == "patternProperties" and isinstance(item, dict):
                    for name in item:
                        if isinstance(name, str):
                            yield here, name
                if key == "json" and isinstance(item, str):  # structured_outputs.json sent as JSON text
                    try:
                        item = json.loads(item)
                    except (ValueError, RecursionError):
                        continue  # vLLM refuses it; nothing to weigh
                if isinstance(item, (dict, list)):
                    stack.append((item, here))
        elif isinstance(node, list):
            stack.extend((item, f"{where}.{i}") for i, item in enumerate(node))


def pattern_depth(pattern: str) -> int:
    """How deep `pattern`'s groups nest (escapes and character classes skipped), in one pass."""
    depth = deepest = 0
    i, n, in_class = 0, len(pattern), False
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "^":
                i += 1
            if pattern[i + 1:i + 2] == "]":  # a leading ] is a member, not the end
                i += 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def pattern_weight(pattern: str) -> int:
    """How many atoms `pattern`'s counted repetitions unroll into: `{m,n}` weighs its largest count (`{m,}`: m)
    times what it repeats, doubled inside another repetition; `*`, `+`, `?` and what no count repeats weigh
    nothing (an automaton loops over them; a long literal costs a grammar what it costs a schema)."""
    text = _PROPERTY_ESCAPE.sub(".", _NAMED_GROUP.sub("(?P<", pattern))
    try:
        tree = _p.parse(text)
        return min(_weight(tree, 0), _CEILING)
    except (re.error, OverflowError, RecursionError, ValueError, TypeError, IndexError):
        return _text_weight(pattern)


def _weight(items: Any, depth: int) -> int:
    """Unrolled atoms under `items`; `depth`: how many counted repetitions enclose them (atoms outside any
    weigh 0)."""
    total = 0
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            count = low if high == _c.MAXREPEAT else high
            if count <= 1:
                total += _weight(sub, depth)
            else:
                total += count * (2 if depth else 1) * max(1, _weight(sub, depth + 1))
        elif op is _c.SUBPATTERN:
            total += _weight(av[-1], depth)
        elif op is _c.BRANCH:
            total += sum(_weight(branch, depth) for branch in av[1])
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            total += _weight(av[1], depth)
        elif op is _c.GROUPREF_EXISTS:
            total += sum(_weight(branch, depth) for branch in av[1:] if branch is not None)
        elif depth:
            total += 1
        if total >= _CEILING:
            return _CEILING
    return total


def _text_weight(pattern: str) -> int:
    """For a pattern Python's parser refuses: every count multiplied, as if each nested in the one before."""
    weight = 0
    for m in _COUNT.finditer(pattern):
        count = int(m.group(2)) if m.group(2) else int(m.group(1))
        if count > 1:
            weight = max(weight, 1) * count
        if weight >= _CEILING:
            return _CEILING
    return weight
