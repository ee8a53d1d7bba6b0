"""Direct streaming: the frontend runs inside the serving engine replica, one Serve hop fewer.

Why: with a separate frontend deployment every request crosses ingress replica -> serving replica and
its first batch comes back the same way (2.9 ms of the 7.5 ms our app added to a 1k-token TTFT on an
H200, bench/results/2026-12-01-h200). Ray Serve LLM's direct streaming
(`RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING`) removes that hop: the serving deployment is itself the HTTP
ingress and HAProxy sends each request straight to a serving replica's HTTP port (our builder leaves out
Ray's `LLMRouter`, which HAProxy would ask over HTTP for every request; HAProxy balances the replicas
itself). Ray serves vLLM's native ASGI app there, which has none of what makes the endpoint safe to put on
a network (API keys, body limits and validation, admission, overflow, deadlines, OpenAI-shaped errors,
only the served endpoints) and orchestrates no prefill (Ray's P/D variant re-points two routes).

So in `frontend.direct_streaming` mode the serving replica's ASGI app is ours: the same FastAPI app
(`ingress.make_app`) and the same `BoundedOpenAiIngress` as the separate frontend, constructed in the
replica with a `LocalServerHandle` — the replica's own chat()/completions() in its event loop instead of a
DeploymentHandle to another process — and `upstream=THIS_REPLICA`, which says what differs, explicitly:
no second attempt when the engine is gone (there is no other replica behind this handle; Serve restarts
this one and HAProxy sends the client's retry elsewhere), no session routing, decode not watched (it is
this replica). Every guard runs unchanged, in the same order; only the hop is gone.
What changes: admission and overflow limits hold per serving replica (there is no frontend replica), and
`frontend.replicas`/`num_cpus` size nothing and `frontend.max_ongoing_requests` is the room admission divides
per serving replica (HAProxy sends straight to a replica's HTTP port, past Serve's request router and its
max_ongoing_requests, so admission is the bound). Measured on one H200: TTFT 1.07x direct vLLM at 1k tokens
(1.20x with the separate frontend), overhead 2.6 ms (bench/results/2026-12-01-h200-direct); equal or lower
TPOT under load (bench/results/2026-12-01-h200-direct-load).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI

from serve_app.upstream import to_model_metadata
from serve_app.config import AppConfig
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)


class LocalResponse:
    """A call of one of the replica's own methods, shaped like what a DeploymentHandle call returns:
    awaitable (unary methods such as check_health) or async-iterable (streamed chat/completions), with
    `cancel()`."""

    def __init__(self, call: Any) -> None:
        self._call = call  # the coroutine of the method call, not started yet
        self._stream: Optional[AsyncIterator[Any]] = None

    def __await__(self):
        return self._call.__await__()

    def __aiter__(self) -> AsyncIterator[Any]:
        if self._stream is None:
            self._stream = self._iterate()
        return self._stream

    async def _iterate(self) -> AsyncIterator[Any]:
        result = self._call if hasattr(self._call, "__aiter__") else await self._call
        if hasattr(result, "__aiter__"):
            try:
                async for chunk in result:
                    yield chunk
            finally:
                aclose = getattr(result, "aclose", None)
                if aclose is not None:
                    await aclose()  # the engine aborts the request now, not when it is collected
        else:
            yield result

    def cancel(self) -> None:
        """Stop the call: the ingress's stream wrapper already closed it when it ended early, so this only
        closes a stream that was never iterated (or the coroutine that was never awaited)."""
        if self._stream is None:
            close = getattr(self._call, "close", None) or getattr(self._call, "aclose", None)
            if close is not None and not hasattr(self._call, "__aiter__"):
                close()
        else:
            asyncio.ensure_future(self._close_stream())

    async def _close_stream(self) -> None:
        try:
            await self._stream.aclose()  # type: ignore[union-attr]
        except RuntimeError:  # still running: whoever iterates it closes it
            pass


class _LocalMethod:
    def __init__(self, server: Any, name: str) -> None:
        self._method = getattr(server, name)

    def remote(self, *args: Any, **kwargs: Any) -> LocalResponse:
        return LocalResponse(self._method(*args, **kwargs))


class LocalServerHandle:
    """The serving replica itself behind DeploymentHandle's interface (`.options(...)`, `.<method>.remote(...)`),
    so `BoundedOpenAiIngress` serves from inside it unchanged. Options only steer Serve's routing between
    replicas, which already happened (HAProxy picked this one), so they are accepted and ignored."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def options(self, **_: Any) -> "LocalServerHandle":
        return self

    def __getattr__(self, name: str) -> _LocalMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _LocalMethod(self._server, name)


class DirectIngressMixin:
    """For a serving LLMServer subclass: its ASGI app (Serve's late-bound ingress, see
    `LLMServer.__serve_build_asgi_app__`) is the frontend's app serving through this replica."""

    _app_config: AppConfig
    _role_deployments: dict[str, str]

    async def __init__(self, llm_config: Any, *, app_config: AppConfig,
                       role_deployments: Optional[dict[str, str]] = None, **kwargs: Any) -> None:
        """The serving class's own arguments, plus the app's config and the other roles' deployment names."""
        self._app_config = app_config
        self._role_deployments = dict(role_deployments or {})
        await super().__init__(llm_config, **kwargs)  # type: ignore[misc]

    def reconfigure(self, user_config: Optional[dict[str, Any]]) -> None:
        """Serve's user_config (the live values): the frontend's part here, the serving class's in super()."""
        self._app_config = self._app_config.with_live(user_config)
        ingress = getattr(self, "_direct_ingress", None)
        if ingress is not None:
            ingress.reconfigure(user_config)
        super().reconfigure(user_config)  # type: ignore[misc]

    async def __serve_build_asgi_app__(self) -> FastAPI:
        from serve_app.frontend.app import ENDPOINTS, make_app
        from serve_app.frontend.ingress import THIS_REPLICA, BoundedOpenAiIngress

        llm_config = self._llm_config  # type: ignore[attr-defined]
        model_id = llm_config.model_id
        # Only the other roles are watched: this replica is decode (or the aggregated engine) itself, so it
        # is up whenever it answers; reading itself from Serve would report it down while it initializes.
        roles = dict(self._role_deployments)
        ingress = BoundedOpenAiIngress(
            {model_id: LocalServerHandle(self)},
            {model_id: to_model_metadata(model_id, llm_config)},
            lora_paths={},
            app_config=self._app_config,
            upstream=THIS_REPLICA,
            role_deployments=roles,
        )
        app = make_app(self._app_config)
        ingress.bind_app(app)
        for name, route in ENDPOINTS.items():
            route(app)(getattr(ingress, name))
        self._direct_ingress = ingress  # keeps its role watch and admission alive with the replica
        logger.info("direct streaming: this replica serves the OpenAI endpoint itself (roles %s)", roles)
        return app
