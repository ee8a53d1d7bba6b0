"""The OpenAI ingress: Ray Serve LLM's `OpenAiIngress` with bounded engine calls and OpenAI-shaped errors.

What Ray 2.58's ingress does by itself (measured on this stack): unknown model -> 404 but as FastAPI's
`{"detail": ...}`; malformed JSON -> 400 `{"error": ...}`; engine validation errors (max_tokens < 1,
prompt longer than the context) -> 400 with a message wrapped in "Message: ..., Internal exception: ...";
a whole request is bounded by RAY_SERVE_LLM_ROUTER_HTTP_TIMEOUT (600 s, 408) but a started stream is
not; a dead engine replica surfaces as a bare 500. This module:
  - answers every error as OpenAI does: `{"error": {"message", "type", "param", "code"}}` with the
    HTTP status (400 invalid request/JSON/context length, 404 unknown model, 503 engine unavailable);
  - bounds the wait for the first chunk and between chunks (AppConfig.timeouts) -> 503;
  - adds GET /health: 200 when the model's serving deployment answers its health check, else 503.
Mid-stream failures cannot change the HTTP status any more; they end the stream with an SSE
`data: {"error": {...}}` event, which is how vLLM reports mid-stream errors too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ErrorInfo,
    ErrorResponse,
    OpenAIHTTPException,
)
from ray.llm._internal.serve.core.ingress import ingress as ray_ingress
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress
from starlette.exceptions import HTTPException as StarletteHTTPException
from ray.llm._internal.serve.observability.logging import get_logger
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from serve_app.hops import TRACE_REQUEST_HEADER, TRACE_SSE_PREFIX, HopClock, ReplicaStamps, trace_line, trace_logger
from serve_app.metrics import HopMetrics

logger = get_logger(__name__)

# An engine replica that died, is restarting, or refuses work because its queue is full.
ENGINE_UNAVAILABLE = (RayActorError, ActorUnavailableError, DeploymentUnavailableError, BackPressureError)
HEALTH_CHECK_TIMEOUT_S = 10.0
RETRY_HINT = (
    "Serve restarts failed engine replicas; retry in a minute. Operators: check `serve status` and the "
    "replica logs (serve/replica_*.log, worker-*.err)."
)


class OpenAIError(OpenAIHTTPException):
    """An error answered as OpenAI does: HTTP status + {"error": {message, type, param, code}}."""

    def __init__(self, status_code: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None):
        kind = "invalid_request_error" if status_code < 500 else "server_error"
        super().__init__(status_code, message, type=kind)
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def as_error_response(self) -> ErrorResponse:
        """The same error as a stream event (vLLM's ErrorInfo wants the HTTP status as code)."""
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.status_code)
        )

    @classmethod
    def from_engine(cls, error: ErrorResponse, what: str) -> "OpenAIError":
        """vLLM/Ray reported the error: 4xx keep their status, message and param (validation, context
        length...); 5xx mean the engine itself failed and become a retryable 503."""
        info = error.error
        status_code = int(info.code or 500)
        if status_code >= 500:
            return EngineUnavailable(f"{what}: the engine failed ({info.type}: {info.message}). {RETRY_HINT}")
        code = "context_length_exceeded" if "maximum context length" in info.message else None
        return cls(status_code, info.message, param=info.param, code=code)


class EngineUnavailable(OpenAIError):
    def __init__(self, message: str) -> None:
        super().__init__(status.HTTP_503_SERVICE_UNAVAILABLE, message, code="engine_unavailable")


async def bounded_chunks(
    chunks: AsyncIterator[Any], *, first_s: float, between_s: float, what: str
) -> AsyncIterator[Any]:
    """Pass `chunks` through; raise (before the first chunk) or yield (after it) a 503 error when the
    engine stops answering within the deadline or its replica is unavailable."""
    iterator = chunks.__aiter__()
    started = False
    try:
        while True:
            limit = between_s if started else first_s
            try:
                chunk = await asyncio.wait_for(iterator.__anext__(), timeout=limit)
            except StopAsyncIteration:
                return
            except (asyncio.TimeoutError, *ENGINE_UNAVAILABLE, RayTaskError) as exc:
                if isinstance(exc, RayTaskError) and not _engine_died(exc):
                    raise
                failure = EngineUnavailable(_explain(exc, what, limit, started))
                logger.error("%s", failure.message)
                if not started:
                    raise failure from exc
                yield failure.as_error_response()
                return
            if not started:
                first = chunk[0] if isinstance(chunk, list) and chunk else chunk
                if isinstance(first, ErrorResponse):
                    raise OpenAIError.from_engine(first, what)
            started = True
            yield chunk
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()


def _engine_died(exc: RayTaskError) -> bool:
    """A replica call failed because its vLLM engine process is gone (vLLM's EngineDeadError)."""
    cause = getattr(exc, "cause", None)
    return type(cause).__name__ == "EngineDeadError" or "EngineDeadError" in str(exc)


def _explain(exc: BaseException, what: str, limit: float, started: bool) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        phase = "between two response chunks" if started else "before the first response chunk"
        return (
            f"{what}: the engine sent nothing for {limit:.0f} s {phase}; it may be dead, wedged or "
            "overloaded. Retry later; operators: check `serve status` and the engine replica logs, and "
            "raise timeouts.first_token_s/between_tokens_s if long prompts are expected."
        )
    if isinstance(exc, BackPressureError):
        return f"{what}: the engine replicas are at capacity ({exc}). Retry later."
    if isinstance(exc, RayTaskError):
        return f"{what}: the vLLM engine process died. {RETRY_HINT}"
    return f"{what}: the engine replica is unavailable ({type(exc).__name__}: {exc}). {RETRY_HINT}"


def _openai_error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(status_code=error.status_code, content=error.body())


async def _on_openai_http_exception(_request: Request, exc: OpenAIHTTPException) -> JSONResponse:
    if not isinstance(exc, OpenAIError):
        exc = OpenAIError(exc.status_code, exc.message)
    return _openai_error_response(exc)


async def _on_http_exception(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = str(exc.detail)
    unknown_model = exc.status_code == status.HTTP_404_NOT_FOUND and "model" in message.lower()
    return _openai_error_response(
        OpenAIError(
            exc.status_code,
            message,
            param="model" if unknown_model else None,
            code="model_not_found" if unknown_model else None,
        )
    )


async def _on_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        error = OpenAIError(400, f"The request body is not valid JSON: {first.get('msg', 'decode error')}.", code="invalid_json")
    else:
        param = ".".join(location) or None
        error = OpenAIError(400, f"Invalid value for {param or 'the request'}: {first.get('msg', 'invalid')}.", param=param)
    return _openai_error_response(error)


CLOCK_STATE_KEY = "rld_hop_clock"


class HopClockMiddleware:
    """The frontend's outermost ASGI middleware: starts each request's clock (serve_app/hops.py), stamps
    the first body bytes out, and once the response is done records the per-hop metrics and logs the
    trace line of a streamed request (the only kind whose serving replica sends its stamps back)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._metrics: Optional[HopMetrics] = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        clock = HopClock()
        clock.stamp("ingress_received")
        scope.setdefault("state", {})[CLOCK_STATE_KEY] = clock
        wants_trace = any(k == TRACE_REQUEST_HEADER and v == b"1" for k, v in scope.get("headers", []))

        async def send_stamped(message: dict) -> None:
            first = message["type"] == "http.response.body" and message.get("body") and (
                "ingress_first_out" not in clock.stamps)
            if first:
                clock.stamp("ingress_first_out")
            await send(message)
            if first and wants_trace and "replica_first_out" in clock.stamps and message.get("more_body"):
                record = json.dumps(clock.trace(_request_id(scope)), separators=(",", ":")).encode()
                await send({"type": "http.response.body", "body": TRACE_SSE_PREFIX + record + b"\n\n",
                            "more_body": True})

        try:
            await self.app(scope, receive, send_stamped)
        finally:
            if "replica_first_out" in clock.stamps and "ingress_first_out" in clock.stamps:
                self._record(clock, scope)

    def _record(self, clock: HopClock, scope: dict) -> None:
        try:
            if self._metrics is None:
                self._metrics = HopMetrics()
            self._metrics.record(clock, clock.model or "")
            trace_logger().info("%s", trace_line(clock, _request_id(scope)))
        except Exception:  # noqa: BLE001 - timing must never fail a request that was served
            logger.exception("recording the request's hop timings failed")


def _request_id(scope: dict) -> str:
    return next((v.decode() for k, v in scope.get("headers", []) if k == b"x-request-id"), "")


def _hop_clock(raw_request: Optional[Request]) -> Optional[HopClock]:
    state = getattr(raw_request, "scope", {}).get("state", {}) if raw_request is not None else {}
    return state.get(CLOCK_STATE_KEY)


def _take_replica_stamps(chunk: Any, clock: Optional[HopClock]) -> Any:
    """Strip the serving replica's stamps off its first batch (they are not for the client)."""
    if isinstance(chunk, list) and chunk and isinstance(chunk[-1], ReplicaStamps):
        if clock is not None:
            clock.merge(chunk[-1])
        return chunk[:-1]
    return chunk


def make_app() -> FastAPI:
    """Ray's ingress FastAPI app (middleware, metrics, request ids) with OpenAI-shaped error handlers
    and, outermost, the per-request hop clock."""
    app = ray_ingress.init()
    app.add_exception_handler(OpenAIHTTPException, _on_openai_http_exception)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_middleware(HopClockMiddleware)  # added last = runs first
    return app


ENDPOINTS = {**ray_ingress.DEFAULT_ENDPOINTS, "health": lambda app: app.get("/health")}


class BoundedOpenAiIngress(OpenAiIngress):
    """OpenAiIngress with deadlines on engine calls, 503s for unavailable engines and GET /health."""

    def __init__(
        self,
        llm_deployments,
        model_cards,
        *,
        lora_paths: Optional[dict[str, str]] = None,
        first_token_timeout_s: float = 300.0,
        between_tokens_timeout_s: float = 60.0,
        **kwargs: Any,
    ):
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths, **kwargs)
        self._first_token_timeout_s = first_token_timeout_s
        self._between_tokens_timeout_s = between_tokens_timeout_s

    async def health(self) -> JSONResponse:
        """200 when every model's serving deployment passes its engine health check, else 503."""
        for model_id, handle in self._default_serve_handles.items():
            try:
                await asyncio.wait_for(handle.check_health.remote(), timeout=HEALTH_CHECK_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
                return _openai_error_response(
                    EngineUnavailable(f"model {model_id!r} is not healthy: {type(exc).__name__}: {exc}")
                )
        return JSONResponse({"status": "ok", "models": sorted(self._default_serve_handles)})

    async def _get_response(self, *, body, call_method: str, raw_request=None):
        clock = _hop_clock(raw_request)
        if clock is not None:
            clock.model = body.model
            clock.stamp("ingress_dispatched")
        chunks = super()._get_response(body=body, call_method=call_method, raw_request=raw_request)
        what = f"{call_method} request for model {body.model!r}"
        first = True
        async for chunk in bounded_chunks(
            chunks,
            first_s=self._first_token_timeout_s,
            between_s=self._between_tokens_timeout_s,
            what=what,
        ):
            if first:
                first = False
                if clock is not None:
                    clock.stamp("ingress_first_in")
                chunk = _take_replica_stamps(chunk, clock)
            yield chunk
