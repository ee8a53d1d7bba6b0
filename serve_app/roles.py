"""Which serving roles can take requests right now, as Serve's controller sees them.

Why: when a role has no running replica (its placement group cannot be scheduled, or every replica is
dead and restarting), Serve's router waits for one without a deadline and the app stays DEPLOYING; a
client would wait for the 300 s first-token timeout. A `RoleWatch` reads `serve.status()` every
`poll_s` in the background, so the ingress answers 503 naming the role (or overflows) at once, the
decode replica skips a prefill role that is down, and readiness reports both roles.

A role counts as down only once two reads in a row found it without running replicas (`confirmed`),
and before a request is turned away for it, Serve is read again (`confirmed_unavailable`: one shared
read that started after the request arrived): the last background read may predate a replica that just
came up (an app's first seconds), and nobody gets a 503 from a stale read. A request already waiting
for a role sees it go down at the next read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)


@dataclass(frozen=True)
class RoleState:
    deployment: str
    running: int
    status: str
    message: str
    checked_at: float
    confirmed: bool = False  # down in this read and the one before it

    @property
    def available(self) -> bool:
        return self.running > 0

    def describe(self) -> str:
        detail = f" Serve says: {self.message}" if self.message else ""
        return f"deployment {self.deployment!r} has no running replica (status {self.status}).{detail}"


class RoleWatch:
    """Background poll of the role deployments of one Serve app (runs on the replica's event loop)."""

    def __init__(self, deployments: dict[str, str], *, poll_s: float, app_name: Optional[str] = None) -> None:
        self._deployments = dict(deployments)
        self._poll_s = poll_s
        self._app_name = app_name
        self._states: dict[str, RoleState] = {}
        self._task: Optional[asyncio.Task] = None
        self._refresh: Optional[asyncio.Future] = None
        self._fresh_since = float("-inf")  # start time of the newest read that completed
        self._gauge = None

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._task = loop.create_task(self._run(), name="rld-role-watch")

    def state(self, role: str) -> Optional[RoleState]:
        self.ensure_started()
        return self._states.get(role)

    def unavailable(self, role: str, *, since: Optional[float] = None) -> Optional[RoleState]:
        """The role's state when it is down: confirmed by two reads, or (with `since`, a monotonic time)
        read down at or after `since`. None when up or not known yet."""
        state = self.state(role)
        if state is None or state.available:
            return None
        if since is not None:
            return state if state.checked_at >= since else None
        return state if state.confirmed else None

    async def confirmed_unavailable(self, role: str) -> Optional[RoleState]:
        """`unavailable(role)` as of a read of Serve that started after this call (shared by callers)."""
        if self.unavailable(role) is None:
            return None
        asked = time.monotonic()
        while self._fresh_since < asked:
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.ensure_future(self.poll())
            try:
                await asyncio.shield(self._refresh)
            except Exception as exc:  # noqa: BLE001 - cannot read: keep the last known state
                logger.warning("role watch: reading serve.status() failed (%s: %s)", type(exc).__name__, exc)
                break
        return self.unavailable(role)

    def snapshot(self) -> dict[str, Optional[RoleState]]:
        self.ensure_started()
        return {role: self._states.get(role) for role in self._deployments}

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the last known states, try again
                logger.warning("role watch: reading serve.status() failed (%s: %s)", type(exc).__name__, exc)
            await asyncio.sleep(self._poll_s)

    async def poll(self) -> None:
        started = time.monotonic()
        status = await asyncio.to_thread(_serve_status)
        app_name = self._app_name or _own_app_name()
        app = status.applications.get(app_name)
        if app is None:
            return
        now = time.monotonic()
        for role, name in self._deployments.items():
            overview = app.deployments.get(name)
            if overview is None:
                state = RoleState(name, 0, "NOT_DEPLOYED", "not part of the app yet", now)
            else:
                running = sum(n for s, n in overview.replica_states.items() if str(getattr(s, "value", s)) == "RUNNING")
                state = RoleState(name, running, str(getattr(overview.status, "value", overview.status)), overview.message, now)
            previous = self._states.get(role)
            if not state.available and previous is not None and not previous.available:
                state = dataclasses.replace(state, confirmed=True)
            if previous is None or previous.available != state.available:
                log = logger.info if state.available else logger.warning
                log("role %s: %s", role, f"{state.running} running replica(s)" if state.available else state.describe())
            self._states[role] = state
            self._publish(role, state)
        self._fresh_since = max(self._fresh_since, started)

    def _publish(self, role: str, state: RoleState) -> None:
        if self._gauge is None:
            from ray.util.metrics import Gauge

            self._gauge = Gauge(
                "rld_role_running_replicas",
                description="Running replicas of each serving role of an app, as this replica last read from Serve.",
                tag_keys=("app", "role"),
            )
        self._gauge.set(state.running, tags={"app": self._app_name or _own_app_name(), "role": role})


def _serve_status():
    from ray import serve

    return serve.status()


def _own_app_name() -> str:
    from ray import serve

    return serve.get_replica_context().app_name
