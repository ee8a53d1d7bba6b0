"""serve_app.frontend.limits.RequestGuard, the outermost body guard, on pure ASGI: a body over the size limit gets
413, a body that does not arrive within `limits.body_read_timeout_s` gets 408 (a trickled body held its connection
for as long as the client liked), a client that leaves cancels the request. No server needed: receive/send are
the ASGI callables a server would pass."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from serve_app.frontend.limits import RequestGuard


async def echo_app(scope: dict, receive: Any, send: Any) -> None:
    """Reads the whole body as an ASGI app does (FastAPI's request.body()), answers its length."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    payload = json.dumps({"bytes": len(body)}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})


def _scope(content_length: int | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}


def _run(guard: RequestGuard, chunks: list[tuple[float, bytes]], *, hold_s: float = 30) -> tuple[int, dict, float]:
    """Send `chunks` (delay before each, bytes; the last ends the body) to the guard; then the connection stays
    open `hold_s`. Returns the status, the JSON body (its headers under "_headers") and the seconds until the
    response started."""
    sent: list[dict] = []

    async def scenario() -> float:
        started = time.monotonic()
        queue: asyncio.Queue = asyncio.Queue()

        async def feed() -> None:
            for i, (delay, data) in enumerate(chunks):
                await asyncio.sleep(delay)
                await queue.put({"type": "http.request", "body": data, "more_body": i < len(chunks) - 1})
            await asyncio.sleep(hold_s)
            await queue.put({"type": "http.disconnect"})

        async def receive() -> dict:
            return await queue.get()

        first: list[float] = []

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                first.append(time.monotonic() - started)
            sent.append(message)

        feeder = asyncio.ensure_future(feed())
        try:
            await asyncio.wait_for(guard(_scope(), receive, send), timeout=20)
        finally:
            feeder.cancel()
        return first[0]

    took = asyncio.run(scenario())
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {**(json.loads(body) if body else {}), "_headers": dict(start["headers"])}, took


def test_a_body_sent_in_time_reaches_the_app() -> None:
    guard = RequestGuard(echo_app, max_body_bytes=1024 * 1024, body_read_timeout_s=2.0)
    status, body, _ = _run(guard, [(0.0, b"{" + b" " * 100), (0.1, b" " * 100), (0.1, b"}")], hold_s=0.5)
    assert (status, body["bytes"]) == (200, 202)


def test_a_trickled_body_gets_408_at_the_deadline_naming_the_knob() -> None:
    guard = RequestGuard(echo_app, max_body_bytes=1024 * 1024, body_read_timeout_s=lambda: 0.5)
    # one byte every 0.2 s, never ending within the deadline (the client would go on for minutes)
    status, body, took = _run(guard, [(0.2, b"x")] * 40)
    assert status == 408, body
    assert 0.45 <= took < 2.0, took
    error = body["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert "limits.body_read_timeout_s" in error["message"] and "0.5 s" in error["message"]
    # the rest of the body is not worth reading: the server closes the connection after the answer
    assert body["_headers"].get(b"connection") == b"close"


def test_a_body_that_never_starts_gets_408_too() -> None:
    guard = RequestGuard(echo_app, max_body_bytes=1024, body_read_timeout_s=0.3)
    status, body, took = _run(guard, [(5.0, b"{}")])
    assert status == 408 and took < 1.5, (status, took)
    assert "0 bytes came" in body["error"]["message"]


def test_the_deadline_is_for_the_whole_body_not_each_read() -> None:
    # every read comes within 0.2 s, but the body takes 1.0 s in all: past a 0.6 s deadline
    guard = RequestGuard(echo_app, max_body_bytes=1024 * 1024, body_read_timeout_s=0.6)
    status, _, took = _run(guard, [(0.2, b"x")] * 5 + [(0.0, b"")])
    assert status == 408 and took < 1.2, (status, took)


def test_the_size_limit_still_answers_413() -> None:
    guard = RequestGuard(echo_app, max_body_bytes=1024, body_read_timeout_s=5.0)
    status, body, _ = _run(guard, [(0.0, b"x" * 800), (0.0, b"x" * 800)], hold_s=0.2)
    assert status == 413 and "limits.max_body_bytes" in body["error"]["message"]
