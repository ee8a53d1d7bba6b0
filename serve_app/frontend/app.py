"""The frontend's ASGI app: routes, middleware in request order, and the OpenAI-shaped error handlers.

  EdgeGuard (edge.py)              400 for an x-request-id that is not short visible ASCII (Ray's
                                   middleware would raise on non-UTF-8 and answer 500); Serve's /-/routes
                                   closed. The same guard wraps Serve's own HTTP servers (edge.proxy_middlewares)
  HopClockMiddleware               the per-request clock from frontend to first byte out (telemetry/hops.py);
                                   the in-stream record only with frontend.client_trace
  SetRequestIdMiddleware (Ray's)   every request gets an id (x-request-id, from Serve's proxy)
  CORS (only if configured)        explicit origins, never credentials
  auth.ApiKeyAuth                  401 without a valid `Authorization: Bearer` key (readiness stays open)
  limits.RequestGuard              413 over limits.max_body_bytes, 408 past limits.body_read_timeout_s;
                                   Serve's control headers neutralised;
                                   the request is cancelled (engines abort) when the client disconnects

Only the endpoints we serve are routed: /v1/models, /v1/models/{id}, /v1/chat/completions,
/v1/completions and /health (no /tokenize, /v1/embeddings, /v1/score, audio, /docs or /openapi.json).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.upstream import (
    DEFAULT_ENDPOINTS,
    OpenAIHTTPException,
    SetRequestIdMiddleware,
    add_http_metrics_middleware,
    metrics_lifespan,
)
from serve_app.config import AppConfig, AuthSpec, LimitsSpec
from serve_app.frontend.auth import ApiKeyAuth
from serve_app.frontend.edge import REQUEST_ID_HEADER_BYTES, EdgeGuard
from serve_app.frontend.errors import OpenAIError, error_json
from serve_app.frontend.limits import RequestGuard
from serve_app.telemetry.hops import TRACE_REQUEST_HEADER, TRACE_SSE_PREFIX, HopClock, ReplicaStamps, trace_line, trace_logger
from serve_app.telemetry.logs import get_logger
from serve_app.telemetry.metrics import HopMetrics

logger = get_logger(__name__)

def request_id(scope: Any) -> str:
    """The request's id as Serve's proxy set it (x-request-id), from an ASGI scope or a Starlette request."""
    headers = scope.get("headers", []) if isinstance(scope, dict) else scope.scope.get("headers", [])
    return next((v.decode("latin-1") for k, v in headers if k == REQUEST_ID_HEADER_BYTES), "")


async def _on_openai_http_exception(request: Request, exc: OpenAIHTTPException) -> JSONResponse:
    if not isinstance(exc, OpenAIError):
        exc = OpenAIError(exc.status_code, exc.message)
    log = logger.warning if exc.status_code >= 500 else logger.info
    log(
        "request_id=%s %s %s -> %d %s (param %s): %s",
        request_id(request), request.method, request.url.path, exc.status_code, exc.code, exc.param, exc.message[:300],
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
    """The frontend's outermost ASGI middleware: starts each request's clock (serve_app/telemetry/hops.py), stamps
    the first body bytes out, and once the response is done records the per-hop metrics and logs the
    trace line of a streamed request (the only kind whose serving replica sends its stamps back)."""

    def __init__(self, app: Any, client_trace: bool = False) -> None:
        self.app = app
        self.client_trace = client_trace
        self._metrics: Optional[HopMetrics] = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        clock = HopClock()
        clock.stamp("ingress_received")
        scope.setdefault("state", {})[CLOCK_STATE_KEY] = clock
        wants_trace = self.client_trace and any(k == TRACE_REQUEST_HEADER and v == b"1" for k, v in scope.get("headers", []))

        async def send_stamped(message: dict) -> None:
            first = message["type"] == "http.response.body" and message.get("body") and (
                "ingress_first_out" not in clock.stamps)
            if first:
                clock.stamp("ingress_first_out")
            await send(message)
            if first and wants_trace and "replica_first_out" in clock.stamps and message.get("more_body"):
                record = json.dumps(clock.trace(request_id(scope)), separators=(",", ":")).encode()
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
            trace_logger().info("%s", trace_line(clock, request_id(scope)))
        except Exception:  # noqa: BLE001 - timing must never fail a request that was served
            logger.exception("recording the request's hop timings failed")


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """Last resort: a bug of ours. Log it in full, tell the client only the request id."""
    rid = request_id(request)
    logger.error("unexpected error while serving request_id=%s %s %s", rid, request.method, request.url.path, exc_info=exc)
    error = OpenAIError(
        500,
        f"Internal error (request id {rid}). Operators: the ingress replica log has the traceback "
        "under this request id.",
    )
    return error_json(error)


class LiveLimits:
    """The request limits an app's middleware reads, replaced in place by the ingress's `reconfigure`."""

    def __init__(self, limits: LimitsSpec) -> None:
        self.limits = limits


def live_limits(app: Any) -> Optional[LiveLimits]:
    """The LiveLimits of an app `make_app` built (None for any other app)."""
    return getattr(getattr(app, "state", None), "live_limits", None)


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
    # Middleware runs outermost-last-added: edge, hop clock, request id, CORS, auth, guard, metrics, handlers.
    add_http_metrics_middleware(app)
    # limits change in place (the ingress's reconfigure, Serve's user_config): the guard reads them per request
    app.state.live_limits = live = LiveLimits(limits)
    app.add_middleware(RequestGuard, max_body_bytes=lambda: live.limits.max_body_bytes,
                       body_read_timeout_s=lambda: live.limits.body_read_timeout_s)
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
    app.add_middleware(HopClockMiddleware, client_trace=app_config.frontend.client_trace if app_config else False)
    app.add_middleware(EdgeGuard)  # added last = runs first
    return app


ENDPOINTS = {
    **{name: DEFAULT_ENDPOINTS[name] for name in ("models", "model_data", "completions", "chat")},
    "health": lambda app: app.get("/health"),
}




def hop_clock(raw_request: Optional[Request]) -> Optional[HopClock]:
    state = getattr(raw_request, "scope", {}).get("state", {}) if raw_request is not None else {}
    return state.get(CLOCK_STATE_KEY)


def take_replica_stamps(chunk: Any, clock: Optional[HopClock]) -> Any:
    """Strip the serving replica's stamps off its first batch (they are not for the client)."""
    if isinstance(chunk, list) and chunk and isinstance(chunk[-1], ReplicaStamps):
        if clock is not None:
            clock.merge(chunk[-1])
        return chunk[:-1]
    return chunk
