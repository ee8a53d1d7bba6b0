"""Bad HTTP input: every bad request gets a 4xx with an OpenAI-style body naming the parameter, never a
5xx or a traceback; limits (413, n, max_tokens, prompt length); only served endpoints; Serve's control
headers have no effect; a client that goes away frees the engines."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import time
from typing import Any, Optional

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from .resilience_helpers import (
    MAX_TOKENS_CAP,
    measured,
    engine_requests,
    error_of,
    node_metrics,
    settled,
    stream_chat,
    total,
    wait_until,
)

from devstack.serve_config import MAX_MODEL_LEN, MODEL_ID
from devstack.stack import LocalStack
from serve_app.frontend.limits import VALIDATION_BUG_LOG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

MSG = [{"role": "user", "content": "hello there"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL_ID, "messages": MSG, "max_tokens": 4, **fields}).encode()


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL_ID, "prompt": "hello", "max_tokens": 4, **fields}).encode()


# (id, path, raw body, status, param the error must name)
KNOWN_BAD = [
    ("body-array", CHAT, b"[]", 400, None),
    ("body-string", CHAT, b'"hello"', 400, None),
    ("body-number", COMPLETIONS, b"42", 400, None),
    ("body-not-json", CHAT, b"{not json", 400, None),
    ("body-nan", CHAT, b'{"model": "tiny", "messages": [], "temperature": NaN}', 400, None),
    ("body-empty", CHAT, b"", 400, None),
    ("body-not-utf8", CHAT, b'{"model": "\xff\xfe"}', 400, None),
    ("messages-number", CHAT, chat(messages=3), 400, "messages"),
    ("messages-null", CHAT, chat(messages=None), 400, "messages"),
    ("messages-true", CHAT, chat(messages=True), 400, "messages"),
    ("messages-empty", CHAT, chat(messages=[]), 400, "messages"),
    ("message-number", CHAT, chat(messages=[5]), 400, "messages.0"),
    ("content-number", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages.0.content"),
    ("role-missing", CHAT, chat(messages=[{"content": "hi"}]), 400, "messages.0.role"),
    ("logprobs-object", CHAT, chat(logprobs={}), 400, "logprobs"),
    ("logprobs-list", CHAT, chat(logprobs=[None]), 400, "logprobs"),
    ("logprobs-string", CHAT, chat(logprobs="yes"), 400, "logprobs"),
    ("logprobs-object-completions", COMPLETIONS, completion(logprobs={}), 400, "logprobs"),
    ("prompt-logprobs-string", CHAT, chat(prompt_logprobs="x"), 400, "prompt_logprobs"),
    ("top-logprobs-negative", CHAT, chat(logprobs=True, top_logprobs=-5), 400, "top_logprobs"),
    ("surrogate", CHAT, b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}', 400,
     "messages.0.content"),
    ("surrogate-prompt", COMPLETIONS, b'{"model": "tiny", "prompt": "\\udfff"}', 400, "prompt"),
    ("n-10000", CHAT, chat(n=10000), 400, "n"),
    ("best-of-1000", COMPLETIONS, completion(best_of=1000), 400, "best_of"),
    ("max-tokens-over-cap", CHAT, chat(max_tokens=MAX_TOKENS_CAP + 1), 400, "max_tokens"),
    ("max-tokens-zero", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-string", CHAT, chat(max_tokens="lots"), 400, "max_tokens"),
    ("prompt-too-long", COMPLETIONS, completion(prompt="hello " * (MAX_MODEL_LEN + 100)), 400, "prompt"),
    ("chat-too-long", CHAT, chat(messages=[{"role": "user", "content": "hello " * (MAX_MODEL_LEN + 100)}]), 400,
     "messages"),
    ("prompt-missing", COMPLETIONS, json.dumps({"model": MODEL_ID}).encode(), 400, "prompt"),
    ("prompt-empty-list", COMPLETIONS, completion(prompt=[]), 400, "prompt"),
    ("prompts-too-many", COMPLETIONS, completion(prompt=["a"] * 1000), 400, "prompt"),
    ("temperature-string", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("stream-options-without-stream", CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options"),
    ("tools-malformed", CHAT, chat(tools=[{"type": "function"}]), 400, "tools.0"),
    ("tool-choice-unknown", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                       tool_choice={"type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("model-lora-suffix", CHAT, chat(model=f"{MODEL_ID}:x"), 404, "model"),
    ("model-unknown", CHAT, chat(model="gpt-4"), 404, "model"),
    ("model-number", CHAT, chat(model=3), 400, "model"),
]


@pytest.mark.parametrize("path,body,status,param", [case[1:] for case in KNOWN_BAD], ids=[c[0] for c in KNOWN_BAD])
def test_known_bad_requests_get_a_4xx_naming_the_parameter(
    http: httpx.Client, path: str, body: bytes, status: int, param: Optional[str]
) -> None:
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["param"] == param, error
    assert "Traceback" not in response.text and "RayTaskError" not in response.text
    if param and error["code"] != "context_length_exceeded":  # that one is vLLM's own message, in tokens
        assert param.split(".")[0] in error["message"], error


def test_body_over_the_limit_gets_413(http: httpx.Client) -> None:
    big = b'{"model": "tiny", "prompt": "' + b"a" * (4 * 1024**2 + 10) + b'"}'
    response = http.post(COMPLETIONS, content=big)
    assert response.status_code == 413, response.text
    assert error_of(response)["code"] == "request_too_large"

    # Without Content-Length (chunked), the guard counts while the body streams in.
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(5):
            yield b"a" * 1024**2
        yield b'"}'

    response = http.post(COMPLETIONS, content=chunks())
    assert response.status_code == 413, response.text


def test_only_served_endpoints_are_routed(http: httpx.Client) -> None:
    for method, path in (("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/v1/embeddings"),
                         ("POST", "/v1/score"), ("POST", "/v1/audio/transcriptions"), ("GET", "/docs"),
                         ("GET", "/openapi.json"), ("GET", "/redoc")):
        response = http.request(method, path, json={"model": MODEL_ID, "prompt": "hi", "input": "hi"})
        assert response.status_code == 404, (path, response.text)
        error_of(response)
    response = http.get(CHAT)
    assert response.status_code == 405, response.text
    error_of(response)


def test_no_cors_for_arbitrary_origins(http: httpx.Client) -> None:
    preflight = http.options(
        CHAT, headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert "access-control-allow-origin" not in preflight.headers
    response = http.post(CHAT, content=chat(), headers={"Origin": "https://evil.example"})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers
    assert "access-control-allow-credentials" not in response.headers


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-request-disconnect-disabled": "?1", "x-request-timeout-seconds": "0"}],
    ids=["plain", "with-serve-control-headers"],
)
def test_client_disconnect_aborts_the_request_on_the_engines(
    stack: LocalStack, http: httpx.Client, headers: dict[str, str]
) -> None:
    """Serve's proxy honours x-request-disconnect-disabled (keep generating after the client left);
    the app ignores it: the engines abort, their running/waiting gauges return to zero."""
    wait_until("idle engines", lambda: engine_requests(stack) == 0, timeout_s=60)
    # Settled: every earlier request is exported (Ray's agent exports every 2 s).
    finished_before = total(settled(stack.cluster.metrics_url("decode")), "ray_vllm_request_success_total")
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "count forever " * 20}],
        "max_tokens": MAX_TOKENS_CAP,
        "stream": True,
        "ignore_eos": True,
    }
    # Each stream's client, context and line iterator stay referenced until the clients leave together:
    # dropping the context or the iterator closes the connection at once (shown with a local server).
    with contextlib.ExitStack() as held:
        readers = []
        for _ in range(3):
            client = held.enter_context(
                httpx.Client(base_url=http.base_url, headers={**http.headers, **headers}, timeout=60)
            )
            response = held.enter_context(client.stream("POST", CHAT, json=body))
            assert response.status_code == 200
            readers.append(response.iter_lines())
            assert next(readers[-1]).startswith("data:")  # the stream is running on an engine
        time.sleep(1)
        closed = time.monotonic()
    # Leaving the block closed every client mid-stream.
    # The engines' gauges reach the exporter every 2 s, later on a loaded machine: the wait is generous, and
    # what tells an abort from a run to the end is the count of finished requests below, not the time.
    wait_until("the engines to drop the abandoned requests", lambda: engine_requests(stack) == 0, timeout_s=60, every_s=0.5)
    measured(f"client disconnect: engines idle {time.monotonic() - closed:.1f} s after the clients left")
    # Aborted, not run to the end: none of them counts as a finished request.
    assert total(node_metrics(stack, "decode"), "ray_vllm_request_success_total") == finished_before


# ---- fuzzing ----

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "a\udfffb", "", " ", MODEL_ID, f"{MODEL_ID}:x", "user", "system", "auto", "none"]),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=12,
)
FIELDS = [
    "model", "messages", "prompt", "n", "best_of", "max_tokens", "max_completion_tokens", "min_tokens",
    "logprobs", "top_logprobs", "prompt_logprobs", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stream", "stream_options", "echo", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "logit_bias", "response_format", "tools", "tool_choice", "user", "suffix", "ignore_eos", "use_beam_search",
    "structured_outputs", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
    "cache_salt", "kv_transfer_params", "request_id", "priority", "skip_special_tokens", "return_token_ids",
]
SMALL_VALID = {
    "n": st.integers(1, 3),
    "max_tokens": st.integers(1, 8),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 5),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "stream": st.booleans(),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=2)),
    "seed": st.integers(0, 2**31),
}
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "bogus"])},
    optional={"content": st.one_of(st.text(max_size=30), JSON_VALUES,
                                   st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=2)),
              "name": JSON_LEAVES, "tool_calls": JSON_VALUES},
)


@st.composite
def request_cases(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "arbitrary-json", "raw-bytes"]))
    if kind == "raw-bytes":
        return path, draw(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(lambda t: t.encode("utf-8", "surrogatepass"))))
    if kind == "arbitrary-json":
        return path, json.dumps(draw(JSON_VALUES)).encode()
    # A valid small request, then some fields replaced by valid-ish or arbitrary values, some removed.
    body: dict[str, Any] = {"model": MODEL_ID, "max_tokens": draw(st.integers(1, 8))}
    if path == CHAT:
        body["messages"] = draw(st.one_of(st.just([{"role": "user", "content": "hello"}]), st.lists(MESSAGE, max_size=3)))
    else:
        body["prompt"] = draw(st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, 3000), min_size=1, max_size=8), JSON_VALUES))
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        strategy = SMALL_VALID.get(field)
        body[field] = draw(strategy if strategy is not None and draw(st.booleans()) else JSON_VALUES)
    for field in draw(st.lists(st.sampled_from(sorted(body)), max_size=1)):
        del body[field]
    # Keep generation small: the fuzz is about input handling, not throughput.
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
        body["max_tokens"] = draw(st.sampled_from([8, body["max_tokens"]]))
    return path, json.dumps(body).encode("utf-8", "surrogatepass")


FUZZ_EXAMPLES = int(os.environ.get("RLD_FUZZ_EXAMPLES", "1000"))
FUZZ_SEED = int(os.environ.get("RLD_FUZZ_SEED", "20261201"))


def replica_traceback(stack: LocalStack, request_id: str, lines: int = 40) -> str:
    """What the replicas logged for `request_id` (the 500's traceback stays in the ingress log, not the body):
    so a CI failure shows its cause before the stack's logs are gone."""
    if not request_id:
        return "(no x-request-id on the response)"
    found: list[str] = []
    for log in sorted((stack.log_dir / "serve").glob("replica_*.log")):
        text = log.read_text(errors="replace").splitlines()
        for n, line in enumerate(text):
            if request_id in line:
                found.append(f"{log.name}: " + "\n".join(text[n:n + lines]))
                break
    return "\n".join(found) or f"(no replica log line names {request_id})"


def validation_bugs(stack: LocalStack) -> list[str]:
    """Replica log lines of validate_request's net: a 400 that hides a defect in the checks (limits.py)."""
    found = []
    for log in sorted((stack.log_dir / "serve").glob("replica_*.log")):
        lines = log.read_text(errors="replace").splitlines()
        found += [f"{log.name}: " + "\n".join(lines[n:n + 40]) for n, line in enumerate(lines) if VALIDATION_BUG_LOG in line]
    return found


def test_fuzzed_requests_never_get_a_5xx(stack: LocalStack, http: httpx.Client) -> None:
    statuses: collections.Counter[int] = collections.Counter()
    failures: list[str] = []
    bugs_before = len(validation_bugs(stack))

    @seed(FUZZ_SEED)
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=request_cases())
    def send(case: tuple[str, bytes]) -> None:
        path, body = case
        with http.stream("POST", path, content=body, headers={"Content-Type": "application/json"}, timeout=120) as response:
            text = response.read().decode("utf-8", "replace")
        statuses[response.status_code] += 1
        problem = None
        if response.status_code >= 500:
            problem = "5xx"
        elif response.status_code >= 400:
            try:
                error_of(response)
            except (AssertionError, ValueError) as exc:
                problem = f"not an OpenAI error body ({exc})"
        elif '"error"' in text and text.startswith("data:"):
            problem = "error event in a 200 stream"
        if "Traceback" in text or "RayTaskError" in text:
            problem = "traceback in the body"
        if problem:
            failure = f"{problem}: {path} {body[:2000]!r} -> {response.status_code} {text[:300]}"
            if response.status_code >= 500:
                named = re.search(r"request id ([0-9A-Za-z-]+)", text)
                rid = named.group(1) if named else response.headers.get("x-request-id", "")
                failure += "\n" + replica_traceback(stack, rid)
            failures.append(failure)

    send()
    sent = sum(statuses.values())
    measured(f"\nfuzz: {sent} requests (seed {FUZZ_SEED}), status histogram {dict(sorted(statuses.items()))}")
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:20])
    assert sent >= FUZZ_EXAMPLES, f"only {sent} requests were sent"
    assert not any(code >= 500 for code in statuses)
    bugs = validation_bugs(stack)[bugs_before:]
    assert not bugs, f"{len(bugs)} bodies hit validate_request's net (a 400, but a defect in limits.py):\n" + "\n".join(bugs[:5])
    # The app is healthy after it: ready, serving, and nothing left running on the engines.
    assert http.get("/health").json()["status"] == "ok"
    outcome = stream_chat(http)
    assert outcome.ok, outcome.describe()
    wait_until("idle engines after the fuzz run", lambda: engine_requests(stack) == 0, timeout_s=60)
