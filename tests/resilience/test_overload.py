"""Admission control and overflow: a bounded queue per ingress (429 + Retry-After beyond it), and an
external OpenAI-compatible endpoint that takes requests when the cluster is saturated or a role is down."""

from __future__ import annotations

import collections
import concurrent.futures
import json
from pathlib import Path

import httpx
import pytest
from .resilience_helpers import (
    EXTERNAL_KEY,
    MAIN_ADMISSION,
    MAIN_OVERFLOW_CAP,
    Outcome,
    cluster_metrics,
    error_of,
    measured,
    stream_chat,
    total,
    wait_until,
)

from devstack.serve_config import MODEL_ID
from devstack.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

LONG = 400  # tokens: long enough that the first requests of a burst still run when the last arrive


def overflowed(stack: LocalStack, **labels: str) -> float:
    return total(cluster_metrics(stack), "ray_rld_overflow_requests_total", **labels)


def test_saturation_overflows_then_queues_then_answers_429(stack: LocalStack, http: httpx.Client) -> None:
    """main: 8 run, overflow takes 2 to the external endpoint, 4 wait in the queue, the rest get 429."""
    in_flight, queued = MAIN_ADMISSION["max_in_flight"], MAIN_ADMISSION["max_queued"]
    extra = 3
    burst = in_flight + MAIN_OVERFLOW_CAP + queued + extra
    before = overflowed(stack, reason="saturated", outcome="ok")

    def long_stream(_: int) -> Outcome:
        # Short prompt (decode prefills it: no prefill role involved), long generation: slots stay taken.
        return stream_chat(http, prompt="tell me a story", max_tokens=LONG, extra={"ignore_eos": True})

    with concurrent.futures.ThreadPoolExecutor(burst) as pool:
        outcomes = list(pool.map(long_stream, range(burst)))

    kinds = collections.Counter(
        o.backend if o.status == 200 else o.status for o in outcomes
    )
    details = "\n".join(o.describe() for o in outcomes)
    measured(f"\nsaturation burst of {burst}: {dict(kinds)} (cluster / external overflow / 429)")
    assert kinds == {"cluster": in_flight + queued, "external": MAIN_OVERFLOW_CAP, 429: extra}, f"{kinds}\n{details}"
    for outcome in outcomes:
        if outcome.status == 200:
            assert outcome.ok, outcome.describe()
            first = json.loads(outcome.events[0])
            assert first["model"] == MODEL_ID  # the external endpoint's name is mapped back
        else:
            body = json.loads(outcome.error or "{}")
            assert body["error"]["code"] == "overloaded", outcome.error
    wait_until(
        "the overflowed requests in ray_rld_overflow_requests_total",
        lambda: overflowed(stack, reason="saturated", outcome="ok") >= before + MAIN_OVERFLOW_CAP,
        timeout_s=30,
    )


def test_429_carries_retry_after(stack: LocalStack, http: httpx.Client) -> None:
    in_flight, queued = MAIN_ADMISSION["max_in_flight"], MAIN_ADMISSION["max_queued"]
    burst = in_flight + MAIN_OVERFLOW_CAP + queued + 1

    def long_completion(_: int) -> httpx.Response:
        body = {"model": MODEL_ID, "prompt": "once upon a time", "max_tokens": LONG, "ignore_eos": True}
        return http.post("/v1/completions", json=body)

    with concurrent.futures.ThreadPoolExecutor(burst) as pool:
        responses = list(pool.map(long_completion, range(burst)))
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected, [r.status_code for r in responses]
    for response in rejected:
        assert response.headers["retry-after"] == str(MAIN_ADMISSION["retry_after_s"])
        assert error_of(response)["code"] == "overloaded"
    assert all(r.status_code in (200, 429) for r in responses), [r.status_code for r in responses]


def test_role_down_overflows_when_on_and_answers_503_when_off(stack: LocalStack, http: httpx.Client) -> None:
    """The same unplaceable roles, overflow on (/unplaced-ovf) vs off (/unplaced)."""
    before = overflowed(stack, reason="decode_unavailable", outcome="ok")
    streamed = stream_chat(http, "/unplaced-ovf/v1/chat/completions", prompt="hello", max_tokens=6)
    assert streamed.ok and streamed.backend == "external", streamed.describe()
    assert all(json.loads(e)["model"] == MODEL_ID for e in streamed.events[:-1])

    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
    whole = http.post("/unplaced-ovf/v1/chat/completions", json=body)
    assert whole.status_code == 200 and whole.headers["x-rld-backend"] == "external", whole.text
    assert whole.json()["model"] == MODEL_ID and whole.json()["usage"]["completion_tokens"] == 6
    completion = http.post("/unplaced-ovf/v1/completions", json={"model": MODEL_ID, "prompt": "hi", "max_tokens": 3})
    assert completion.status_code == 200 and completion.headers["x-rld-backend"] == "external", completion.text

    off = http.post("/unplaced/v1/chat/completions", json=body)
    assert off.status_code == 503 and error_of(off)["code"] == "decode_unavailable", off.text
    wait_until(
        "3 role-unavailable overflows counted",
        lambda: overflowed(stack, reason="decode_unavailable", outcome="ok") >= before + 3,
        timeout_s=30,
    )


def test_overflow_that_fails_falls_back_to_the_normal_answer(
    stack: LocalStack, http: httpx.Client, overflow_key_file: Path
) -> None:
    """The external endpoint rejects our key (a rotated Secret): not the client's problem; the request
    gets what it would have got without overflow (here 503 naming the role), and it is counted."""
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
    before = overflowed(stack, outcome="failed")
    try:
        overflow_key_file.write_text("a-key-the-external-endpoint-does-not-know\n")
        wait_until(
            "the app to pick up the changed key file",
            lambda: http.post("/unplaced-ovf/v1/chat/completions", json=body).status_code == 503,
            timeout_s=30,
        )
        response = http.post("/unplaced-ovf/v1/chat/completions", json=body)
        assert response.status_code == 503 and error_of(response)["code"] == "decode_unavailable"
        assert response.headers["retry-after"]
    finally:
        overflow_key_file.write_text(EXTERNAL_KEY + "\n")
    wait_until("failed overflows counted", lambda: overflowed(stack, outcome="failed") > before, timeout_s=30)
    wait_until(
        "overflow to work again with the right key",
        lambda: http.post("/unplaced-ovf/v1/chat/completions", json=body).status_code == 200,
        timeout_s=30,
    )
