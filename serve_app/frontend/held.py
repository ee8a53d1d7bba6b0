"""Requests that Serve's own proxy holds for an app with no running replica: a 503 naming the role, not a wait.

Why: in Serve's high-throughput mode (the chart's default) HAProxy sends each request straight to a replica of the
app's ingress deployment, and when none of them is up, to its backup server, the node's Serve proxy. That proxy's
router holds the request until a replica of the ingress deployment is running, with no deadline: minutes while an
engine restarts or its placement group waits for a GPU node, forever when it never comes. With the separate
frontend deployment (the default graph) that is the frontend; with `frontend.direct_streaming` it is the serving
engine itself (decode, or the aggregated engine), so a client would wait out a whole engine restart instead of
getting the frontend's fast 503 naming the role (serve_app/README.md, "Direct streaming"). Without HAProxy
(`serve.highThroughput: false`) every request passes through that proxy and the same holds.

`HeldRequestGuard` is an ASGI middleware for Serve's proxy (installed with the edge guard through
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve_app.frontend.edge:proxy_middlewares; a no-op inside replicas,
where the request has reached a replica already). It lets the proxy route every request as before. A request that has had no response
start after `grace_s` is looked at: if its app's ingress deployment has no replica Serve routes to, per the
controller, the guard ends the proxy's hold the way a client disconnect would (the proxy cancels the queued
request) and answers an OpenAI-shaped 503 with Retry-After naming the role (`decode_unavailable`, ...). A request
whose replica is running (a long non-streamed answer, a prompt still prefilling) is never touched, and one whose
only replica dies while it waits gets the 503 as soon as the controller counts the replica gone.

Reads of the controller are shared and bounded: one read (all apps' details, the dict `serve.status()` is built
from) at most every `refresh_s` per proxy and only while some request is held past `grace_s`, each with a deadline
(`read_timeout_s`); a read that fails or times out leaves the held requests alone (they wait as Serve would
make them), and is logged.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from serve_app.config import ENGINE_DEPLOYMENT_PREFIX, FRONTEND_DEPLOYMENT
from serve_app.frontend.edge import openai_error_body, role_unavailable_message, send_json_error
from serve_app.roles import SERVING, _value
from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

GRACE_S = 0.5
REFRESH_S = 1.0
READ_TIMEOUT_S = 5.0
RETRY_AFTER_S = 10
SERVE_OWN_PATHS = frozenset({"/-/healthz", "/-/routes"})


@dataclass(frozen=True)
class Target:
    """The app a request path routes to and its ingress deployment, as the controller last described them."""

    app: str
    deployment: str
    running: int  # replicas in a state Serve routes to
    status: str

    @property
    def role(self) -> str:
        """Our role name for the deployment (frontend, prefill, decode, aggregated), else the deployment's name."""
        if self.deployment == FRONTEND_DEPLOYMENT:
            return "frontend"
        for role, prefix in ENGINE_DEPLOYMENT_PREFIX.items():
            if self.deployment.startswith(prefix):
                return role
        return self.deployment


def _matches(route: str, path: str) -> bool:
    """Serve's proxy's prefix rule (ProxyRouter.match_route): '/a' matches '/a' and '/a/...', not '/ab'."""
    if not path.startswith(route):
        return False
    return route.endswith("/") or len(path) == len(route) or path[len(route)] == "/"


def target_for(details: Mapping[str, Any], path: str) -> Optional[Target]:
    """The app whose route prefix is the longest match of `path` and its ingress deployment's running replicas, from
    the controller's details dict (ServeInstanceDetails as a dict); None when nothing matches or the app does not
    say which deployment is its ingress."""
    best: Optional[tuple[str, str, Mapping[str, Any]]] = None
    for name, app in (details.get("applications") or {}).items():
        route = (app or {}).get("route_prefix")
        if route and _matches(route, path) and (best is None or len(route) > len(best[0])):
            best = (route, name, app)
    if best is None:
        return None
    _, name, app = best
    ingress = ((app.get("deployment_topology") or {}).get("ingress_deployment")) or None
    deployments = app.get("deployments") or {}
    if ingress is None and len(deployments) == 1:
        ingress = next(iter(deployments))
    if ingress is None:
        return None
    deployment = deployments.get(ingress) or {}
    running = sum(1 for r in deployment.get("replicas") or () if _value(r.get("state")) in SERVING)
    return Target(name, ingress, running, _value(deployment.get("status", "NOT_DEPLOYED")))


def _read_details() -> Mapping[str, Any]:
    from serve_app.upstream import get_global_client

    client = get_global_client(raise_if_no_controller_running=False)
    return client.get_serve_details() if client is not None else {}


def _in_replica() -> bool:
    try:
        from ray import serve

        serve.get_replica_context()
        return True
    except Exception:  # RayServeException outside a replica (Serve's proxy), or no Ray at all
        return False


class ControllerView:
    """The controller's details, read at most every `refresh_s` and only when asked; concurrent askers share one
    read. `read` (blocking, run in a thread) and `clock` are injectable for tests."""

    def __init__(
        self,
        *,
        refresh_s: float = REFRESH_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        read: Callable[[], Mapping[str, Any]] = _read_details,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.refresh_s = refresh_s
        self._read_timeout_s = read_timeout_s
        self._read = read
        self._clock = clock
        self._details: Optional[Mapping[str, Any]] = None
        self._read_at = float("-inf")
        self._pending: Optional[asyncio.Future] = None
        self.reads = 0

    async def details(self) -> Optional[Mapping[str, Any]]:
        """The latest details no older than `refresh_s` (None if no read has succeeded yet)."""
        if self._clock() - self._read_at < self.refresh_s:
            return self._details
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._read_once())
        pending = self._pending
        await asyncio.shield(pending)
        return self._details

    async def _read_once(self) -> None:
        self.reads += 1
        started = self._clock()
        try:
            self._details = await asyncio.wait_for(asyncio.to_thread(self._read), self._read_timeout_s)
        except Exception as e:  # noqa: BLE001 - a failed read must not fail the request; it waits as Serve makes it
            logger.warning(
                "held-request guard: reading Serve's controller failed (%s: %s); requests held by this proxy keep "
                "waiting for a replica until a read succeeds", type(e).__name__, str(e)[:200],
            )
        finally:
            self._read_at = started
            self._pending = None


class HeldRequestGuard:
    """ASGI middleware for Serve's proxy: a request held past `grace_s` while its app's ingress deployment has no
    running replica is answered 503 naming the role (module docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        grace_s: float = GRACE_S,
        view: Optional[ControllerView] = None,
        in_replica: Callable[[], bool] = _in_replica,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self._grace_s = grace_s
        self._view = view or ControllerView()
        self._in_replica = in_replica
        self._active: Optional[bool] = None  # decided on the first request: off inside a replica
        self._clock = clock

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self._active is None:
            self._active = not self._in_replica()
        if not self._active or scope.get("type") != "http" or scope.get("path") in SERVE_OWN_PATHS:
            await self.app(scope, receive, send)
            return
        await _Held(self, scope, receive, send).run()


class _Held:
    """One request through the proxy: started, aborted, and the task that runs the proxy's handling of it."""

    def __init__(self, guard: HeldRequestGuard, scope: dict, receive: Any, send: Any) -> None:
        self.guard, self.scope, self.receive, self.send = guard, scope, receive, send
        self.started = False  # the proxy began a response: the request reached a replica (or was answered)
        self.aborted = asyncio.Event()

    async def _receive(self) -> dict:
        if self.aborted.is_set():
            return {"type": "http.disconnect"}
        message = asyncio.ensure_future(self.receive())
        abort = asyncio.ensure_future(self.aborted.wait())
        try:
            done, _ = await asyncio.wait({message, abort}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the proxy stopped listening (its request is over): leave nothing pending
            message.cancel()
            abort.cancel()
            raise
        if message in done:
            abort.cancel()
            return message.result()
        message.cancel()
        return {"type": "http.disconnect"}  # what the proxy does on a client disconnect: cancel the held request

    async def _send(self, message: dict) -> None:
        if self.aborted.is_set():
            return  # the client has our 503
        if message.get("type") == "http.response.start":
            self.started = True
        await self.send(message)

    async def run(self) -> None:
        guard = self.guard
        arrived = guard._clock()
        task = asyncio.ensure_future(guard.app(self.scope, self._receive, self._send))
        wait_s = guard._grace_s
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=wait_s)
                if done or self.started:
                    await task
                    return
                details = await guard._view.details()
                target = target_for(details, self.scope.get("path", "")) if details is not None else None
                if target is not None and target.running == 0 and not self.started and not task.done():
                    await self._answer(task, target, guard._clock() - arrived)
                    return
                wait_s = guard._view.refresh_s
        except asyncio.CancelledError:  # the server stops this request: so does the proxy's handling of it
            task.cancel()
            raise

    async def _answer(self, task: asyncio.Future, target: Target, held_s: float) -> None:
        self.aborted.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 2.0)
        except Exception:  # noqa: BLE001 - timed out, or the proxy's handling ended with an error: stop it
            task.cancel()
        code = f"{target.role}_unavailable"
        headers = dict(self.scope.get("headers") or [])
        logger.warning(
            "request_id=%s %s held by Serve's proxy %.1f s while app %r's ingress deployment %r had no running "
            "replica (status %s): answered 503 %s. Operators: `serve status`, the %s replicas' logs, `ray status` "
            "for placement", headers.get(b"x-request-id", b"").decode("latin-1"), self.scope.get("path"), held_s,
            target.app, target.deployment, target.status, code, target.role,
        )
        body = openai_error_body(role_unavailable_message(target.role, RETRY_AFTER_S), status_code=503, code=code)
        await send_json_error(self.send, 503, body, headers={"Retry-After": str(RETRY_AFTER_S)})
