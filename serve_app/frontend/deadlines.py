"""Deadlines on the engine's response stream and what an engine-side failure means for the client.

`bounded_chunks` wraps the stream a serving replica returns: before the first chunk it raises an
OpenAIError (503 when the engine is silent past the deadline, dead, or its role went away; the engine's
own 4xx as it was), or `Retryable` when the replica died before sending anything; after the first
chunk a failure ends the stream with an SSE error event (a started stream cannot change its status).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable, Optional

from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from serve_app.frontend.errors import RETRY_HINT, EngineUnavailable, OpenAIError
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

# An engine replica that died, is restarting, or refuses work because its queue is full.
ENGINE_UNAVAILABLE = (RayActorError, ActorUnavailableError, DeploymentUnavailableError, BackPressureError)
ROLE_CHECK_STEP_S = 1.0  # while waiting for a first chunk, how often to look whether the role went away


class Retryable(Exception):
    """The decode replica died before sending anything: the request may be sent again."""

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
) -> AsyncIterator[Any]:
    """Pass `chunks` through. Before the first chunk: raise an OpenAIError (503 when the engine is silent
    past `first_s`, dead, or its role went away; the engine's own 4xx as it was), or `_Retryable` when
    the replica died. After it: end the stream with an error event when anything goes wrong."""
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
                if started:
                    logger.error("%s (after the first chunk: the stream ends with an error event)", failure.message)
                    yield failure.as_error_response()
                    return
                logger.error("%s", failure.message)
                if isinstance(exc, ENGINE_UNAVAILABLE) or _engine_died(exc):
                    raise Retryable(failure) from exc
                raise failure from exc
            if not started:
                error = _first_chunk_error(chunk)
                if error is not None:
                    raise OpenAIError.from_engine(error, what)
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


def _first_chunk_error(chunk: Any) -> Optional[ErrorResponse]:
    """An error as the first chunk: an ErrorResponse, or vLLM's in-band SSE error string
    (`data: {"error": ...}`) that a stream carries when the engine fails right away."""
    first = chunk[0] if isinstance(chunk, list) and chunk else chunk
    if isinstance(first, ErrorResponse):
        return first
    if isinstance(first, str) and first.startswith('data: {"error"'):
        try:
            return ErrorResponse.model_validate(json.loads(first[len("data: "):].split("\n\n", 1)[0]))
        except ValueError:
            return None
    return None


def _engine_died(exc: BaseException) -> bool:
    """A replica call failed because its vLLM engine process is gone (vLLM's EngineDeadError)."""
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ == "EngineDeadError" or (isinstance(exc, RayTaskError) and "EngineDeadError" in str(exc))


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
    if _engine_died(exc):
        return EngineUnavailable(f"{what}: the vLLM engine process died. {RETRY_HINT}")
    if isinstance(exc, ENGINE_UNAVAILABLE):
        return EngineUnavailable(f"{what}: the engine replica is unavailable ({type(exc).__name__}). {RETRY_HINT}")
    cause = getattr(exc, "cause", None)
    if isinstance(cause, ValueError) and not started:
        # vLLM's validation errors raised instead of returned: the request is the problem.
        first_line = (str(cause).strip().splitlines() or ["invalid request"])[0][:300]
        return OpenAIError(400, f"{what}: {first_line}")
    kind = type(cause).__name__ if isinstance(cause, BaseException) else type(exc).__name__
    return EngineUnavailable(f"{what}: the engine failed ({kind}). {RETRY_HINT}")
