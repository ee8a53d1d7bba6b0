"""Deadlines on the engine's response stream and what an engine-side failure means for the client.

`bounded_chunks` wraps the stream a serving replica returns: before the first chunk it raises an
OpenAIError (503 when the engine is silent past the deadline, dead, or its role went away; the engine's
own 4xx as it was), or `Retryable` when the replica was gone before it could run the request; after the
first chunk a failure ends the stream with an SSE error event (a started stream cannot change its status).

An engine that died *while running* the request (vLLM's EngineDeadError) is never Retryable: the request
may be what killed it (serve_app/frontend/containment.py). It raises errors.KilledEngine (or, after the
first chunk, ends the stream) and calls `on_killed`, which gives the request's fingerprint a strike.

Deadlines: a streamed response must send its first chunk within `first_s` and then a chunk at least every
`between_s`; a non-streamed one arrives as a single chunk when generation ends, so the caller passes a
`first_s` scaled by its output cap (`non_stream_deadline_s`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable, Optional

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from serve_app.upstream import ErrorResponse, VLLMClientError
from serve_app.frontend.containment import dead_before_dispatch, engine_died_running
from serve_app.frontend.errors import (
    RETRY_HINT,
    EngineUnavailable,
    KilledEngine,
    OpenAIError,
    client_text,
)
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

# An engine replica that died, is restarting, or refuses work because its queue is full.
ENGINE_UNAVAILABLE = (RayActorError, ActorUnavailableError, DeploymentUnavailableError, BackPressureError)
ROLE_CHECK_STEP_S = 1.0  # while waiting for a first chunk, how often to look whether the role went away


class Retryable(Exception):
    """The decode replica was gone before it ran the request: the request may be sent again."""

    def __init__(self, error: OpenAIError) -> None:
        super().__init__(error.message)
        self.error = error


async def bounded_chunks(
    chunks: AsyncIterator[Any],
    *,
    first_s: float,
    between_s: float,
    what: str,
    role_down: Optional[Callable[[], Optional[OpenAIError]]] = None,
    on_killed: Optional[Callable[[], None]] = None,
) -> AsyncIterator[Any]:
    """Pass `chunks` through. Before the first chunk: raise an OpenAIError (503 when the engine is silent
    past `first_s`, dead, or its role went away; the engine's own 4xx as it was), or `Retryable` when
    the replica was gone before running it. After it: end the stream with an error event when anything
    goes wrong. An engine that died running the request calls `on_killed` and is never Retryable."""
    iterator = chunks.__aiter__()
    started = False
    try:
        while True:
            limit = between_s if started else first_s
            try:
                chunk = await _next_chunk(iterator, limit, None if started else role_down)
            except StopAsyncIteration:
                return
            except OpenAIError:
                raise  # the role went away while we waited (RoleUnavailable)
            except Exception as exc:  # noqa: BLE001 - every engine-side failure is mapped below
                failure = _engine_failure(exc, what, limit, started)
                if isinstance(failure, KilledEngine) and on_killed is not None:
                    on_killed()
                if started:
                    logger.error("%s (after the first chunk: the stream ends with an error event)", failure.message)
                    yield failure.as_error_response()
                    return
                logger.error("%s", failure.message)
                if isinstance(exc, ENGINE_UNAVAILABLE) or dead_before_dispatch(exc):
                    raise Retryable(failure) from exc
                raise failure from exc
            error = _error_chunk(chunk)  # a prefix test per item; parsed only when it is an error event
            if error is not None:
                failure = OpenAIError.from_engine(error, what)
                if isinstance(failure, KilledEngine) and on_killed is not None:
                    on_killed()
                if not started:
                    raise failure
                if isinstance(failure, KilledEngine):
                    logger.error("%s (mid-stream)", failure.message)
            started = True
            yield chunk
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


async def _next_chunk(iterator: Any, limit: float, role_down: Optional[Callable[[], Optional[OpenAIError]]]) -> Any:
    if role_down is None:
        return await asyncio.wait_for(iterator.__anext__(), timeout=limit)
    task = asyncio.ensure_future(iterator.__anext__())
    deadline = time.monotonic() + limit
    try:
        while True:
            remaining = deadline - time.monotonic()
            done, _ = await asyncio.wait({task}, timeout=max(0.0, min(remaining, ROLE_CHECK_STEP_S)))
            if done:
                return task.result()
            if remaining <= ROLE_CHECK_STEP_S:
                raise asyncio.TimeoutError()
            error = role_down()
            if error is not None:
                raise error
    finally:
        if not task.done():
            task.cancel()
            # Let the cancellation land before anyone closes the stream: closing an async generator whose
            # __anext__ is still running raises RuntimeError (a 500 instead of the 503 above).
            await asyncio.wait({task})


def _error_chunk(chunk: Any) -> Optional[ErrorResponse]:
    """An error in a chunk: an ErrorResponse, or vLLM's in-band SSE error string (`data: {"error": ...}`)
    that a stream carries when the engine fails (right away, or mid-stream when it died)."""
    items = chunk if isinstance(chunk, list) else [chunk]
    for item in items:
        if isinstance(item, ErrorResponse):
            return item
        if isinstance(item, str) and item.startswith('data: {"error"'):
            try:
                return ErrorResponse.model_validate(json.loads(item[len("data: "):].split("\n\n", 1)[0]))
            except ValueError:
                return None
    return None


def non_stream_deadline_s(first_token_s: float, per_token_s: float, max_tokens: Optional[int]) -> float:
    """The deadline of a non-streamed response (one chunk when generation ends): the first-token deadline
    plus `per_token_s` per token it may generate."""
    return first_token_s + per_token_s * (max_tokens or 0)


def _engine_failure(exc: BaseException, what: str, limit: float, started: bool) -> OpenAIError:
    """What to tell the client about an engine-side exception: no remote traceback, a clear next step."""
    if isinstance(exc, asyncio.TimeoutError):
        phase = "between two response chunks" if started else "before the first response chunk"
        return EngineUnavailable(
            f"{what}: the engine sent nothing for {limit:.0f} s {phase}; it may be dead, wedged or "
            "overloaded. Retry later; operators: check `serve status` and the engine replica logs, and "
            "raise timeouts.first_token_s/between_tokens_s if long prompts are expected."
        )
    if isinstance(exc, BackPressureError):
        return EngineUnavailable(f"{what}: the engine replicas are at capacity. Retry later.")
    if dead_before_dispatch(exc):
        return EngineUnavailable(f"{what}: the engine replica is restarting. {RETRY_HINT}")
    if engine_died_running(exc):
        return KilledEngine(what)
    if isinstance(exc, ENGINE_UNAVAILABLE):
        return EngineUnavailable(f"{what}: the engine replica is unavailable. {RETRY_HINT}")
    cause = getattr(exc, "cause", None)
    if isinstance(cause, (ValueError, VLLMClientError)) and not started:
        # vLLM's validation errors raised instead of returned: the request is the problem.
        return OpenAIError(400, f"{what}: {client_text(cause) or 'the engine rejected the request'}")
    return EngineUnavailable(f"{what}: the engine failed. {RETRY_HINT}")
