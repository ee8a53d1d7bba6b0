"""Overflow ("hybrid routing"): forward a request to an external OpenAI-compatible endpoint when this
cluster is saturated or a serving role is down, instead of queueing it or answering 429/503.

- Off by default (OverflowSpec.enabled). The external key comes from a file (a mounted Secret, re-read
  when it changes) or an env var, never from the config itself.
- Triggers: `on_saturation` (a request would wait in the admission queue and `queue_threshold`
  requests already wait) and `on_role_unavailable` (decode, or prefill without local fallback, has
  no running replica). At most `max_in_flight` overflowed requests per ingress replica; beyond that
  requests take the normal path (queue, 429, 503).
- `model_map` renames our model id to the external one, and the responses are renamed back, so a
  client sees the model it asked for. Streams are passed through event by event.
- Every response says who served it: header `x-rld-backend: cluster|external`. Counted in
  ray_rld_overflow_requests_total{reason, outcome}.
- What is sent is built, not copied: `forward_body` takes only the OpenAI fields listed in
  `FORWARDED_FIELDS` from the validated request (never `service_tier`, `store`, `metadata`, vLLM's
  extensions...), and always sets the output cap (the client's, limits.max_tokens, or
  overflow.max_tokens). The base URL must be https (loopback excepted: config.OverflowSpec).
- The response is bounded: overflow.timeout_s in all, overflow.max_response_bytes in size, one SSE event
  at most MAX_EVENT_BYTES; past a bound the stream ends with an error event and [DONE].
- A failure to reach the external endpoint (connection, timeout, 5xx before any byte was sent to the
  client) is not the client's problem: the request falls back to the path it would have taken
  without overflow. 4xx from the external endpoint are passed through (the request itself is bad).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, AsyncIterator, Optional

import httpx
from fastapi.responses import JSONResponse, StreamingResponse

from serve_app.frontend.admission import ReleasingResponse
from serve_app.config import OverflowSpec, TimeoutSpec
from serve_app.frontend.errors import OpenAIError
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

BACKEND_HEADER = "x-rld-backend"
KEY_RECHECK_S = 5.0
MAX_EVENT_BYTES = 1024**2

# OpenAI request fields the external endpoint gets (from the validated request); everything else stays here.
_COMMON_FIELDS = (
    "stream", "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "seed",
    "response_format",
)
FORWARDED_FIELDS = {
    "chat": frozenset(_COMMON_FIELDS + ("messages", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
                                        "top_logprobs")),
    "completions": frozenset(_COMMON_FIELDS + ("prompt", "echo", "logprobs", "suffix", "best_of")),
}
_MAX_TOKENS_FIELD = {"chat": "max_completion_tokens", "completions": "max_tokens"}


def forward_body(kind: str, data: dict[str, Any], *, model: str, max_tokens: int) -> dict[str, Any]:
    """The body sent to the external endpoint: allow-listed fields of the (validated) client body, the
    external model name and always an output cap."""
    body = {k: v for k, v in data.items() if k in FORWARDED_FIELDS[kind] and v is not None}
    if data.get("stream") and isinstance(data.get("stream_options"), dict):
        include_usage = data["stream_options"].get("include_usage")
        if isinstance(include_usage, bool):
            body["stream_options"] = {"include_usage": include_usage}
    body["model"] = model
    body[_MAX_TOKENS_FIELD[kind]] = max_tokens
    return body


class OverflowFailed(Exception):
    """The external endpoint could not serve the request; use the normal path."""


class _Secret:
    """The external endpoint's key, from a file (re-read when it changes) or an env var."""

    def __init__(self, file: Optional[str], env: Optional[str]) -> None:
        self._file, self._env = file, env
        self._value: Optional[str] = None
        self._signature: Optional[tuple[int, int, int]] = None
        self._checked_at = float("-inf")

    def get(self) -> Optional[str]:
        if self._env:
            return os.environ.get(self._env, "").strip() or None
        if not self._file:
            return None
        now = time.monotonic()
        if now - self._checked_at >= KEY_RECHECK_S:
            self._checked_at = now
            try:
                st = os.stat(self._file)
                signature = (st.st_ino, st.st_size, st.st_mtime_ns)
                if signature != self._signature:
                    with open(self._file, encoding="utf-8") as f:
                        self._value = f.read().strip() or None
                    self._signature = signature
            except OSError as exc:
                logger.error("overflow.api_key_file %s cannot be read (%s); sending no key", self._file, exc)
                self._value, self._signature = None, None
        return self._value


class Overflow:
    """The overflow path of one ingress replica."""

    def __init__(self, spec: OverflowSpec, timeouts: TimeoutSpec) -> None:
        self.spec = spec
        self._timeouts = timeouts
        self._key = _Secret(spec.api_key_file, spec.api_key_env)
        self._client: Optional[httpx.AsyncClient] = None
        self.in_flight = 0
        self._counter: Any = None

    @property
    def enabled(self) -> bool:
        return self.spec.enabled

    def has_capacity(self) -> bool:
        return self.enabled and self.in_flight < self.spec.max_in_flight

    def on_saturation(self, *, would_queue: bool, queued: int) -> bool:
        return self.has_capacity() and self.spec.on_saturation and would_queue and queued >= self.spec.queue_threshold

    def on_role_unavailable(self) -> bool:
        return self.has_capacity() and self.spec.on_role_unavailable

    def set_timeouts(self, timeouts: TimeoutSpec) -> None:
        """New live timeouts (the ingress's reconfigure): requests sent from now on read with them."""
        self._timeouts = timeouts

    def _timeout(self) -> httpx.Timeout:
        read = max(self._timeouts.first_token_s, self._timeouts.between_tokens_s)
        return httpx.Timeout(connect=self.spec.connect_timeout_s, read=read, write=30, pool=30)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout(), limits=httpx.Limits(max_connections=self.spec.max_in_flight)
            )
        return self._client

    def _count(self, reason: str, outcome: str) -> None:
        if self._counter is None:
            from ray.util.metrics import Counter

            self._counter = Counter(
                "rld_overflow_requests",
                description="Requests sent to the external overflow endpoint, by trigger and outcome "
                "(ok, client_error: the external endpoint answered 4xx, failed: fell back to the cluster path).",
                tag_keys=("reason", "outcome"),
            )
        self._counter.inc(1, tags={"reason": reason, "outcome": outcome})

    async def forward(
        self,
        kind: str,
        data: dict[str, Any],
        *,
        model_id: str,
        reason: str,
        request_id: Optional[str],
        max_tokens: Optional[int] = None,
    ) -> ReleasingResponse:
        """Serve the request from the external endpoint; raises OverflowFailed when it cannot."""
        assert self.spec.base_url
        self.in_flight += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1

        try:
            response = await self._forward(
                kind, data, model_id=model_id, reason=reason, request_id=request_id, max_tokens=max_tokens
            )
        except BaseException:
            release()
            raise
        return ReleasingResponse(response, release, {BACKEND_HEADER: "external"})

    async def _forward(
        self,
        kind: str,
        data: dict[str, Any],
        *,
        model_id: str,
        reason: str,
        request_id: Optional[str],
        max_tokens: Optional[int],
    ):
        external_model = self.spec.model_map.get(model_id, model_id)
        body = forward_body(kind, data, model=external_model, max_tokens=max_tokens or self.spec.max_tokens)
        path = "/chat/completions" if kind == "chat" else "/completions"
        url = self.spec.base_url.rstrip("/") + path
        headers = {"content-type": "application/json"}
        key = self._key.get()
        if key:
            headers["authorization"] = f"Bearer {key}"
        if request_id:
            headers["x-request-id"] = request_id
        client = self._http()
        deadline = time.monotonic() + self.spec.timeout_s
        try:
            upstream = await asyncio.wait_for(
                client.send(client.build_request("POST", url, json=body, headers=headers, timeout=self._timeout()), stream=True),
                timeout=self.spec.timeout_s,
            )
        except (httpx.HTTPError, asyncio.TimeoutError) as exc:
            self._count(reason, "failed")
            logger.warning("overflow to %s failed (%s); request_id=%s uses the cluster path", url, type(exc).__name__, request_id)
            raise OverflowFailed(type(exc).__name__) from exc
        if upstream.status_code >= 500 or upstream.status_code in (401, 403, 404, 429):
            # The external side is down, overloaded or misconfigured (key, model_map): not the client's fault.
            # Its body is not logged: a 401 there may quote part of the key.
            await upstream.aclose()
            self._count(reason, "failed")
            logger.warning(
                "overflow to %s answered %d; request_id=%s uses the cluster path. Operators: check "
                "overflow.base_url, the key and overflow.model_map.",
                url, upstream.status_code, request_id,
            )
            raise OverflowFailed(f"HTTP {upstream.status_code}")
        logger.info("overflow (%s): request_id=%s served by %s as model %r", reason, request_id, url, external_model)
        if upstream.status_code >= 400:
            content = await self._json_body(upstream, deadline)
            self._count(reason, "client_error")
            return JSONResponse(status_code=upstream.status_code, content=content)
        self._count(reason, "ok")
        if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
            content = await self._json_body(upstream, deadline)
            if isinstance(content, dict) and "model" in content:
                content["model"] = model_id
            return JSONResponse(content=content)
        events = bounded_events(upstream, model_id, deadline=deadline, max_bytes=self.spec.max_response_bytes)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _json_body(self, upstream: httpx.Response, deadline: float) -> Any:
        try:
            raw = await asyncio.wait_for(
                _read_bounded(upstream, self.spec.max_response_bytes), timeout=max(0.0, deadline - time.monotonic())
            )
            return json.loads(raw)
        except (ValueError, httpx.HTTPError, asyncio.TimeoutError, ResponseTooLarge):
            raise OpenAIError(502, "The overflow endpoint sent no usable JSON response.", code="bad_gateway") from None
        finally:
            await upstream.aclose()


class ResponseTooLarge(Exception):
    pass


async def _read_bounded(upstream: httpx.Response, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for part in upstream.aiter_bytes():
        size += len(part)
        if size > max_bytes:
            raise ResponseTooLarge()
        parts.append(part)
    return b"".join(parts)


_BROKEN = {"message": "The overflow endpoint stopped answering mid-stream.", "type": "server_error", "param": None, "code": 503}


async def sse_data(chunks: AsyncIterator[bytes], *, max_bytes: int, max_event_bytes: int = MAX_EVENT_BYTES) -> AsyncIterator[str]:
    """The `data` of each SSE event in `chunks` (multi-line data joined by newlines, as the SSE spec says).
    Raises ResponseTooLarge past `max_bytes` in all or `max_event_bytes` in one event."""
    buffer = bytearray()  # amortized appends: a long partial line costs linear time, not quadratic
    total = 0
    data: list[str] = []
    event_bytes = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise ResponseTooLarge()
        buffer.extend(chunk)
        start = 0
        while True:
            newline = buffer.find(b"\n", start)
            if newline < 0:
                break
            line, start = bytes(buffer[start:newline]).rstrip(b"\r"), newline + 1
            if not line:
                if data:
                    yield "\n".join(data)
                    data, event_bytes = [], 0
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data.append((value[1:] if value.startswith(b" ") else value).decode("utf-8", "replace"))
                event_bytes += len(value) + 1
                if event_bytes > max_event_bytes:
                    raise ResponseTooLarge()
        del buffer[:start]
        if len(buffer) > max_event_bytes:
            raise ResponseTooLarge()
    line = bytes(buffer).rstrip(b"\r")
    if line.startswith(b"data:"):
        value = line[5:]
        data.append((value[1:] if value.startswith(b" ") else value).decode("utf-8", "replace"))
    if data:
        yield "\n".join(data)


async def bounded_events(
    upstream: httpx.Response, model_id: str, *, deadline: float, max_bytes: int
) -> AsyncIterator[str]:
    """SSE events from the external endpoint with `model` renamed back, within `deadline` (monotonic) and
    `max_bytes`; a broken or unbounded stream ends with an error event and [DONE], like the cluster path's."""
    done = False
    events = sse_data(upstream.aiter_bytes(), max_bytes=max_bytes).__aiter__()
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise asyncio.TimeoutError()
            try:
                payload = await asyncio.wait_for(events.__anext__(), timeout=remaining)
            except StopAsyncIteration:
                break
            if payload.strip() == "[DONE]":
                done = True
                yield "data: [DONE]\n\n"
                break
            try:
                event = json.loads(payload)
                if isinstance(event, dict) and "model" in event:
                    event["model"] = model_id
                payload = json.dumps(event)
            except ValueError:
                payload = payload.replace("\n", "")  # keep one event one line
            yield f"data: {payload}\n\n"
    except (httpx.HTTPError, asyncio.TimeoutError, ResponseTooLarge) as exc:
        logger.warning("overflow stream ended early (%s)", type(exc).__name__)
        yield f"data: {json.dumps({'error': _BROKEN})}\n\n"
    finally:
        await upstream.aclose()
    if not done:
        yield "data: [DONE]\n\n"
