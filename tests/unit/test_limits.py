"""serve_app.frontend.limits: bounded, linear validation; OpenAI-like caps; every violation a 400 naming the field.

Pure: the request models Ray uses, no Ray cluster, no engine. Linearity is checked by counting validations,
not by timing them (a busy CI machine cannot make these tests flaky)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve_app.upstream import ChatCompletionRequest, CompletionRequest
from serve_app.config import LimitsSpec
from serve_app.frontend import limits as limits_module
from serve_app.frontend.errors import OpenAIError
from serve_app.frontend.limits import (
    param_in_message,
    parse_json_object,
    requested_max_tokens,
    sequences,
    validate_request,
)

MODEL = "tiny"
LIMITS = LimitsSpec()
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **fields}


def refuse(data: dict[str, Any], kind: str = "chat", limits: LimitsSpec = LIMITS, **kwargs: Any) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        validate_request(data, kind, limits=limits, models=[MODEL], **kwargs)
    assert caught.value.status_code == 400, caught.value.message
    return caught.value


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every pydantic validation of a request model, by class name."""
    seen: list[str] = []
    for cls in (ChatCompletionRequest, CompletionRequest):
        original = cls.model_validate.__func__  # type: ignore[attr-defined]

        def counted(klass: type, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            seen.append(klass.__name__)
            return __original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "model_validate", classmethod(counted))
    return seen


# ---- linear, bounded validation ----


@pytest.mark.parametrize("junk", [0, 10, 60, 120])
def test_a_body_is_validated_once_however_many_fields_it_has(validations: list[str], junk: int) -> None:
    """The old `_culprit` re-validated a failing body once per top-level field (O(N^2): 34 s for 4000 keys).
    Now: one validation, for any N under the cap, and the right field named."""
    data = chat(**{f"k{i}": 0 for i in range(junk)}, add_generation_prompt=True, continue_final_message=True)
    if len(data) > LIMITS.max_top_level_keys:
        pytest.skip("over the cap: covered below")
    error = refuse(data)
    assert validations == ["ChatCompletionRequest"]
    assert error.param in ("continue_final_message", "add_generation_prompt"), error.param


def test_too_many_top_level_keys_is_refused_before_any_validation(validations: list[str]) -> None:
    data = chat(**{f"k{i}": 0 for i in range(4000)}, tools=[])
    raw = json.dumps(data).encode()
    assert len(raw) < 64 * 1024  # the 45 KB body of the issue
    error = refuse(parse_json_object(raw))
    assert error.code == "too_many_fields"
    assert "128" in error.message and "limits.max_top_level_keys" in error.message
    assert validations == []


def test_the_key_cap_is_a_knob() -> None:
    data = chat(**{f"k{i}": 0 for i in range(40)})
    refuse(data, limits=LimitsSpec(max_top_level_keys=32))
    validate_request(data, "chat", limits=LimitsSpec(max_top_level_keys=64), models=[MODEL])


def test_empty_tools_names_tools_not_another_field(validations: list[str]) -> None:
    """On main this answered param 'temperature' (the first field whose removal changed the error)."""
    error = refuse(chat(temperature=0.5, tools=[]))
    assert error.param == "tools"
    assert validations == []  # a cap check, before pydantic


def test_a_validator_message_names_the_field_it_backticks() -> None:
    data = {"temperature": 1, "tools": [], "tool_choice": "auto"}
    assert param_in_message("`tools` must not be an empty array.", data) == "tools"
    assert param_in_message("When using `tool_choice`, `tools` must be set.", data) == "tool_choice"
    assert param_in_message("tool_choice is wrong", data) == "tool_choice"
    assert param_in_message("nothing here", data) is None


def test_param_search_is_bounded_by_the_message_not_the_body() -> None:
    data = {f"k{i}": 0 for i in range(100_000)}
    message = "x " * 100_000  # a validator echoing a huge value
    assert param_in_message(message, data) is None  # bounded scan; one dict lookup per word


# ---- OpenAI-like caps, each a 400 naming the field ----


@pytest.mark.parametrize(
    ("data", "param"),
    [
        (chat(stop=[f"s{i}" for i in range(5)]), "stop"),
        (chat(stop=["x" * 257]), "stop"),
        (chat(stop=["ok", 3]), "stop.1"),
        (chat(logit_bias={str(i): 1 for i in range(301)}), "logit_bias"),
        (completion(bad_words=[f"w{i}" for i in range(65)]), "bad_words"),
        (completion(bad_words=["ok", 1]), "bad_words.1"),
        (chat(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]), "tools"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"d": "x" * 40_000}}}),
         "response_format"),
        (chat(structured_outputs={"json": {"d": "x" * 40_000}}), "structured_outputs"),
        (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"d": "x" * 40_000}}}]),
         "tools.0.function.parameters"),
        (completion(prompt_logprobs=1), "prompt_logprobs"),
        (completion(prompt_logprobs=-1), "prompt_logprobs"),
        (completion(echo=True, logprobs=1), "echo"),
        (chat(echo=True), "echo"),  # vLLM: chat echo computes prompt logprobs with top_logprobs (default 0)
        (chat(messages=MESSAGES * 2049), "messages"),
        (completion(prompt=["p"] * 65), "prompt"),
        (chat(bad_words="oops"), "bad_words"),
    ],
)
def test_each_cap_is_a_400_naming_the_field(validations: list[str], data: dict[str, Any], param: str) -> None:
    kind = "chat" if "messages" in data else "completions"
    error = refuse(data, kind)
    assert error.param == param, error.message
    assert validations == []  # refused on the raw JSON, before pydantic parses any of it


def test_a_union_field_error_names_what_is_wrong_with_the_branch_the_value_is() -> None:
    """`stop` is `str | list[str]` (at most 4 since vLLM 0.29): five strings are "at most 4 items", not "should
    be a valid string" (the other branch's error)."""
    error = refuse(chat(stop=[f"s{i}" for i in range(5)]), "chat", limits=LimitsSpec(max_stop=8))
    assert error.param == "stop" and "at most 4 items" in error.message, error.message


def test_within_the_caps_is_accepted() -> None:
    validate_request(chat(stop=[f"s{i}" for i in range(4)], logit_bias={"1": 2}, top_logprobs=None, echo=True),
                     "chat", limits=LIMITS, models=[MODEL])
    validate_request(completion(bad_words=["a"] * 64, echo=True), "completions", limits=LIMITS, models=[MODEL])
    validate_request(completion(echo=True, logprobs=2, prompt_logprobs=2), "completions",
                     limits=LimitsSpec(max_prompt_logprobs=2), models=[MODEL])
    refuse(completion(prompt_logprobs=3), "completions", limits=LimitsSpec(max_prompt_logprobs=2))


# ---- max_tokens ----


@pytest.mark.parametrize(
    ("kind", "sent", "expected"),
    [
        ("chat", {}, 64),
        ("chat", {"max_tokens": None}, 64),
        ("chat", {"max_completion_tokens": None}, 64),
        # completions: absent or null is vLLM's (and OpenAI's) default of 16, under the cap; on main a present-but-null
        # key skipped the cap on the overflow path, which forwarded the null (test_overflow.py checks that path)
        ("completions", {"max_tokens": None}, 16),
        ("completions", {}, 16),
    ],
)
def test_null_max_tokens_means_the_cap(kind: str, sent: dict[str, Any], expected: int) -> None:
    data = (chat if kind == "chat" else completion)(**sent)
    request = validate_request(data, kind, limits=LimitsSpec(max_tokens=64), models=[MODEL])
    assert requested_max_tokens(request) == expected


def test_max_tokens_over_the_cap_is_refused() -> None:
    error = refuse(completion(max_tokens=65), "completions", limits=LimitsSpec(max_tokens=64))
    assert error.param == "max_tokens"


def test_no_cap_and_no_max_tokens_is_unbounded() -> None:
    request = validate_request(chat(), "chat", limits=LIMITS, models=[MODEL])
    assert requested_max_tokens(request) is None


# ---- admission weight ----


@pytest.mark.parametrize(
    ("data", "kind", "expected"),
    [
        (chat(), "chat", 1),
        (chat(n=4), "chat", 4),
        (completion(prompt=["a", "b", "c"], n=2), "completions", 6),
        (completion(prompt=[1, 2, 3]), "completions", 1),  # one prompt of token ids
        (completion(prompt=[[1], [2]], n=8), "completions", 16),
    ],
)
def test_sequences_weigh_prompts_times_n(data: dict[str, Any], kind: str, expected: int) -> None:
    assert sequences(validate_request(data, kind, limits=LIMITS, models=[MODEL])) == expected


def test_no_culprit_search_is_left() -> None:
    assert not hasattr(limits_module, "_culprit")


# ---- text and nesting: checked after the caps, walked only as far as needed ----


@pytest.mark.parametrize("with_raw", [True, False])
def test_a_lone_surrogate_anywhere_is_a_400_naming_its_path(with_raw: bool) -> None:
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    data = parse_json_object(raw)
    error = refuse(data, raw=raw if with_raw else None)
    assert error.param == "messages.0.content"


SURROGATE = "a\ud800b"


@pytest.mark.parametrize(
    "data, param",
    [
        (chat(response_format={"type": "json_schema", "json_schema": {"name": SURROGATE}}), "response_format.json_schema.name"),
        (chat(structured_outputs={"json": {"title": SURROGATE}}), "structured_outputs.json.title"),
        (
            chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {SURROGATE: {}}}}]),
            f"tools.0.function.parameters.{SURROGATE}",
        ),
        (chat(stop=["x", SURROGATE]), "stop.1"),
        (chat(bad_words=[SURROGATE]), "bad_words.0"),
        (chat(logit_bias={SURROGATE: 1}), f"logit_bias.{SURROGATE}"),
        (chat(messages=[{"role": "user", "name": SURROGATE, "content": "hi"}]), "messages.0.name"),
    ],
)
def test_a_lone_surrogate_in_a_field_the_caps_measure_is_a_400_not_a_crash(data: dict[str, Any], param: str) -> None:
    """The caps (schema bytes, counts) run before the text walk; a surrogate inside what they measure must
    reach the walk's 400, not raise UnicodeEncodeError (a 500) while being measured. CI's fuzz found one in
    `response_format`."""
    raw = json.dumps(data).encode()  # ensure_ascii: the surrogate travels as \ud800, as a client sends it
    for with_raw in (raw, None):
        error = refuse(parse_json_object(raw), raw=with_raw)
        assert error.status_code == 400 and "surrogate" in error.message, error.message
        assert error.param == param


def test_deep_nesting_is_a_400_naming_the_top_level_field() -> None:
    error = refuse(chat(metadata=json.loads("[" * 100 + "]" * 100)))
    assert error.param == "metadata" and "nests deeper" in error.message


def test_the_string_walk_is_skipped_when_the_body_has_no_surrogate_escape(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[int] = []
    monkeypatch.setattr(limits_module, "_check_strings", lambda data: walked.append(1))
    raw = json.dumps(completion(prompt=["p"] * 64)).encode()
    validate_request(parse_json_object(raw), "completions", limits=LIMITS, models=[MODEL], raw=raw)
    assert walked == []


def test_a_refused_count_never_walks_the_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[int] = []
    monkeypatch.setattr(limits_module, "check_text", lambda data, raw: walked.append(1))
    raw = json.dumps(chat(stop=["s"] * 400_000)).encode()
    assert refuse(parse_json_object(raw), raw=raw).param == "stop"
    assert walked == []


def test_an_unanticipated_exception_in_the_checks_is_a_clean_400_and_an_error_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(data: dict[str, Any], kind: str, limits: LimitsSpec) -> None:
        raise UnicodeEncodeError("utf-8", "secret-internal-text", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(limits_module, "check_costs", broken)
    with caplog.at_level("ERROR"):
        error = refuse(chat())
    assert error.status_code == 400
    assert "secret-internal-text" not in error.message and "Unicode" not in error.message
    logged = [r for r in caplog.records if limits_module.VALIDATION_BUG_LOG in r.getMessage()]
    assert logged and logged[0].exc_info is not None
