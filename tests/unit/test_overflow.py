"""serve_app.frontend.overflow: what is sent (an allow-list, always a max_tokens), where (https unless loopback),
and how much comes back (bounded in bytes and time). Pure: no network, a fake upstream."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

import pytest
from pydantic import ValidationError

from serve_app.config import OverflowSpec
from serve_app.frontend.overflow import ResponseTooLarge, bounded_events, forward_body, sse_data

HOSTILE_EXTRAS = {
    "service_tier": "priority", "store": True, "metadata": {"k": "v"}, "reasoning_effort": "high",
    "web_search_options": {}, "prediction": {"type": "content"}, "kv_transfer_params": {"remote_host": "10.0.0.1"},
    "bad_words": ["x"], "cache_salt": "s", "user": "someone",
}


def test_only_allow_listed_fields_are_forwarded_and_max_tokens_is_always_set() -> None:
    data = {"model": "ours", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "max_tokens": None,
            **HOSTILE_EXTRAS}
    body = forward_body("chat", data, model="theirs", max_tokens=77)
    assert body == {"model": "theirs", "messages": data["messages"], "temperature": 0.2, "stream": True,
                    "stream_options": {"include_usage": True}, "max_completion_tokens": 77}


def test_completions_forward_their_own_fields() -> None:
    data = {"model": "ours", "prompt": "hi", "echo": True, "logprobs": 1, "max_tokens": 5, **HOSTILE_EXTRAS}
    body = forward_body("completions", data, model="theirs", max_tokens=5)
    assert body == {"model": "theirs", "prompt": "hi", "echo": True, "logprobs": 1, "max_tokens": 5}


@pytest.mark.parametrize("url", ["http://api.example.com/v1", "http://10.0.0.1:8000/v1", "http://localhost.evil.com/v1"])
def test_cleartext_base_urls_are_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="https"):
        OverflowSpec(enabled=True, base_url=url)


@pytest.mark.parametrize("url", ["https://api.example.com/v1", "http://127.0.0.1:8001/v1", "http://localhost:9/v1",
                                 "http://[::1]:8000/v1"])
def test_https_or_loopback_is_accepted(url: str) -> None:
    OverflowSpec(enabled=True, base_url=url)


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def collect(stream: AsyncIterator[str]) -> list[str]:
    return [item async for item in stream]


def test_sse_events_are_reassembled_across_chunks_and_lines() -> None:
    stream = chunks(b'data: {"a":', b' 1}\n\ndata: line one\ndata: line two\n\n: comment\n\nda', b"ta: [DONE]\n\n")
    assert asyncio.run(collect(sse_data(stream, max_bytes=1024))) == ['{"a": 1}', "line one\nline two", "[DONE]"]


def test_an_upstream_over_the_byte_bound_is_cut() -> None:
    stream = chunks(*([b"data: " + b"x" * 100 + b"\n\n"] * 100))
    with pytest.raises(ResponseTooLarge):
        asyncio.run(collect(sse_data(stream, max_bytes=5000)))


def test_one_endless_line_is_cut_at_the_event_bound() -> None:
    stream = chunks(*([b"x" * 1000] * 100))  # no newline ever
    with pytest.raises(ResponseTooLarge):
        asyncio.run(collect(sse_data(stream, max_bytes=10**9, max_event_bytes=10_000)))


class FakeUpstream:
    def __init__(self, parts: list[bytes], delay_s: float = 0.0) -> None:
        self._parts, self._delay_s = parts, delay_s
        self.closed = False

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            await asyncio.sleep(self._delay_s)
            yield part

    async def aclose(self) -> None:
        self.closed = True


def test_events_are_renamed_and_end_with_done() -> None:
    upstream = FakeUpstream([b'data: {"model": "theirs", "x": 1}\n\n', b"data: [DONE]\n\n"])

    async def go() -> list[str]:
        loop = asyncio.get_running_loop()
        return await collect(bounded_events(upstream, "ours", deadline=loop.time() + 10, max_bytes=10_000))  # type: ignore[arg-type]

    events = asyncio.run(go())
    assert json.loads(events[0][len("data: "):]) == {"model": "ours", "x": 1}
    assert events[-1] == "data: [DONE]\n\n" and upstream.closed


def test_a_slow_upstream_is_cut_at_the_deadline_with_an_error_event() -> None:
    upstream = FakeUpstream([b'data: {"x": 1}\n\n'] * 1000, delay_s=0.05)

    async def go() -> tuple[list[str], float]:
        import time

        start = time.monotonic()
        events = await collect(bounded_events(upstream, "ours", deadline=start + 0.3, max_bytes=10**9))  # type: ignore[arg-type]
        return events, time.monotonic() - start

    events, took = asyncio.run(go())
    assert took < 5
    assert '"error"' in events[-2] and events[-1] == "data: [DONE]\n\n"
    assert upstream.closed
    assert len(events) < 1000
