"""Regular expressions inside JSON schemas (serve_app/frontend/patterns.py and limits.check_costs): weighed before
an engine compiles them, refused with a 400 naming the path when they would cost it seconds of CPU or its process.

Measured with xgrammar on the project venv (the tiny model's tokenizer): a schema `pattern` "[a-z]{1,20000}" took
42 s to compile, ".{1,1000}" 0.5 s, "((.{1,10}){1,10}){1,10}" 12 s, and 50000 nested parentheses crashed it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve_app.config import LimitsSpec
from serve_app.frontend.errors import OpenAIError
from serve_app.frontend.limits import validate_request
from serve_app.frontend.patterns import MAX_PATTERN_DEPTH, pattern_depth, pattern_weight, schema_patterns

MODEL = "tiny"
LIMITS = LimitsSpec()


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def refuse(data: dict[str, Any], limits: LimitsSpec = LIMITS) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        validate_request(data, "chat", limits=limits, models=[MODEL])
    assert caught.value.status_code == 400, caught.value.message
    return caught.value


@pytest.mark.parametrize(
    ("pattern", "weight"),
    [
        (".{1,1000}", 1000),
        ("[a-z]{1,20000}", 20000),
        ("[a-z]{1000,}", 1000),  # no upper bound: the lower one is unrolled
        ("[a-z]{7}", 7),
        ("(.{1,32}){1,32}", 32 * 32 * 2),  # nested: multiplied, and doubled per level inside another
        ("((.{1,10}){1,10}){1,10}", 10 * (10 * 2 * (10 * 2))),
        ("(apple|banana)+", 0),  # loops cost an automaton nothing per iteration
        ("x" * 3000, 0),  # nor does literal text: the schema-size cap already bounds it
        (r"\d{3}-\d{4}", 7),
        (r"(?<year>\d{4})-\p{L}{1,5}", 9),  # JSON schema (ECMAScript) forms Python's parser lacks
        (r"\{1,5000\}", 0),  # escaped braces are text, not a count
        ("a{1,99999999999}", 99999999999),  # too large for Python's parser: weighed on the text
    ],
)
def test_a_pattern_weighs_the_repetitions_it_unrolls(pattern: str, weight: int) -> None:
    assert pattern_weight(pattern) == weight


def test_an_unparsable_pattern_is_weighed_as_if_every_count_nested() -> None:
    assert pattern_weight("a{2}{3}(") == 6  # the unbalanced group: Python's parser refuses it


@pytest.mark.parametrize(
    ("pattern", "depth"),
    [("a", 0), ("((a)(b))", 2), ("[(]((x))", 2), (r"\(\(", 0), ("[]()]", 0), ("[^]()]((a))", 2),
     ("(" * 40 + "a" + ")" * 40, 40)],
)
def test_group_depth_skips_escapes_and_character_classes(pattern: str, depth: int) -> None:
    assert pattern_depth(pattern) == depth


def test_patterns_are_found_wherever_a_schema_holds_them() -> None:
    schema = {
        "properties": {"a": {"type": "string", "pattern": "x{5}"}, "pattern": {"type": "string"}},
        "patternProperties": {"^k{2}$": {"type": "integer"}},
        "items": [{"pattern": "y{3}"}],
    }
    found = sorted(schema_patterns({"json": json.dumps(schema)}, "structured_outputs"))
    assert found == [
        ("structured_outputs.json.items.0.pattern", "y{3}"),
        ("structured_outputs.json.patternProperties", "^k{2}$"),
        ("structured_outputs.json.properties.a.pattern", "x{5}"),
    ]


@pytest.mark.parametrize(
    ("data", "param"),
    [
        (chat(response_format=schema_format({"type": "string", "pattern": "[a-z]{1,20000}"})),
         "response_format.json_schema.schema.pattern"),
        (chat(structured_outputs={"json": {"type": "object", "properties": {"n": {"pattern": "((.{1,10}){1,10}){1,10}"}}}}),
         "structured_outputs.json.properties.n.pattern"),
        (chat(structured_outputs={"json": json.dumps({"patternProperties": {".{1,5000}": {}}})}),
         "structured_outputs.json.patternProperties"),
        (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": ".{2000}"}}}}}]),
         "tools.0.function.parameters.properties.s.pattern"),
        (chat(response_format=schema_format({"type": "string", "pattern": "(" * 50 + "a" + ")" * 50})),
         "response_format.json_schema.schema.pattern"),
    ],
)
def test_a_costly_pattern_is_a_400_naming_its_path(data: dict[str, Any], param: str) -> None:
    error = refuse(data)
    assert error.param == param, error.message
    assert "limits.max_pattern_repeat" in error.message or f"deeper than {MAX_PATTERN_DEPTH}" in error.message


def test_the_budget_is_shared_by_every_pattern_of_the_request() -> None:
    """Each pattern alone fits; together they are refused at the one that passes the budget."""
    half = {"type": "string", "pattern": "[a-z]{1,600}"}
    data = chat(response_format=schema_format({"type": "object", "properties": {"a": half}}),
                tools=[{"type": "function", "function": {"name": "f", "parameters": {"properties": {"b": half}}}}])
    error = refuse(data)
    assert error.param == "tools.0.function.parameters.properties.b.pattern", error.message
    assert "1200" in error.message


def test_the_budget_is_a_knob() -> None:
    data = chat(response_format=schema_format({"type": "string", "pattern": "[a-z0-9-]{1,63}(\\.[a-z0-9-]{1,63}){1,10}"}))
    refuse(data)  # 63, plus 10 x (1 + 2 x 63) for the repeated group: 1333
    validate_request(data, "chat", limits=LimitsSpec(max_pattern_repeat=4096), models=[MODEL])


def test_everyday_patterns_are_accepted() -> None:
    schema = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "pattern": r"^[A-Za-z0-9._%+-]{1,64}@[a-z0-9.-]{1,255}\.[a-z]{2,24}$"},
            "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "uuid": {"type": "string", "pattern": r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
            "name": {"type": "string", "pattern": r"^\p{L}+( \p{L}+)*$"},
        },
        "patternProperties": {"^x-[a-z]+$": {"type": "string"}},
    }
    validate_request(chat(response_format=schema_format(schema)), "chat", limits=LIMITS, models=[MODEL])
    validate_request(chat(structured_outputs={"json": json.dumps(schema)}), "chat", limits=LIMITS, models=[MODEL])


def test_a_pattern_budget_of_zero_refuses_any_counted_repetition() -> None:
    data = chat(response_format=schema_format({"type": "string", "pattern": "a{2}"}))
    refuse(data, LimitsSpec(max_pattern_repeat=0))
    validate_request(chat(response_format=schema_format({"type": "string", "pattern": "a+"})), "chat",
                     limits=LimitsSpec(max_pattern_repeat=0), models=[MODEL])
