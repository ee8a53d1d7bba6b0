"""Request limits and validation at the ingress: every bad request becomes a 4xx naming the parameter.

Why our own parsing in front of pydantic: vLLM's request models run `mode="before"` validators on the raw
JSON (`data.get(...)`, `prompt_logprobs > 0`, `for msg in messages`), so a body that is `[]`, a
`messages` that is a number, or a `logprobs` that is `{}` raises AttributeError/TypeError inside
validation, which FastAPI does not turn into a 400: the client got a 500 with a Ray traceback. Here the
body is read (bounded), decoded, shape-checked field by field, then validated by the same pydantic
models Ray uses; anything that still raises is a 400 whose `param` is read from the error itself.

Every step is linear in the body and runs once: the body is validated by pydantic exactly once (an
earlier version re-validated it once per top-level field to find the culprit, which made a 45 KB body
with 4000 junk keys block the event loop for 34 s). Before pydantic sees it, the body's top-level key
count and the counts and sizes that cost the engines per token (`stop`, `bad_words`, `logit_bias`,
`tools`, schemas, prompt logprobs) are checked against `limits.*`, so nothing expensive is even parsed
into models.

Also here:
- `RequestGuard`, an ASGI middleware: 413 for bodies over `limits.max_body_bytes` (Content-Length or
  counted while streaming in); Serve's client-controllable control headers are dropped from the scope
  and their effect undone: Serve's proxy honours `x-request-disconnect-disabled: ?1` (keep generating
  after the client left) before any app code runs, so the guard watches for the client's disconnect
  itself and cancels the request, which aborts it on the engines. `x-request-timeout-seconds` can only
  shorten or remove the proxy's own timeout, which this app does not rely on (AppConfig.timeouts).
- Limits on `n`/`best_of`, `max_tokens` (against the context length; `null` means the cap), number of
  messages/prompts, top-level keys, `stop`, `bad_words`, `logit_bias`, `tools`, schema sizes and prompt
  logprobs (`LimitsSpec`).
  Prompt length in tokens is checked by the engine itself (400 `context_length_exceeded`).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Callable, Iterable, Optional, Union

from pydantic import ValidationError

from serve_app.upstream import ChatCompletionRequest, CompletionRequest, sanitize_chat_completion_request
from serve_app.config import LimitsSpec
from serve_app.frontend.errors import OpenAIError, send_error
from serve_app.frontend.patterns import MAX_PATTERN_DEPTH, pattern_depth, pattern_weight, schema_patterns
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

Request = Union[ChatCompletionRequest, CompletionRequest]

# Serve's proxy reads these from client requests (ray/serve/_private/http_util.py) to override its
# timeout and disconnect policy; they are operator knobs, not client ones.
SERVE_CONTROL_HEADERS = frozenset({b"x-request-timeout-seconds", b"x-request-disconnect-disabled"})
MAX_JSON_DEPTH = 64

# JSON types vLLM's before-validators assume for these fields (they compare or index them raw).
_INT = (int,)
_NUMBER = (int, float)
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"),
    "n": (_INT, "an integer"),
    "best_of": (_INT, "an integer"),
    "max_tokens": (_INT, "an integer"),
    "max_completion_tokens": (_INT, "an integer"),
    "min_tokens": (_INT, "an integer"),
    "top_logprobs": (_INT, "an integer"),
    "prompt_logprobs": (_INT, "an integer"),
    "seed": (_INT, "an integer"),
    "top_k": (_INT, "an integer"),
    "temperature": (_NUMBER, "a number"),
    "top_p": (_NUMBER, "a number"),
    "min_p": (_NUMBER, "a number"),
    "frequency_penalty": (_NUMBER, "a number"),
    "presence_penalty": (_NUMBER, "a number"),
    "repetition_penalty": (_NUMBER, "a number"),
    "stream": ((bool,), "a boolean"),
    "echo": ((bool,), "a boolean"),
    "use_beam_search": ((bool,), "a boolean"),
    "add_generation_prompt": ((bool,), "a boolean"),
    "continue_final_message": ((bool,), "a boolean"),
    "stream_options": ((dict,), "an object"),
    "response_format": ((dict,), "an object"),
    "structured_outputs": ((dict,), "an object"),
    "logit_bias": ((dict,), "an object"),
    "chat_template_kwargs": ((dict,), "an object"),
    "tools": ((list,), "an array"),
    "tool_choice": ((str, dict), "a string or an object"),
    "stop": ((str, list), "a string or an array of strings"),
    "cache_salt": ((str,), "a string"),
    "bad_words": ((list,), "an array of strings"),
    "stop_token_ids": ((list,), "an array of token ids"),
    "allowed_token_ids": ((list,), "an array of token ids"),
}
_KIND_FIELD_TYPES: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "chat": {"logprobs": ((bool,), "a boolean")},
    "completions": {"logprobs": (_INT, "an integer")},
}


def invalid(param: Optional[str], message: str, *, code: Optional[str] = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise invalid(None, "The request body is empty; send a JSON object.", code="invalid_json")

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        data = json.loads(raw, parse_constant=reject_constant)
    except UnicodeDecodeError:
        raise invalid(None, "The request body is not valid UTF-8.", code="invalid_json") from None
    except RecursionError:
        raise invalid(None, f"The request body nests deeper than {MAX_JSON_DEPTH} levels.", code="invalid_json") from None
    except ValueError as exc:
        raise invalid(None, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise invalid(
            None, f"The request body must be a JSON object, not {_json_type(data)}.", code="invalid_json"
        )
    return data


def check_text(data: dict[str, Any], raw: Optional[bytes]) -> None:
    """Nesting at most MAX_JSON_DEPTH; no lone UTF-16 surrogate in any string (walked only when the raw body
    has a surrogate escape at all)."""
    _check_nesting(data)
    if raw is None or _MAYBE_SURROGATE.search(raw):
        _check_strings(data)  # only then can a string hold a lone surrogate: the full walk, with paths


# A lone UTF-16 surrogate can only come from a JSON escape (raw UTF-8 cannot encode one).
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _check_nesting(data: Any) -> None:
    """At most MAX_JSON_DEPTH levels of arrays/objects; visits containers only (strings and numbers are
    skipped with one isinstance test each), so a list of 400k strings costs milliseconds."""
    stack: list[tuple[Any, int, Optional[str]]] = [(data, 0, None)]
    while stack:
        value, depth, top = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise invalid(top, f"The request body nests deeper than {MAX_JSON_DEPTH} levels.")
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, (dict, list)):
                    stack.append((item, depth + 1, key if top is None else top))
        else:
            for item in value:
                if isinstance(item, (dict, list)):
                    stack.append((item, depth + 1, top))


def _check_strings(data: Any) -> None:
    """Every string (keys too) must be encodable as UTF-8: JSON allows lone UTF-16 surrogates
    ("\\ud800"), which tokenizers and pickling choke on."""
    stack: list[tuple[Any, tuple[Union[str, int], ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            raise invalid(_dotted(path[:1]), f"The request body nests deeper than {MAX_JSON_DEPTH} levels.")
        if isinstance(value, str):
            _check_utf8(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_utf8(key, path + (key,))
                stack.append((item, path + (key,)))
        elif isinstance(value, list):
            stack.extend((item, path + (i,)) for i, item in enumerate(value))


def _check_utf8(text: str, path: tuple[Union[str, int], ...]) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(
            _dotted(path) or None,
            f"Invalid value for '{_dotted(path)}': contains a lone UTF-16 surrogate (e.g. \\ud800), which is "
            "not valid Unicode text.",
        ) from None


VALIDATION_BUG_LOG = "validation raised an unexpected"


def validate_request(
    data: dict[str, Any],
    kind: str,
    *,
    limits: LimitsSpec,
    models: Iterable[str],
    max_model_len: Optional[int] = None,
    raw: Optional[bytes] = None,
) -> Request:
    """The typed request for `kind` ("chat" | "completions"), or an OpenAIError (400/404).

    Whatever the body, the answer is a 4xx: an exception the checks below did not anticipate is a defect in
    them, triggered by this body alone, so the client gets a 400 (no internal text) and the operator an ERROR
    line with the traceback (`VALIDATION_BUG_LOG`; the resilience fuzz fails on it)."""
    try:
        return _validate_request(data, kind, limits=limits, models=models, max_model_len=max_model_len, raw=raw)
    except OpenAIError:
        raise
    except Exception as exc:  # the net of the docstring's second paragraph
        logger.error(
            "%s %s while checking a %s request body: answered 400. This is a bug in "
            "serve_app/frontend/limits.py; report it with this traceback (the body is not logged).",
            VALIDATION_BUG_LOG, type(exc).__name__, kind, exc_info=True,
        )
        raise invalid(
            None, "The request body could not be validated; check it against the OpenAI API reference.",
            code="invalid_request",
        ) from None


def _validate_request(
    data: dict[str, Any],
    kind: str,
    *,
    limits: LimitsSpec,
    models: Iterable[str],
    max_model_len: Optional[int],
    raw: Optional[bytes],
) -> Request:
    """validate_request's checks, in order.

    Linear in the body: the key count first, then shapes and the per-token cost caps on the raw JSON (counts
    before items: a 400k-entry `stop` is refused without looking at its entries), then nesting and text
    (`raw`, the body as received, lets the surrogate walk be skipped when it cannot find anything), then one
    pydantic validation."""
    if len(data) > limits.max_top_level_keys:
        raise invalid(
            None,
            f"The request body has {len(data)} top-level fields; this endpoint allows at most "
            f"{limits.max_top_level_keys} (limits.max_top_level_keys).",
            code="too_many_fields",
        )
    _check_shapes(data, kind)
    check_costs(data, kind, limits)  # after the shapes: it relies on their types
    check_text(data, raw)
    model = data.get("model")
    served = list(models)
    if model is not None and model not in served:
        raise OpenAIError(
            404,
            f"The model '{model}' does not exist. Available models: {', '.join(served)}.",
            param="model",
            code="model_not_found",
        )
    cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
    request = _pydantic(cls, data)
    if isinstance(request, ChatCompletionRequest):
        try:
            request = sanitize_chat_completion_request(request)
        except (TypeError, ValueError) as exc:
            raise invalid("messages", f"Invalid value for 'messages': {exc}") from None
    _check_limits(request, limits, max_model_len)
    return request


def _check_shapes(data: dict[str, Any], kind: str) -> None:
    types = {**_FIELD_TYPES, **_KIND_FIELD_TYPES[kind]}
    for field, (allowed, described) in types.items():
        value = data.get(field)
        if value is None:
            continue
        # JSON true/false are Python bools, which are ints: only boolean fields take them.
        if isinstance(value, bool) and bool not in allowed:
            raise invalid(field, f"Invalid type for '{field}': expected {described}, got a boolean.")
        if not isinstance(value, allowed):
            raise invalid(field, f"Invalid type for '{field}': expected {described}, got {_json_type(value)}.")
    if kind == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            got = "nothing" if messages is None else _json_type(messages)
            raise invalid("messages", f"'messages' must be a non-empty array of message objects, got {got}.")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise invalid(f"messages.{i}", f"Invalid type for 'messages.{i}': expected an object, got {_json_type(message)}.")
            if not isinstance(message.get("role"), str):
                raise invalid(f"messages.{i}.role", f"'messages.{i}.role' must be a string such as \"user\".")
            content = message.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise invalid(
                    f"messages.{i}.content",
                    f"Invalid type for 'messages.{i}.content': expected a string or an array of content parts, "
                    f"got {_json_type(content)}.",
                )
            if isinstance(content, list) and not all(isinstance(part, dict) for part in content):
                raise invalid(f"messages.{i}.content", f"'messages.{i}.content' parts must be objects.")
    else:
        prompt = data.get("prompt")
        if not _is_prompt(prompt):
            raise invalid(
                "prompt",
                "'prompt' must be a non-empty string, an array of strings, an array of token ids or an "
                f"array of token-id arrays, got {_json_type(prompt) if prompt is not None else 'nothing'}.",
            )
    tools = data.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise invalid(f"tools.{i}", f"'tools.{i}' must be an object with a 'function' object that has a 'name'.")


def _is_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return bool(prompt)
    if not isinstance(prompt, list) or not prompt:
        return False
    if all(isinstance(p, str) and p for p in prompt):
        return True
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return True
    return all(
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt
    )


def _pydantic(cls: type, data: dict[str, Any]) -> Request:
    """One validation, whatever happens: the culprit is read from the error, never searched for."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        param, message = _describe_validation_error(exc, data)
        raise invalid(param, message) from None
    except Exception as exc:  # noqa: BLE001 - vLLM's validators raise anything on odd input
        text = _one_line(exc)
        param = getattr(exc, "parameter", None) or param_in_message(text, data)
        what = f"'{param}'" if param else "the request"
        logger.info("request validation raised %s: %s (param %s)", type(exc).__name__, text, param)
        raise invalid(param, f"Invalid value for {what}: {text.rstrip('.')}.") from None


def _describe_validation_error(exc: ValidationError, data: dict[str, Any]) -> tuple[Optional[str], str]:
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {}
    if first.get("type", "").endswith("_type"):
        # A union (`stop: str | list[str]`) reports one error per branch, the branch the value is not first
        # ("Input should be a valid string" for a list of 5): say what is wrong with the branch it is.
        field = first.get("loc", ())[:1]
        first = next((e for e in errors if e.get("loc", ())[:1] == field and not e.get("type", "").endswith("_type")),
                     first)
    cause = (first.get("ctx") or {}).get("error")
    message = str(cause) if cause is not None else str(first.get("msg", "invalid value"))
    message = _one_line(re.sub(r"^Value error, ", "", message)).rstrip(".")
    param = (
        getattr(cause, "parameter", None)
        or _data_path(first.get("loc", ()), data)
        or param_in_message(message, data)
    )
    return param, f"Invalid value for '{param}': {message}." if param else f"Invalid request: {message}."


MAX_ERROR_CHARS = 300
_BACKTICKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _one_line(exc_or_text: Any) -> str:
    """The first line of an error, at most MAX_ERROR_CHARS: what a client may read of a validator's message."""
    text = str(exc_or_text).strip()
    first = text.splitlines()[0] if text else "invalid value"
    return first[:MAX_ERROR_CHARS]


def param_in_message(message: str, data: dict[str, Any]) -> Optional[str]:
    """The top-level field a validator's message names: the first `backticked` name that is a field of the
    body, else the first bare word that is. Linear in the message (bounded) and one dict lookup per word;
    never re-validates."""
    text = message[: MAX_ERROR_CHARS * 4]
    for pattern in (_BACKTICKED, _WORD):
        for match in pattern.finditer(text):
            name = match.group(1) if pattern is _BACKTICKED else match.group(0)
            if name in data:
                return name
    return None


def _data_path(loc: Iterable[Any], data: Any) -> Optional[str]:
    """`loc` of a pydantic error without union-branch tags: the path as it is in the client's JSON."""
    path: list[Union[str, int]] = []
    current = data
    for part in loc:
        if isinstance(current, dict) and isinstance(part, str) and part in current:
            path.append(part)
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            path.append(part)
            current = current[part]
    return _dotted(tuple(path)) or None


def check_costs(data: dict[str, Any], kind: str, limits: LimitsSpec) -> None:
    """The fields whose size costs the engines per token or per request, on the raw (shape-checked) JSON:
    counts first (O(1)), then sizes (linear), before pydantic parses any of it."""
    stop = data.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    if len(stops) > limits.max_stop:
        raise invalid("stop", f"{len(stops)} stop sequences; this endpoint allows at most {limits.max_stop} (limits.max_stop).")
    for i, item in enumerate(stops):
        if not isinstance(item, str):
            raise invalid(f"stop.{i}", f"Invalid type for 'stop.{i}': expected a string, got {_json_type(item)}.")
        if len(item) > limits.max_stop_chars:
            raise invalid(
                "stop", f"'stop.{i}' has {len(item)} characters; this endpoint allows at most {limits.max_stop_chars}."
            )
    messages, prompt = data.get("messages"), data.get("prompt")
    if kind == "chat" and isinstance(messages, list) and len(messages) > limits.max_messages:
        raise invalid("messages", f"{len(messages)} messages; this endpoint allows at most {limits.max_messages}.")
    if kind == "completions" and isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) > limits.max_prompts:
            raise invalid("prompt", f"{len(prompt)} prompts in one request; this endpoint allows at most {limits.max_prompts}.")
    counted = (
        ("logit_bias", limits.max_logit_bias, "entries", "limits.max_logit_bias"),
        ("bad_words", limits.max_bad_words, "words", "limits.max_bad_words"),
        ("tools", limits.max_tools, "tools", "limits.max_tools"),
    )
    for field, cap, unit, knob in counted:
        value = data.get(field)
        if value is not None and len(value) > cap:
            raise invalid(field, f"'{field}' has {len(value)} {unit}; this endpoint allows at most {cap} ({knob}).")
    for i, word in enumerate(data.get("bad_words") or []):
        if not isinstance(word, str):
            raise invalid(f"bad_words.{i}", f"Invalid type for 'bad_words.{i}': expected a string, got {_json_type(word)}.")
    if data.get("tools") == []:
        raise invalid("tools", "'tools' must not be an empty array; omit it or send at least one tool.")
    schemas = [(field, data[field]) for field in ("response_format", "structured_outputs") if data.get(field) is not None]
    for i, tool in enumerate(data.get("tools") or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("parameters") is not None:
            schemas.append((f"tools.{i}.function.parameters", function["parameters"]))
    for param, schema in schemas:
        _check_schema_size(param, schema, limits)
    _check_patterns(schemas, limits)
    _check_prompt_logprobs(data, kind, limits)


def _check_patterns(schemas: list[tuple[str, Any]], limits: LimitsSpec) -> None:
    """The schemas' regular expressions share one budget of unrolled repetitions (serve_app/frontend/patterns.py)."""
    total = chars = 0
    for field, value in schemas:
        for path, pattern in schema_patterns(value, field):
            path = path if len(path) <= 200 else path[:197] + "..."
            chars += len(pattern)
            if chars > limits.max_schema_bytes:  # weighing costs the frontend linear time: bound the text too
                raise invalid(path, f"This request's schemas hold {chars} characters of regular expressions up to "
                              f"'{path}'; this endpoint allows at most {limits.max_schema_bytes} (limits.max_schema_bytes).")
            if pattern_depth(pattern) > MAX_PATTERN_DEPTH:
                raise invalid(path, f"The regular expression at '{path}' nests groups deeper than "
                              f"{MAX_PATTERN_DEPTH} levels.")
            weight = pattern_weight(pattern)
            total += weight
            if total > limits.max_pattern_repeat:
                raise invalid(
                    path,
                    f"The regular expression at '{path}' unrolls into {weight} repetitions and this request's "
                    f"schemas into {total} so far; this endpoint allows at most {limits.max_pattern_repeat} "
                    "(limits.max_pattern_repeat; `{m,n}` counts n, nested counts multiply). Bound lengths with "
                    "minLength/maxLength instead of counted repetitions.",
                )


def _check_schema_size(param: str, value: Any, limits: LimitsSpec) -> None:
    # The caps run before check_text, so client text may still hold lone surrogates here: count them
    # (surrogatepass) rather than fail on them; check_text then refuses them with a 400 naming the path.
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > limits.max_schema_bytes:
        raise invalid(
            param,
            f"'{param}' is {size} bytes as JSON; this endpoint allows at most {limits.max_schema_bytes} "
            "(limits.max_schema_bytes).",
        )


def prompt_logprobs_asked(data: dict[str, Any], kind: str) -> tuple[Optional[str], Optional[int]]:
    """(the field that asks, how many per prompt token) for prompt logprobs, as vLLM derives them:
    `prompt_logprobs`, else with `echo` the chat request's `top_logprobs` (0 when absent: chat echo alone
    computes them) or the completions request's `logprobs`."""
    if data.get("prompt_logprobs") is not None:
        return "prompt_logprobs", data["prompt_logprobs"]
    if data.get("echo"):
        if kind == "chat":
            value = data.get("top_logprobs", 0)
        else:
            value = data.get("logprobs")
        if value is not None:
            return "echo", value
    return None, None


def _check_prompt_logprobs(data: dict[str, Any], kind: str, limits: LimitsSpec) -> None:
    field, value = prompt_logprobs_asked(data, kind)
    if field is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        return  # a wrong type is pydantic's to report
    if limits.max_prompt_logprobs == 0:
        how = "'prompt_logprobs'" if field == "prompt_logprobs" else "'echo' with logprobs"
        raise invalid(
            field,
            f"Prompt logprobs ({how}) are disabled on this endpoint (limits.max_prompt_logprobs is 0)"
            + (": send 'top_logprobs': null with 'echo'." if field == "echo" and kind == "chat" else "."),
        )
    if value < 0 or value > limits.max_prompt_logprobs:
        raise invalid(
            field,
            f"Prompt logprobs of {value} per token; this endpoint allows 0 to {limits.max_prompt_logprobs} "
            "(limits.max_prompt_logprobs).",
        )


def _check_limits(request: Request, limits: LimitsSpec, max_model_len: Optional[int]) -> None:
    for field in ("n", "best_of"):
        value = getattr(request, field, None)
        if value is not None and value > limits.max_n:
            raise invalid(field, f"'{field}' is {value}; this endpoint allows at most {limits.max_n}.")
    if isinstance(request, ChatCompletionRequest):
        if len(request.messages) > limits.max_messages:
            raise invalid("messages", f"{len(request.messages)} messages; this endpoint allows at most {limits.max_messages}.")
    else:
        prompt = request.prompt
        count = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
        if count > limits.max_prompts:
            raise invalid("prompt", f"{count} prompts in one request; this endpoint allows at most {limits.max_prompts}.")
    caps = [c for c in (limits.max_tokens, max_model_len) if c]
    cap = min(caps) if caps else None
    for field in ("max_tokens", "max_completion_tokens"):
        value = getattr(request, field, None)
        if value is None:
            continue
        if value < 1:
            raise invalid(field, f"'{field}' must be at least 1, got {value}.")
        if cap is not None and value > cap:
            why = "the context length" if cap == max_model_len and cap != limits.max_tokens else "this endpoint's limit"
            raise invalid(field, f"'{field}' is {value}, more than {why} ({cap} tokens).")
    if limits.max_tokens and getattr(request, "max_tokens", None) is None and getattr(
        request, "max_completion_tokens", None
    ) is None:
        # Unset (absent or null) means "up to the context" for vLLM; with an operator cap, the cap is the default.
        if isinstance(request, ChatCompletionRequest):
            request.max_completion_tokens = limits.max_tokens
        else:
            request.max_tokens = limits.max_tokens


def requested_max_tokens(request: Request) -> Optional[int]:
    """The output cap the engines will apply to `request` (after `validate_request`), None when unbounded
    (no limits.max_tokens and none asked: up to the context)."""
    values = [getattr(request, f, None) for f in ("max_completion_tokens", "max_tokens")]
    values = [v for v in values if isinstance(v, int)]
    return min(values) if values else None


def sequences(request: Request) -> int:
    """How many sequences the engines run for `request`: prompts x max(n, best_of) (admission's weight)."""
    if isinstance(request, ChatCompletionRequest):
        prompts = 1
    else:
        prompt = request.prompt
        prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    n = max(getattr(request, "n", None) or 1, getattr(request, "best_of", None) or 1)
    return prompts * n


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _dotted(path: tuple[Union[str, int], ...]) -> str:
    return ".".join(str(p) for p in path)


class BodyTooLarge(Exception):
    pass


class BodyTimeout(Exception):
    pass


def _live(value: Any) -> Any:
    """A limit given as a value or as a callable reading the app's live limits."""
    return value() if callable(value) else value


class RequestGuard:
    """ASGI middleware: body-size limit (413), body-read deadline (408), Serve control headers dropped, cancel on
    client disconnect."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: Union[int, Callable[[], int]],
        body_read_timeout_s: Union[float, Callable[[], float]] = 30.0,
    ) -> None:
        self.app = app
        self._max_body_bytes = max_body_bytes
        self._body_read_timeout_s = body_read_timeout_s

    @property
    def max_body_bytes(self) -> int:
        """The limit now (a callable is the app's live limits, read per request)."""
        return _live(self._max_body_bytes)

    @property
    def body_read_timeout_s(self) -> float:
        return _live(self._body_read_timeout_s)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        dropped = [name for name, _ in headers if name.lower() in SERVE_CONTROL_HEADERS]
        if dropped:
            scope = {**scope, "headers": [(n, v) for n, v in headers if n.lower() not in SERVE_CONTROL_HEADERS]}
            logger.info("dropped Serve control header(s) %s from a client request", [d.decode() for d in dropped])
        request_id = _header(scope, b"x-request-id")
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await send_error(send, self._too_large())
            return
        await self._run(scope, receive, send, request_id)

    def _too_large(self) -> OpenAIError:
        return OpenAIError(
            413,
            f"The request body is larger than {self.max_body_bytes} bytes (limits.max_body_bytes).",
            code="request_too_large",
        )

    def _too_slow(self, timeout_s: float, received: int) -> OpenAIError:
        return OpenAIError(
            408,
            f"The request body did not arrive within {timeout_s:g} s ({received} bytes came; "
            "limits.body_read_timeout_s). Send the whole body at once.",
            code="request_timeout",
        )

    async def _run(self, scope: dict, receive: Any, send: Any, request_id: Optional[str]) -> None:
        body_done = asyncio.Event()
        disconnected = asyncio.Event()
        received = 0
        started = False
        finished = False
        timeout_s = self.body_read_timeout_s
        loop = asyncio.get_running_loop()
        body_deadline: Optional[float] = None  # set by the first read of the body

        async def app_receive() -> dict:
            nonlocal received, body_deadline
            if body_done.is_set():
                # After the body, the only message left is the disconnect, which the watcher owns.
                await disconnected.wait()
                return {"type": "http.disconnect"}
            if body_deadline is None:
                body_deadline = loop.time() + timeout_s
            try:
                message = await asyncio.wait_for(receive(), timeout=max(body_deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise BodyTimeout() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge()
                if not message.get("more_body", False):
                    body_done.set()
            elif message["type"] == "http.disconnect":
                disconnected.set()
                body_done.set()
            return message

        async def app_send(message: dict) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, app_receive, app_send))

        async def watch_disconnect() -> None:
            await body_done.wait()
            while not disconnected.is_set():
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
            if not task.done():
                logger.info("client disconnected; cancelling request %s on the engines", request_id)
                task.cancel()

        watcher = asyncio.ensure_future(watch_disconnect())
        try:
            await task
        except BodyTooLarge:
            if not started:
                await send_error(send, self._too_large())
        except BodyTimeout:
            logger.info("request %s: body not received within %g s (%d bytes came); answered 408",
                        request_id, timeout_s, received)
            if not started:
                await send_error(send, self._too_slow(timeout_s, received), close_connection=True)
        except asyncio.CancelledError:
            if not disconnected.is_set():
                raise  # cancelled from outside (Serve's own disconnect handling): nothing more to say
            # The client is gone; end the exchange cleanly for the proxy.
            if not started:
                await send({"type": "http.response.start", "status": 499, "headers": []})
            if not finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()


def _header(scope: dict, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
