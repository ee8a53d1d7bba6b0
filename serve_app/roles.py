"""Which serving roles can take requests right now, as Serve's controller sees them.

Why: when a role has no running replica (none RUNNING or PENDING_MIGRATION: the states Serve routes to) (its placement group cannot be scheduled, or every replica is
dead and restarting), Serve's router waits for one without a deadline and the app stays DEPLOYING; a
client would wait for the 300 s first-token timeout. A `RoleWatch` reads Serve's status in the
background, so the ingress answers 503 naming the role (or overflows) at once, the decode replica skips a
prefill role that is down, and readiness reports both roles.

A role counts as down only once two reads in a row found it without running replicas (`confirmed`),
and before a request is turned away for it, Serve is read again (`confirmed_unavailable`: one shared
read that started after the request arrived): the last background read may predate a replica that just
came up (an app's first seconds), and nobody gets a 503 from a stale read. A request already waiting
for a role sees it go down at the next read.

Reads are bounded, in rate and in time. A read is one controller RPC for every app's details, the dict
`serve.status()` is built from; the watch reads that dict itself (`status_from_details`): `serve.status()`
turns it into Ray's pydantic models and so re-pickles each deployment's request router class with cloudpickle
(10 % of a frontend replica's CPU at 24 req/s on one H100, bench/results/2026-12-06-h100-saturation, in a
thread that holds the GIL the replica's event loop needs). Even so the watch reads every `poll_s` only while requests
ask for role states (for `active_s` after the last one), and every `idle_poll_s` otherwise (idle replicas
cost next to nothing, a role that stays down included). The first request after an idle spell wakes the
loop for a read at once. Every read has a deadline (`read_timeout_s`); a read that fails, times out or
finds the app gone still counts as done, so nobody waits on it more than once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from serve_app.telemetry.logs import get_logger

logger = get_logger(__name__)

# Replica states Serve routes requests to (its DeploymentState.get_running_replica_infos): PENDING_MIGRATION is a
# replica on a draining node (a deleted pod's preStop, serve_app.pod.drain) that serves until Serve stops it.
SERVING = frozenset({"RUNNING", "PENDING_MIGRATION"})


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
    """Reads of the role deployments of one Serve app, in the background on the replica's event loop.

    `read_status` (default `serve.status`, called in a worker thread) and `clock` (monotonic seconds) are
    injectable for tests.
    """

    def __init__(
        self,
        deployments: dict[str, str],
        *,
        poll_s: float,
        app_name: Optional[str] = None,
        idle_poll_s: Optional[float] = None,
        active_s: float = 60.0,
        read_timeout_s: Optional[float] = None,
        read_status: Optional[Callable[[], Any]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deployments = dict(deployments)
        self._poll_s = poll_s
        self._idle_poll_s = max(poll_s, idle_poll_s if idle_poll_s is not None else max(30.0, 15 * poll_s))
        self._active_s = active_s
        self._read_timeout_s = read_timeout_s if read_timeout_s is not None else max(5.0, 2 * poll_s)
        self._read_status = read_status
        self._clock = clock
        self._app_name = app_name
        self._states: dict[str, RoleState] = {}
        self._task: Optional[asyncio.Task] = None
        self._wake: Optional[asyncio.Event] = None
        self._refresh: Optional[asyncio.Future] = None
        self._fresh_since = float("-inf")  # start time of the newest read that completed (or failed)
        self._last_read_at = float("-inf")
        self._asked_at = float("-inf")  # last time a request asked for a role's state
        self._gauge = None
        self.reads = 0  # reads started (tests and logs)

    # ---- rate ----

    def interval(self, now: Optional[float] = None) -> float:
        """Seconds until the next background read: `poll_s` while requests ask, `idle_poll_s` when idle."""
        now = self._clock() if now is None else now
        return self._poll_s if now - self._asked_at < self._active_s else self._idle_poll_s

    def _touch(self) -> None:
        """A request asked: read at `poll_s` for the next `active_s`; after an idle spell, read at once."""
        now = self._clock()
        was_idle = now - self._asked_at >= self._active_s
        self._asked_at = now
        self.ensure_started()
        if was_idle and now - self._last_read_at >= self._poll_s and self._wake is not None:
            self._wake.set()

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="rld-role-watch")

    # ---- states ----

    def state(self, role: str) -> Optional[RoleState]:
        self._touch()
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
        """`unavailable(role)` as of a read of Serve that started after this call (shared by callers).
        Waits for at most two reads (a shared one already under way, then its own), each bounded by
        `read_timeout_s`; when a read fails or finds no answer, the last known state stands."""
        if self.unavailable(role) is None:
            return None
        asked = self._clock()
        for _ in range(2):
            if self._fresh_since >= asked:
                break
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.ensure_future(self._read())
            await asyncio.shield(self._refresh)
        return self.unavailable(role)

    def snapshot(self) -> dict[str, Optional[RoleState]]:
        self._touch()
        return {role: self._states.get(role) for role in self._deployments}

    # ---- reads ----

    async def _run(self) -> None:
        assert self._wake is not None
        task = asyncio.current_task()

        def cancel_swallowed() -> None:
            # asyncio.wait_for (Python < 3.12) can swallow a cancel that lands as its inner await ends; the watch
            # would then read on after its replica began shutting down (seen: an event loop's close hung)
            if task is not None and task.cancelling():
                raise asyncio.CancelledError

        while True:
            await self._read()
            cancel_swallowed()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval())
            except asyncio.TimeoutError:
                pass
            cancel_swallowed()

    async def _read(self) -> None:
        """One bounded read; never raises (but for cancellation): a failure keeps the last known states."""
        try:
            await asyncio.wait_for(self.poll(), timeout=self._read_timeout_s)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            logger.warning(
                "role watch: reading Serve's status from the controller took longer than %.0f s; keeping the last "
                "known role states (is the Serve controller overloaded? see the controller log on the head)",
                self._read_timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - keep the last known states, try again later
            logger.warning(
                "role watch: reading Serve's status from the controller failed (%s: %s)", type(exc).__name__, exc
            )

    async def poll(self) -> None:
        """Read Serve once and update the states. A read that ends (even finding the app gone) is fresh."""
        started = self._clock()
        self._last_read_at = started
        self.reads += 1
        try:
            status = await asyncio.to_thread(self._read_status or _serve_status)
            app_name = self._app_name or _own_app_name()
            app = status.applications.get(app_name)
            if app is None:
                logger.warning("role watch: app %r is not in Serve's status (being deleted?)", app_name)
                return
            now = self._clock()
            for role, name in self._deployments.items():
                overview = app.deployments.get(name)
                if overview is None:
                    state = RoleState(name, 0, "NOT_DEPLOYED", "not part of the app yet", now)
                else:
                    running = sum(
                        n for s, n in overview.replica_states.items() if str(getattr(s, "value", s)) in SERVING
                    )
                    status_name = str(getattr(overview.status, "value", overview.status))
                    state = RoleState(name, running, status_name, overview.message, now)
                previous = self._states.get(role)
                if not state.available and previous is not None and not previous.available:
                    state = dataclasses.replace(state, confirmed=True)
                if previous is None or previous.available != state.available:
                    log = logger.info if state.available else logger.warning
                    log("role %s: %s", role, f"{state.running} running replica(s)" if state.available else state.describe())
                self._states[role] = state
                self._publish(role, state)
        finally:
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


@dataclass(frozen=True)
class DeploymentView:
    """What the watch reads of one deployment (the fields of Serve's DeploymentStatusOverview it uses)."""

    replica_states: dict[str, int]
    status: str
    message: str


@dataclass(frozen=True)
class AppView:
    deployments: dict[str, DeploymentView]


@dataclass(frozen=True)
class StatusView:
    applications: dict[str, AppView]


def _value(x: Any) -> str:
    """An enum's value (the controller's dict holds Serve's str enums: ReplicaState.RUNNING -> "RUNNING")."""
    return str(getattr(x, "value", x))


def status_from_details(details: Mapping[str, Any]) -> StatusView:
    """Replica states per deployment from the controller's details dict (ServeInstanceDetails as a dict, the
    input of `serve.status()`), counted as `serve.status()` counts them; missing parts read as empty."""
    apps = {}
    for app_name, app in (details.get("applications") or {}).items():
        deployments = {}
        for name, d in ((app or {}).get("deployments") or {}).items():
            states = Counter(_value(r.get("state")) for r in (d.get("replicas") or ()))
            deployments[name] = DeploymentView(
                dict(states), _value(d.get("status", "UNKNOWN")), str(d.get("message") or "")
            )
        apps[app_name] = AppView(deployments)
    return StatusView(apps)


def _serve_status() -> StatusView:
    from serve_app.upstream import get_global_client

    client = get_global_client(raise_if_no_controller_running=False)
    return status_from_details(client.get_serve_details() if client is not None else {})


def _own_app_name() -> str:
    from ray import serve

    return serve.get_replica_context().app_name
