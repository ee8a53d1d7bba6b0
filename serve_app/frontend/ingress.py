"""The OpenAI frontend: Ray Serve LLM's `OpenAiIngress`, made safe to put on a network.

Request order (the ASGI part is in app.py):
  BoundedOpenAiIngress.chat/completions:
    limits.parse_json_object / validate_request   every bad body is a 4xx naming the parameter, in linear time
    guards (serve_app/frontend/guards.py, in order):
      ContainmentGate             a request that keeps killing engines: 400 (containment.py)
      RoleGate                    a role without running replicas: 503 + Retry-After at once (or overflow)
      SaturationGate              the admission queue is over the threshold: overflow serves it (opt-in)
      AdmissionGate               slots weighted by sequences (prompts x n): 429 + Retry-After beyond the queue
    _get_response + bounded_chunks  deadlines on the engine (first chunk, between chunks; a non-streamed
                                    response's scaled by its max_tokens), one retry when the decode replica
                                    was gone before it ran the request (never when its engine died running
                                    it), explicit cancel

Where it serves from is explicit (`Upstream`): a separate frontend deployment calls the decode deployment
through a DeploymentHandle (`REMOTE`: Serve may route a retry to another replica, decode's
availability is watched, `session_id` steers routing); with `frontend.direct_streaming` the frontend runs
inside the serving replica (`THIS_REPLICA`: nothing to retry on, nothing to watch about itself,
no routing left to steer; admission and overflow limits hold per serving replica).

Error answers are OpenAI-shaped (serve_app.frontend.errors). A stream that already started cannot change its
status any more; a failure after the first chunk ends it with an SSE `data: {"error": ...}` event and
`data: [DONE]`, which is how vLLM reports mid-stream errors too.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray.serve.exceptions import RayServeException

from serve_app.upstream import (
    NON_STREAMING_RESPONSE_TYPES,
    ChatCompletionRequest,
    ErrorResponse,
    OpenAiIngress,
    RawRequestInfo,
    openai_json_wrapper,
    peek_at_generator,
    sanitize_chat_completion_request,
    session_id_from_headers,
)
from serve_app.config import LIVE_FIELDS, AppConfig
from serve_app.frontend.admission import Admission, ReleasingResponse
from serve_app.frontend.app import hop_clock, live_limits, request_id, take_replica_stamps
from serve_app.frontend.auth import CACHE_SALT_STATE_KEY, CLIENT_KEY_STATE_KEY
from serve_app.frontend.containment import Containment, fingerprint
from serve_app.frontend.deadlines import Retryable, bounded_chunks, non_stream_deadline_s
from serve_app.frontend.errors import EngineUnavailable, OpenAIError, RoleUnavailable
from serve_app.frontend.guards import (
    Admit,
    AdmissionGate,
    ContainmentGate,
    Guard,
    RoleGate,
    SaturationGate,
    run_guards,
)
from serve_app.frontend.limits import parse_json_object, requested_max_tokens, sequences, validate_request
from serve_app.frontend.overflow import BACKEND_HEADER, Overflow
from serve_app.roles import RoleWatch
from serve_app.telemetry.logs import get_logger, keep_replica_log

logger = get_logger(__name__)

HEALTH_CHECK_TIMEOUT_S = 10.0
VALIDATE_IN_THREAD_BYTES = 256 * 1024  # larger bodies are parsed and validated off the event loop
HEALTH_CACHE_S = 1.0  # /health is open: at most one round of checks per second, however often it is called
ADMIT_STATE_KEY = "rld_admit"
# Largest output assumed for a non-streamed request's deadline when neither the request, limits.max_tokens
# nor the context length bound it.
UNBOUNDED_OUTPUT_TOKENS = 32768


@dataclass(frozen=True)
class Upstream:
    """Where the frontend's requests are served, and what follows from it (no behaviour left implicit)."""

    name: str
    retries_dead_replica: bool  # Serve can route a second attempt to another replica
    routes_by_session: bool  # a session id steers Serve's replica choice
    admission_scope: str  # what admission and overflow limits are per (logged and documented)


# A separate frontend deployment calling the serving deployment through a DeploymentHandle.
REMOTE = Upstream("remote deployment", retries_dead_replica=True, routes_by_session=True, admission_scope="frontend replica")
# frontend.direct_streaming: the frontend inside the serving replica, calling its own methods.
THIS_REPLICA = Upstream("this replica", retries_dead_replica=False, routes_by_session=False, admission_scope="serving replica")


class BoundedOpenAiIngress(OpenAiIngress):
    """OpenAiIngress with validation, guards (containment, roles, overflow, admission), deadlines on engine
    calls and GET /health (readiness over both roles)."""

    def __init__(
        self,
        llm_deployments,
        model_cards,
        *,
        app_config: AppConfig,
        upstream: Upstream = REMOTE,
        lora_paths: Optional[dict[str, str]] = None,
        role_deployments: Optional[dict[str, str]] = None,
        **kwargs: Any,
    ):
        keep_replica_log()  # the replica's log file outlives a library's logging.config (telemetry.logs)
        super().__init__(llm_deployments, model_cards, lora_paths=lora_paths, **kwargs)
        self._config = app_config
        self._upstream = upstream
        self._timeouts = app_config.timeouts
        self._limits = app_config.limits
        self._failover = app_config.failover
        self._max_model_len = app_config.max_model_len()
        in_flight, queued = app_config.admission_limits()
        self._admission = Admission(
            in_flight,
            queued,
            max_queue_wait_s=app_config.admission.max_queue_wait_s,
            retry_after_s=app_config.admission.retry_after_s,
        )
        self._overflow = Overflow(app_config.overflow, self._timeouts)
        self._containment = Containment(app_config.containment, model=app_config.model.id)
        self._roles = RoleWatch(role_deployments or {}, poll_s=self._failover.status_poll_s)
        self._guards: Sequence[Guard] = (
            ContainmentGate(self._containment),
            RoleGate(self._blocking_role, self._overflow),
            SaturationGate(self._admission, self._overflow),
            AdmissionGate(self._admission),
        )
        self._app: Any = None  # the ASGI app serving this ingress when it is not Serve's wrapper (direct streaming)
        self._health: Optional[tuple[float, int, dict[str, Any], dict[str, str]]] = None
        self._health_lock = asyncio.Lock()
        logger.info("frontend serving through %s; admission and overflow limits per %s",
                    upstream.name, upstream.admission_scope)
        try:
            self._roles.ensure_started()
        except Exception:  # noqa: BLE001 - started lazily on the first request instead
            pass

    # ---- live values (Serve's user_config) ----

    def reconfigure(self, user_config: Optional[dict[str, Any]]) -> None:
        """The live values (config.LIVE_FIELDS: timeouts, limits) in force from the next request on, without
        a restart. Serve calls it after the constructor and whenever the deployment's user_config changes
        (the chart passes them there, so a `helm upgrade` of only these values restarts no replica)."""
        config = self._config.with_live(user_config)
        changed = [name for name in LIVE_FIELDS if getattr(config, name) != getattr(self._config, name)]
        self._config = config
        self._timeouts = config.timeouts
        self._limits = config.limits
        self._overflow.set_timeouts(config.timeouts)
        app = self._app if self._app is not None else getattr(self, "app", None)  # Serve's ingress wrapper's app
        limits = live_limits(app)
        if limits is not None:
            limits.limits = config.limits
        elif app is not None:
            logger.warning("live config: this ingress's app has no live limits; limits.max_body_bytes stays as built")
        if changed:
            logger.info("live config: %s changed (in force from the next request; nothing restarted)", ", ".join(changed))

    def bind_app(self, app: Any) -> None:
        """The ASGI app this ingress serves through when it is not Serve's ingress wrapper (direct streaming)."""
        self._app = app

    # ---- endpoints ----

    async def chat(self, request: Request) -> Response:
        return await self._serve_openai(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._serve_openai(request, "completions")

    async def health(self, request: Request) -> JSONResponse:
        """Readiness: 200 when requests can be served (both roles up, or prefill down but decode
        prefills locally: status "degraded"), 503 otherwise. Anonymous callers (auth on, no valid key) get
        the status word only; callers who may use the API also get the models and each role's state word.
        Serve's messages and health-check exceptions go to this replica's log, never into the answer."""
        status_code, body, headers = await self._cached_health()
        detailed = not self._config.auth.enabled or bool(request.scope.get("state", {}).get(CLIENT_KEY_STATE_KEY))
        if not detailed:
            body = {"status": body["status"]}
        return JSONResponse(status_code=status_code, content=body, headers=headers)

    async def _cached_health(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        async with self._health_lock:  # concurrent callers share one round of checks
            now = time.monotonic()
            if self._health is None or now - self._health[0] >= HEALTH_CACHE_S:
                status_code, body, headers = await self._check_health()
                self._health = (time.monotonic(), status_code, body, headers)
            _, status_code, body, headers = self._health
            return status_code, body, headers

    async def _check_health(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        roles: dict[str, str] = {}
        for role, state in self._roles.snapshot().items():
            roles[role] = "unknown" if state is None else ("ok" if state.available else "unavailable")
            if state is not None and not state.available:
                logger.warning("health: the %s role is unavailable: %s", role, state.describe())
        blocking = await self._blocking_role()
        if blocking is None:
            roles.setdefault("decode", "ok")  # not watched when this is the decode replica (direct streaming)
            for model_id, handle in self._default_serve_handles.items():
                try:
                    await asyncio.wait_for(handle.check_health.remote(), timeout=HEALTH_CHECK_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
                    logger.warning("health: model %r failed its health check: %s: %s", model_id, type(exc).__name__, exc)
                    roles["decode"] = "unavailable"
                    blocking = EngineUnavailable(f"The engine of model {model_id!r} is not healthy.")
        models = sorted(self._default_serve_handles)
        if blocking is not None:
            body = {**blocking.body(), "status": "unavailable", "models": models, "roles": roles}
            return 503, body, blocking.headers()
        degraded = any(v == "unavailable" for v in roles.values())
        return 200, {"status": "degraded" if degraded else "ok", "models": models, "roles": roles}, {}

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

    def _role_down_since(self, since: float, roles: Sequence[str]) -> Callable[[], Optional[OpenAIError]]:
        """For a request waiting for its first chunk: a needed role seen down after it was sent."""

        def check() -> Optional[OpenAIError]:
            for role in roles:
                state = self._roles.unavailable(role, since=since)
                if state is not None:
                    error = self._unavailable(role, state)
                    logger.warning("%s (%s)", error.message, error.detail)
                    return error
            return None

        return check

    def _validate(self, raw: bytes, kind: str) -> tuple[dict[str, Any], Any]:
        data = parse_json_object(raw)
        body = validate_request(
            data, kind, limits=self._limits, models=self._model_cards, max_model_len=self._max_model_len, raw=raw
        )
        return data, body

    async def _serve_openai(self, request: Request, kind: str) -> Response:
        rid = request_id(request)
        raw = await request.body()
        if len(raw) > VALIDATE_IN_THREAD_BYTES:
            # Linear and capped, but a few MB still take tens of ms: let the loop's other streams run meanwhile.
            data, body = await asyncio.to_thread(self._validate, raw, kind)
        else:
            data, body = self._validate(raw, kind)
        model_id = body.model or next(iter(self._model_cards))
        admit = Admit(
            kind=kind,
            data=data,
            model_id=model_id,
            request_id=rid,
            fingerprint=fingerprint(kind, data),
            max_tokens=requested_max_tokens(body),
            weight=sequences(body),
        )
        self._salt_cache(request, body)
        answered = await run_guards(self._guards, admit)
        if answered is not None:
            return answered
        request.scope.setdefault("state", {})[ADMIT_STATE_KEY] = admit
        try:
            response = await self._process_llm_request(body, call_method=kind, raw_request=request)
        except BaseException:
            admit.release_all()
            raise
        return ReleasingResponse(response, admit.release_all, {BACKEND_HEADER: "cluster"})

    def _salt_cache(self, request: Request, body: Any) -> None:
        """Per-key prefix cache (auth.cache_salt_per_key): the key's salt, combined with the client's own."""
        salt = request.scope.get("state", {}).get(CACHE_SALT_STATE_KEY)
        if salt:
            own = getattr(body, "cache_salt", None) or ""
            body.cache_salt = hashlib.sha256(f"{salt}:{own}".encode()).hexdigest()[:32]

    async def _process_llm_request(self, body, call_method: str, raw_request: Optional[Request] = None) -> Response:
        """Ray's, without its fixed 600 s router timeout around the first response (the deadlines in
        `_get_response` bound every wait, scaled for non-streamed responses) and with OpenAI-shaped errors."""
        gen = self._get_response(body=body, call_method=call_method, raw_request=raw_request)
        initial, gen = await peek_at_generator(gen)
        first = initial[0] if isinstance(initial, list) and initial else initial
        if isinstance(first, ErrorResponse):  # bounded_chunks maps errors; this is a safety net
            raise OpenAIError.from_engine(first, f"{call_method} request")
        if isinstance(first, NON_STREAMING_RESPONSE_TYPES):
            # The answer is whole in its one chunk. Read the response to its end (bounded: between_tokens_s)
            # so the serving replica ends it itself: leaving it open cancelled it on collection, racing the
            # replica's record of the request (ray_rld_request_seconds missed non-streamed requests).
            async for _ in gen:
                pass
            return JSONResponse(content=first.model_dump())
        return StreamingResponse(openai_json_wrapper(gen), media_type="text/event-stream")

    async def _get_response(self, *, body, call_method: str, raw_request=None):
        """Ray's `_get_response` (handle call to the serving deployment), plus: deadlines, a role that
        goes away ends the wait, one retry when the replica was gone before it ran the request (remote
        upstream only; never when its engine died running it: containment), and the downstream request
        is cancelled explicitly when this one ends early."""
        model_id = await self._get_model_id(body.model)
        handle = self._get_configured_serve_handle(model_id)
        if raw_request is not None and self._upstream.routes_by_session:
            session_id = session_id_from_headers(raw_request.headers)
            if session_id:
                handle = handle.options(session_id=session_id)
        if isinstance(body, ChatCompletionRequest):
            body = sanitize_chat_completion_request(body)
        raw_info = RawRequestInfo.from_starlette_request(raw_request) if raw_request is not None else None
        if raw_info is not None:
            # The client's key stays here: the engines (and vLLM's raw request) never see it.
            raw_info.headers = {k: v for k, v in (raw_info.headers or {}).items() if k.lower() != "authorization"}
        what = f"{call_method} request for model {body.model!r}"
        admit: Optional[Admit] = getattr(raw_request, "scope", {}).get("state", {}).get(ADMIT_STATE_KEY)
        on_killed = None
        if admit is not None:
            on_killed = lambda: self._containment.killed_engine(admit.fingerprint, admit.request_id, "decode")  # noqa: E731
        stream = bool(getattr(body, "stream", False))
        first_s = self._timeouts.first_token_s
        roles = self._needed_roles()
        if not stream:
            cap = requested_max_tokens(body) or self._max_model_len or UNBOUNDED_OUTPUT_TOKENS
            first_s = non_stream_deadline_s(first_s, self._timeouts.non_stream_per_token_s, cap)
            roles = ["decode"]  # prefill finished long before a non-streamed answer arrives
        clock = hop_clock(raw_request)
        if clock is not None:
            clock.model = body.model
            clock.stamp("ingress_dispatched")
        attempts = (1, 2) if self._upstream.retries_dead_replica else (1,)
        for attempt in attempts:
            sent = time.monotonic()
            response = getattr(handle, call_method).remote(body, raw_info)
            finished = False
            first = True
            try:
                async for chunk in bounded_chunks(
                    response,
                    first_s=first_s,
                    between_s=self._timeouts.between_tokens_s,
                    what=what,
                    role_down=self._role_down_since(sent, roles),
                    on_killed=on_killed,
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
                if attempt == attempts[-1]:
                    raise retryable.error from None
                logger.warning("%s; sending it once more (Serve routes around the dead replica)", retryable.error.message)
            finally:
                if not finished:
                    try:
                        response.cancel()
                    except (RayServeException, RuntimeError):
                        pass
