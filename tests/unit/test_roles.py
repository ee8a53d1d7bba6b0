"""RoleWatch (serve_app/roles.py): reads of Serve's status are bounded in rate and in time.

The status reader and the clock are injected; no Ray needed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any, Optional

from serve_app.roles import RoleWatch


class FakeServe:
    """serve.status() of one app whose decode deployment has `running` replicas (or no app at all)."""

    def __init__(self, running: int = 0, *, app: bool = True) -> None:
        self.running = running
        self.app = app
        self.calls = 0
        self.block: Optional[threading.Event] = None  # set: the read hangs until released

    def __call__(self) -> Any:
        self.calls += 1
        if self.block is not None:
            self.block.wait(30)
        if not self.app:
            return SimpleNamespace(applications={})
        deployment = SimpleNamespace(replica_states={"RUNNING": self.running}, status="UPDATING", message="")
        return SimpleNamespace(applications={"app": SimpleNamespace(deployments={"Decode:m": deployment})})


def _watch(serve: FakeServe, **kwargs: Any) -> RoleWatch:
    watch = RoleWatch({"decode": "Decode:m"}, app_name="app", read_status=serve, **kwargs)
    watch._publish = lambda *_: None  # type: ignore[method-assign]  # ray metrics need a Ray worker
    return watch


def test_a_replica_on_a_draining_node_still_serves() -> None:
    """A deleted pod's preStop drains its Ray node: Serve keeps routing to its replicas (PENDING_MIGRATION) until
    it stops them, so the role is up until then (was: 503 `decode_unavailable` ~25 s before decode stopped)."""
    serve = FakeServe(running=0)

    def status() -> Any:
        deployment = SimpleNamespace(replica_states={"PENDING_MIGRATION": 1, "STARTING": 1}, status="UPDATING", message="")
        return SimpleNamespace(applications={"app": SimpleNamespace(deployments={"Decode:m": deployment})})

    async def scenario() -> None:
        watch = _watch(serve, poll_s=3600)
        watch._read_status = status
        await watch.poll()
        await watch.poll()
        assert watch.unavailable("decode") is None
        watch._read_status = lambda: SimpleNamespace(applications={"app": SimpleNamespace(deployments={
            "Decode:m": SimpleNamespace(replica_states={"STOPPING": 1, "STARTING": 1}, status="UPDATING", message="")})})
        await watch.poll()
        await watch.poll()
        assert watch.unavailable("decode") is not None
        if watch._task is not None:  # asking started the background loop
            watch._task.cancel()

    asyncio.run(scenario())


def test_the_app_vanishing_after_a_role_was_down_ends_the_wait_after_one_read() -> None:
    """Was: `confirmed_unavailable` read Serve in a loop forever once the app left the status (10,555 reads in
    3 s, every request and /health hung)."""
    serve = FakeServe(running=0)

    async def scenario() -> None:
        watch = _watch(serve, poll_s=3600)
        await watch.poll()
        await watch.poll()
        assert watch.unavailable("decode") is not None
        serve.app = False
        before = serve.calls
        state = await asyncio.wait_for(watch.confirmed_unavailable("decode"), timeout=5)
        assert state is not None  # the last known state stands
        assert serve.calls - before <= 2  # this request's read (+ at most the background loop's first)

    asyncio.run(scenario())


def test_a_read_that_hangs_is_given_up_after_its_deadline() -> None:
    serve = FakeServe(running=0)

    async def scenario() -> None:
        watch = _watch(serve, poll_s=3600, read_timeout_s=0.3)
        await watch.poll()
        await watch.poll()
        serve.block = threading.Event()
        try:
            started = time.monotonic()
            state = await asyncio.wait_for(watch.confirmed_unavailable("decode"), timeout=10)
            waited = time.monotonic() - started
        finally:
            serve.block.set()
        assert state is not None and state.confirmed
        assert waited < 10  # bounded by read_timeout_s (0.3 s), not by the hung read (30 s)

    asyncio.run(scenario())


def test_reads_every_poll_s_while_requests_ask_and_every_idle_poll_s_after() -> None:
    now = [1000.0]
    watch = _watch(FakeServe(1), poll_s=2, idle_poll_s=30, active_s=60, clock=lambda: now[0])
    assert watch.interval() == 30  # nobody asked yet
    watch.state("decode")  # a request asks (no event loop here: nothing starts)
    assert watch.interval() == 2
    now[0] += 59
    assert watch.interval() == 2
    now[0] += 2
    assert watch.interval() == 30
    # A role that stays down does not keep an idle replica reading fast.
    assert _watch(FakeServe(0), poll_s=2, clock=lambda: now[0]).interval() >= 30


def test_an_idle_watch_stops_reading_and_a_request_wakes_it_at_once() -> None:
    serve = FakeServe(running=1)

    async def scenario() -> None:
        watch = _watch(serve, poll_s=0.05, idle_poll_s=3600, active_s=0.3)
        watch.state("decode")  # starts the loop, active
        await asyncio.sleep(0.6)
        active_reads = serve.calls
        assert active_reads >= 3  # read every 0.05 s while active (loose: a loaded machine is slower)
        await asyncio.sleep(0.5)  # idle since 0.3 s: at most the read already under way
        idle_start = serve.calls
        await asyncio.sleep(1.0)
        assert serve.calls == idle_start, "an idle watch kept reading Serve"
        watch.state("decode")  # the first request after the idle spell
        deadline = time.monotonic() + 5
        while serve.calls == idle_start and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert serve.calls > idle_start, "a request after an idle spell did not wake a read"
        watch._task.cancel()

    asyncio.run(scenario())


def _details(replicas: list[str] | None, *, status: str = "HEALTHY", message: str = "ok") -> dict[str, Any]:
    """The input of Ray's ServeInstanceDetails for one app with one deployment (see `_controller_dict`)."""
    deployment: dict[str, Any] = {
        "name": "Decode:m", "status": status, "status_trigger": "CONFIG_UPDATE_COMPLETED", "message": message,
        "deployment_config": {"name": "Decode:m"}, "target_num_replicas": 2, "required_resources": {},
    }
    if replicas is not None:
        deployment["replicas"] = [
            {"node_id": "n", "node_ip": "10.0.0.1", "actor_id": f"a{i}", "actor_name": f"r{i}", "worker_id": "w",
             "log_file_path": "/l", "replica_id": f"r{i}", "state": state, "pid": i, "start_time_s": 1.0}
            for i, state in enumerate(replicas)]
    app = {"name": "app", "route_prefix": "/", "docs_path": None, "status": "RUNNING", "message": "",
           "last_deployed_time_s": 1.0, "source": "declarative", "external_scaler_enabled": False,
           "deployments": {"Decode:m": deployment}}
    return {"proxies": {}, "applications": {"app": app}}


def _controller_dict(details: dict[str, Any]) -> dict[str, Any]:
    """What the controller's get_serve_instance_details returns for `details`: Ray's own conversion (its str enums
    stay enums: a first version of status_from_details read ReplicaState.RUNNING as "ReplicaState.RUNNING")."""
    from ray.serve.schema import ServeInstanceDetails

    return ServeInstanceDetails(**details)._get_user_facing_json_serializable_dict(exclude_unset=True)


def test_status_from_details_counts_replicas_as_serve_status_does() -> None:
    """The watch reads the controller's dict itself (serve.status() rebuilds Ray's pydantic models from it and
    cloudpickles each router class on the way); what it reads must equal what serve.status() would say."""
    from ray.serve.schema import ServeInstanceDetails

    from serve_app.roles import status_from_details

    for replicas, status in ((["RUNNING", "PENDING_MIGRATION", "STARTING"], "HEALTHY"), (["STOPPING"], "UNHEALTHY"),
                             ([], "UPDATING")):
        details = _details(replicas, status=status, message=f"{status} now")
        ours = status_from_details(_controller_dict(details)).applications["app"].deployments["Decode:m"]
        ray_s = ServeInstanceDetails(**details)._get_status().applications["app"].deployments["Decode:m"]
        assert ours.replica_states == ray_s.replica_states
        assert ours.status == ray_s.status.value and ours.message == ray_s.message


def test_status_from_details_reads_missing_parts_as_empty_and_drives_the_watch() -> None:
    from serve_app.roles import status_from_details

    assert status_from_details({}).applications == {}
    assert status_from_details({"applications": {"app": {}}}).applications["app"].deployments == {}
    no_replicas = status_from_details(_details(None)).applications["app"].deployments["Decode:m"]  # Ray requires it
    assert no_replicas.replica_states == {} and no_replicas.status == "HEALTHY"

    replicas = {"states": ["STARTING"]}
    watch = RoleWatch({"decode": "Decode:m"}, app_name="app", poll_s=3600,
                      read_status=lambda: status_from_details(
                          _controller_dict(_details(replicas["states"], status="UPDATING"))))
    watch._publish = lambda *_: None  # type: ignore[method-assign]

    async def scenario() -> None:
        await watch.poll()
        await watch.poll()
        down = watch.unavailable("decode")
        assert down is not None and "Decode:m" in down.describe()
        replicas["states"] = ["PENDING_MIGRATION"]
        await watch.poll()
        assert watch.unavailable("decode") is None
        assert watch._task is not None  # asking started the background loop; a cancel ends it
        watch._task.cancel()
        await asyncio.wait({watch._task}, timeout=5)
        assert watch._task.cancelled()

    asyncio.run(scenario())
