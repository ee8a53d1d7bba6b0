"""The OpenAI ingress: Ray Serve LLM's `OpenAiIngress`, made safe to put on a network.

The concerns live in small modules beside this one and are composed here, in request order:

  HopClockMiddleware               the per-request clock from frontend to first byte out (serve_app/hops.py)
  SetRequestIdMiddleware (Ray's)   every request gets an id (x-request-id, from Serve's proxy)
  CORS (only if configured)        explicit origins, never credentials
  auth.ApiKeyAuth                  401 without a valid `Authorization: Bearer` key (readiness stays open)
  limits.RequestGuard              413 over limits.max_body_bytes; Serve's control headers neutralised;
                                   the request is cancelled (engines abort) when the client disconnects
  BoundedOpenAiIngress.chat/completions:
    limits.parse_json_object / validate_request   every bad body is a 4xx naming the parameter
    roles.RoleWatch                 a role without running replicas: 503 + Retry-After at once (or overflow)
    overflow.Overflow               saturated or role down: an external OpenAI endpoint serves it (opt-in)
    admission.Admission             bounded queue per ingress replica: 429 + Retry-After beyond it
    _get_response + bounded_chunks  deadlines on the engine (first chunk, between chunks), one retry when
                                    the decode replica died before the first chunk, explicit cancel

Only the endpoints we serve are routed: /v1/models, /v1/models/{id}, /v1/chat/completions,
/v1/completions and /health (no /tokenize, /v1/embeddings, /v1/score, audio, /docs or /openapi.json).

Error answers are OpenAI-shaped (serve_app.errors). A stream that already started cannot change its
status any more; a failure after the first chunk ends it with an SSE `data: {"error": ...}` event and
`data: [DONE]`, which is how vLLM reports mid-stream errors too.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    ErrorResponse,
    OpenAIHTTPException,
)
from ray.llm._internal.serve.core.ingress import ingress as ray_ingress
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress
from ray.llm._internal.serve.core.ingress.middleware import SetRequestIdMiddleware
from ray.llm._internal.serve.core.protocol import RawRequestInfo
from ray.llm._internal.serve.observability.metrics.fast_api_metrics import (
    add_http_metrics_middleware,
    metrics_lifespan,
)
from ray.serve._private.http_util import session_id_from_headers
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, RayServeException
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.admission import Admission, ReleasingResponse
from serve_app.auth import ApiKeyAuth
from serve_app.config import AppConfig, AuthSpec, FailoverSpec, LimitsSpec, OverflowSpec, TimeoutSpec
from serve_app.errors import (
    REQUEST_ID_HEADER,
    RETRY_HINT,
    EngineUnavailable,
    OpenAIError,
    RoleUnavailable,
    error_json,
)
from serve_app.limits import RequestGuard, parse_json_object, validate_request
from serve_app.logs import get_logger
from serve_app.overflow import BACKEND_HEADER, Overflow, OverflowFailed
from serve_app.roles import RoleWatch

from serve_app.hops import TRACE_REQUEST_HEADER, TRACE_SSE_PREFIX, HopClock, ReplicaStamps, trace_line, trace_logger
from serve_app.metrics import HopMetrics

logger = get_logger(__name__)

# An engine replica that died, is restarting, or refuses work because its queue is full.
ENGINE_UNAVAILABLE = (RayActorError, ActorUnavailableError, DeploymentUnavailableError, BackPressureError)
HEALTH_CHECK_TIMEOUT_S = 10.0
ROLE_CHECK_STEP_S = 1.0  # while waiting for a first chunk, how often to look whether the role went away


class _Retryable(Exception):
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
                    raise _Retryable(failure) from exc
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


def _request_id(request: Request) -> Optional[str]:
    return getattr(request.state, "request_id", None) or request.headers.get(REQUEST_ID_HEADER)


async def _on_openai_http_exception(request: Request, exc: OpenAIHTTPException) -> JSONResponse:
    if not isinstance(exc, OpenAIError):
        exc = OpenAIError(exc.status_code, exc.message)
    log = logger.warning if exc.status_code >= 500 else logger.info
    log(
        "request_id=%s %s %s -> %d %s (param %s): %s",
        _request_id(request), request.method, request.url.path, exc.status_code, exc.code, exc.param, exc.message[:300],
    )
    return error_json(exc)


async def _on_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = str(exc.detail)
    unknown_model = exc.status_code == status.HTTP_404_NOT_FOUND and "model" in message.lower()
    if exc.status_code == status.HTTP_404_NOT_FOUND and not unknown_model:
        message = f"Unknown path {request.url.path}: this endpoint serves /v1/models, /v1/chat/completions, /v1/completions and /health."
    error = OpenAIError(
        exc.status_code,
        message,
        param="model" if unknown_model else None,
        code="model_not_found" if unknown_model else None,
    )
    return error_json(error)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part not in ("body", "path", "query")]
    param = ".".join(location) or None
    error = OpenAIError(400, f"Invalid value for {param or 'the request'}: {first.get('msg', 'invalid')}.", param=param)
    return error_json(error)


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


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Last resort: a bug of ours. Log it in full, tell the client only the request id."""
    request_id = _request_id(request)
    logger.error("unexpected error while serving request_id=%s %s %s", request_id, request.method, request.url.path, exc_info=exc)
    error = OpenAIError(
        500,
        f"Internal error (request id {request_id}). Operators: the ingress replica log has the traceback "
        "under this request id.",
    )
    return error_json(error)


def make_app(app_config: Optional[AppConfig] = None) -> FastAPI:
    """The ingress FastAPI app: Ray's lifespan, metrics middleware and request ids, our guards and
    OpenAI-shaped error handlers; no docs/OpenAPI routes and no CORS unless origins are configured."""
    auth = app_config.auth if app_config else AuthSpec()
    limits = app_config.limits if app_config else LimitsSpec()
    app = FastAPI(lifespan=metrics_lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(OpenAIHTTPException, _on_openai_http_exception)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected)
    # Middleware runs outermost-last-added: hop clock, request id, CORS, auth, guard, metrics, handlers.
    add_http_metrics_middleware(app)
    app.add_middleware(RequestGuard, max_body_bytes=limits.max_body_bytes)
    if auth.enabled:
        app.add_middleware(ApiKeyAuth, spec=auth)
    if auth.cors_allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(auth.cors_allow_origins),
            allow_credentials=False,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )
    app.add_middleware(SetRequestIdMiddleware)
    app.add_middleware(HopClockMiddleware)  # added last = runs first
    return app


ENDPOINTS = {
    **{name: ray_ingress.DEFAULT_ENDPOINTS[name] for name in ("models", "model_data", "completions", "chat")},
    "health": lambda app: app.get("/health"),
}


class BoundedOpenAiIngress(OpenAiIngress):
    """OpenAiIngress with validation, admission control, overflow, role awareness, deadlines on engine
    calls and GET /health (readiness over both roles)."""

    def __init__(
        self,
        llm_deployments,
        model_cards,
        *,
        lora_paths: Optional[dict[str, str]] = None,
        app_config: Optional[AppConfig] = None,
        role_deployments: Optional[dict[str, str]] = None,
        **kwargs: Any,
    ):
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths, **kwargs)
        self._timeouts = app_config.timeouts if app_config else TimeoutSpec()
        self._limits = app_config.limits if app_config else LimitsSpec()
        self._failover = app_config.failover if app_config else FailoverSpec()
        self._max_model_len = app_config.max_model_len() if app_config else None
        in_flight, queued = app_config.admission_limits() if app_config else (500, 500)
        admission = app_config.admission if app_config else None
        self._admission = Admission(
            in_flight,
            queued,
            max_queue_wait_s=admission.max_queue_wait_s if admission else 30,
            retry_after_s=admission.retry_after_s if admission else 5,
        )
        self._overflow = Overflow(app_config.overflow if app_config else OverflowSpec(), self._timeouts)
        self._roles = RoleWatch(role_deployments or {}, poll_s=self._failover.status_poll_s)
        try:
            self._roles.ensure_started()
        except Exception:  # noqa: BLE001 - started lazily on the first request instead
            pass

    # ---- endpoints ----

    async def chat(self, request: Request) -> Response:
        return await self._serve_openai(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._serve_openai(request, "completions")

    async def health(self) -> JSONResponse:
        """Readiness: 200 when requests can be served (both roles up, or prefill down but decode
        prefills locally: status "degraded"), 503 naming the role otherwise."""
        roles: dict[str, str] = {}
        for role, state in self._roles.snapshot().items():
            roles[role] = "unknown" if state is None else ("ok" if state.available else f"unavailable: {state.describe()}")
        blocking = await self._blocking_role()
        if blocking is None:
            roles.setdefault("decode", "ok")  # not watched when this is the decode replica (direct streaming)
            for model_id, handle in self._default_serve_handles.items():
                try:
                    await asyncio.wait_for(handle.check_health.remote(), timeout=HEALTH_CHECK_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
                    roles["decode"] = f"unavailable: health check failed ({type(exc).__name__})"
                    blocking = EngineUnavailable(f"model {model_id!r} is not healthy: {type(exc).__name__}: {exc}")
        models = sorted(self._default_serve_handles)
        if blocking is not None:
            body = {**blocking.body(), "status": "unavailable", "models": models, "roles": roles}
            return JSONResponse(status_code=503, content=body, headers=blocking.headers())
        degraded = any(v.startswith("unavailable") for v in roles.values())
        return JSONResponse({"status": "degraded" if degraded else "ok", "models": models, "roles": roles})

    # ---- the request path ----

    def _needed_roles(self) -> list[str]:
        """Roles whose absence means a request cannot be served here (decode; prefill only when decode
        may not prefill locally)."""
        return ["decode"] + ([] if self._failover.local_fallback else ["prefill"])

    def _unavailable(self, role: str, state: Any) -> RoleUnavailable:
        return RoleUnavailable(role, state.describe(), retry_after_s=self._failover.retry_after_s)

    async def _blocking_role(self) -> Optional[RoleUnavailable]:
        for role in self._needed_roles():
            state = await self._roles.confirmed_unavailable(role)
            if state is not None:
                return self._unavailable(role, state)
        return None

    def _role_down_since(self, since: float) -> Callable[[], Optional[OpenAIError]]:
        """For a request waiting for its first chunk: a needed role seen down after it was sent."""

        def check() -> Optional[OpenAIError]:
            for role in self._needed_roles():
                state = self._roles.unavailable(role, since=since)
                if state is not None:
                    return self._unavailable(role, state)
            return None

        return check

    async def _serve_openai(self, request: Request, kind: str) -> Response:
        request_id = _request_id(request)
        data = parse_json_object(await request.body())
        body = validate_request(
            data, kind, limits=self._limits, models=self._model_cards, max_model_len=self._max_model_len
        )
        model_id = body.model or next(iter(self._model_cards))
        if self._limits.max_tokens and not ({"max_tokens", "max_completion_tokens"} & data.keys()):
            data = {**data, "max_tokens": self._limits.max_tokens}  # the cap holds on the overflow path too
        blocked = await self._blocking_role()
        if blocked is not None:
            if self._overflow.on_role_unavailable():
                try:
                    return await self._overflow.forward(kind, data, model_id=model_id, reason=f"{blocked.role}_unavailable", request_id=request_id)
                except OverflowFailed:
                    pass
            logger.warning("request_id=%s: %s", request_id, blocked.message)
            raise blocked
        if self._overflow.on_saturation(would_queue=self._admission.would_queue(), queued=self._admission.queued):
            try:
                return await self._overflow.forward(kind, data, model_id=model_id, reason="saturated", request_id=request_id)
            except OverflowFailed:
                pass
        release = await self._admission.acquire()
        try:
            response = await self._process_llm_request(body, call_method=kind, raw_request=request)
        except BaseException:
            release()
            raise
        return ReleasingResponse(response, release, {BACKEND_HEADER: "cluster"})

    async def _get_response(self, *, body, call_method: str, raw_request=None):
        """Ray's `_get_response` (handle call to the serving deployment), plus: deadlines, a role that
        goes away ends the wait, one retry when the replica died before the first chunk, and the
        downstream request is cancelled explicitly when this one ends early."""
        model_id = await self._get_model_id(body.model)
        handle = self._get_configured_serve_handle(model_id)
        if raw_request is not None:
            session_id = session_id_from_headers(raw_request.headers)
            if session_id:
                handle = handle.options(session_id=session_id)
        if isinstance(body, ChatCompletionRequest):
            body = ray_ingress._sanitize_chat_completion_request(body)
        raw_info = RawRequestInfo.from_starlette_request(raw_request) if raw_request is not None else None
        what = f"{call_method} request for model {body.model!r}"
        clock = _hop_clock(raw_request)
        if clock is not None:
            clock.model = body.model
            clock.stamp("ingress_dispatched")
        for attempt in (1, 2):
            sent = time.monotonic()
            response = getattr(handle, call_method).remote(body, raw_info)
            finished = False
            first = True
            try:
                async for chunk in bounded_chunks(
                    response,
                    first_s=self._timeouts.first_token_s,
                    between_s=self._timeouts.between_tokens_s,
                    what=what,
                    role_down=self._role_down_since(sent),
                ):
                    if first:
                        first = False
                        if clock is not None:
                            clock.stamp("ingress_first_in")
                        chunk = _take_replica_stamps(chunk, clock)
                    yield chunk
                finished = True
                return
            except _Retryable as retryable:
                if attempt == 2:
                    raise retryable.error from None
                logger.warning("%s; sending it once more (Serve routes around the dead replica)", retryable.error.message)
            finally:
                if not finished:
                    try:
                        response.cancel()
                    except (RayServeException, RuntimeError):
                        pass
