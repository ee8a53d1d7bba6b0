"""The OpenAI frontend: Ray Serve LLM's `OpenAiIngress`, made safe to put on a network.

Request order (the ASGI part is in app.py):
  BoundedOpenAiIngress.chat/completions:
    limits.parse_json_object / validate_request   every bad body is a 4xx naming the parameter
    roles.RoleWatch                 a role without running replicas: 503 + Retry-After at once (or overflow)
    overflow.Overflow               saturated or role down: an external OpenAI endpoint serves it (opt-in)
    admission.Admission             bounded queue per frontend replica: 429 + Retry-After beyond it
    _get_response + bounded_chunks  deadlines on the engine (first chunk, between chunks), one retry when
                                    the decode replica died before the first chunk, explicit cancel

Error answers are OpenAI-shaped (serve_app.frontend.errors). A stream that already started cannot change its
status any more; a failure after the first chunk ends it with an SSE `data: {"error": ...}` event and
`data: [DONE]`, which is how vLLM reports mid-stream errors too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest
from ray.llm._internal.serve.core.ingress import ingress as ray_ingress
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress
from ray.llm._internal.serve.core.protocol import RawRequestInfo
from ray.serve._private.http_util import session_id_from_headers
from ray.serve.exceptions import RayServeException

from serve_app.config import AppConfig, FailoverSpec, LimitsSpec, OverflowSpec, TimeoutSpec
from serve_app.frontend.admission import Admission, ReleasingResponse
from serve_app.frontend.app import hop_clock, request_id, take_replica_stamps
from serve_app.frontend.deadlines import Retryable, bounded_chunks
from serve_app.frontend.errors import EngineUnavailable, OpenAIError, RoleUnavailable
from serve_app.frontend.limits import parse_json_object, validate_request
from serve_app.frontend.overflow import BACKEND_HEADER, Overflow, OverflowFailed
from serve_app.roles import RoleWatch
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

HEALTH_CHECK_TIMEOUT_S = 10.0


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
        rid = request_id(request)
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
                    return await self._overflow.forward(kind, data, model_id=model_id, reason=f"{blocked.role}_unavailable", request_id=rid)
                except OverflowFailed:
                    pass
            logger.warning("request_id=%s: %s", rid, blocked.message)
            raise blocked
        if self._overflow.on_saturation(would_queue=self._admission.would_queue(), queued=self._admission.queued):
            try:
                return await self._overflow.forward(kind, data, model_id=model_id, reason="saturated", request_id=rid)
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
        clock = hop_clock(raw_request)
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
                        chunk = take_replica_stamps(chunk, clock)
                    yield chunk
                finished = True
                return
            except Retryable as retryable:
                if attempt == 2:
                    raise retryable.error from None
                logger.warning("%s; sending it once more (Serve routes around the dead replica)", retryable.error.message)
            finally:
                if not finished:
                    try:
                        response.cancel()
                    except (RayServeException, RuntimeError):
                        pass
