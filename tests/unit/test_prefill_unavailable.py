"""Decode's answer when a request can be prefilled neither on a prefill replica nor locally
(serve_app/engine/failover.py -> serve_app/frontend/errors.py): the client gets a 503 that says what ran out
and when to retry — not "the engine failed" (nothing failed: prefill is at capacity or down) — and nothing
internal (replica ids, exception text stay in decode's log)."""

from __future__ import annotations

import json

import pytest

from serve_app.frontend.errors import (
    PREFILL_UNAVAILABLE_TYPE,
    EngineUnavailable,
    OpenAIError,
    prefill_unavailable_response,
)
from serve_app.upstream import ErrorInfo, ErrorResponse

WHAT = "completions request for model 'tiny'"


@pytest.mark.parametrize("reason, says", [
    ("routing_timeout", "every prefill replica is at capacity"),
    ("prefill_unavailable", "no running replica"),
    ("timeout", "not answering in time"),
    ("kv_peer_lost", "went away before decode loaded it"),
    ("kv_timeout", "transfer from the prefill replica stalled"),
    ("replica_failed", "failing"),
    ("no_healthy_replica", "failing"),
    ("something_new", "failing"),
])
@pytest.mark.parametrize("fallback_full", [True, False])
def test_the_client_learns_what_ran_out_and_when_to_retry(reason: str, says: str, fallback_full: bool) -> None:
    response = prefill_unavailable_response(reason, 17, fallback_full=fallback_full)
    error = OpenAIError.from_engine(response, WHAT)
    assert not isinstance(error, EngineUnavailable)  # not "the engine failed"
    assert error.status_code == 503 and error.headers() == {"Retry-After": "17"}
    body = error.body()["error"]
    assert body["code"] == PREFILL_UNAVAILABLE_TYPE
    assert body["message"].startswith(f"{WHAT}: No prefill capacity for this request: ")
    assert says in body["message"] and "Retry after 17 s" in body["message"]
    assert ("decode is already prefilling" in body["message"]) is fallback_full
    assert "engine failed" not in body["message"]


def test_the_answer_survives_the_sse_path() -> None:
    """A streamed request's error reaches the frontend as vLLM's in-band `data: {"error": ...}` string."""
    response = prefill_unavailable_response("routing_timeout", 9, fallback_full=True)
    again = ErrorResponse.model_validate(json.loads(response.model_dump_json()))
    error = OpenAIError.from_engine(again, WHAT)
    assert error.status_code == 503 and error.headers() == {"Retry-After": "9"}
    assert error.body()["error"]["code"] == PREFILL_UNAVAILABLE_TYPE


def test_internal_text_under_that_type_is_not_passed_on() -> None:
    leaky = ErrorResponse(error=ErrorInfo(
        message="Traceback (most recent call last):\n  File \"/x.py\", line 1", type=PREFILL_UNAVAILABLE_TYPE, code=503,
    ))
    error = OpenAIError.from_engine(leaky, WHAT)
    body = error.body()["error"]
    assert "Traceback" not in body["message"] and "/x.py" not in body["message"]
    assert error.status_code == 503 and error.headers() == {"Retry-After": "10"}  # no retry_after_s: the default


def test_other_engine_5xx_still_read_as_a_failed_engine() -> None:
    error = OpenAIError.from_engine(ErrorResponse(error=ErrorInfo(message="boom", type="InternalServerError", code=500)), WHAT)
    assert isinstance(error, EngineUnavailable) and "the engine failed" in error.message
