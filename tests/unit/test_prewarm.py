"""serve_app.engine.servers.bounded_prewarm: decode's NIXL pre-warm is bounded. While it runs decode prefills every
request itself, so one that never ends must not keep disaggregation off: it is reported at WARNING while it runs,
cancelled at its deadline, and a failure or the deadline lets requests go to prefill again. Real asyncio with small
times; tests/e2e runs the real pre-warm between pods."""

from __future__ import annotations

import asyncio
import logging

import pytest

from serve_app.engine import servers
from serve_app.engine.servers import bounded_prewarm, prewarm_until_done
from serve_app.roles import RoleState


@pytest.fixture
def warnings(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(servers.logger, "warning", lambda msg, *a: lines.append(msg % a))
    monkeypatch.setattr(servers.logger, "info", lambda msg, *a: lines.append("INFO " + msg % a))
    return lines


def run(coro):
    return asyncio.run(coro)


def test_a_prewarm_that_finishes_is_waited_for_and_reported(warnings) -> None:
    async def prewarm():
        await asyncio.sleep(0.05)

    assert run(bounded_prewarm(prewarm(), timeout_s=5, note_every_s=1)) is True
    assert len(warnings) == 1 and warnings[0].startswith("INFO NIXL pre-warm done in"), warnings


def test_a_prewarm_that_never_ends_is_cancelled_at_its_deadline(warnings) -> None:
    state = {"cancelled": False}

    async def prewarm():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            state["cancelled"] = True  # vLLM aborts the pre-warm's decode request here
            raise

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        finished = await bounded_prewarm(prewarm(), timeout_s=0.3, note_every_s=0.1)
        return finished, loop.time() - t0

    finished, took = run(main())
    assert finished is False and state["cancelled"]
    assert 0.3 <= took < 1.0, took
    still = [w for w in warnings if "still running" in w]
    assert len(still) >= 2, warnings  # said while it runs, not only at the end
    assert "kv_handshake_pending" in still[0]
    assert "not done after" in warnings[-1] and "kv_transfer.prewarm_timeout_s" in warnings[-1], warnings


def test_a_failed_prewarm_ends_the_wait_with_a_warning(warnings) -> None:
    async def prewarm():
        raise RuntimeError("Pre-warm failed after 60 attempts (300s). PrefillServer may be permanently unavailable.")

    assert run(bounded_prewarm(prewarm(), timeout_s=5, note_every_s=1)) is False
    assert len(warnings) == 1 and "failed after" in warnings[0] and "RuntimeError" in warnings[0], warnings


def test_a_replica_shutting_down_cancels_the_prewarm_too() -> None:
    state = {"cancelled": False}

    async def prewarm():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    async def main():
        outer = asyncio.ensure_future(bounded_prewarm(prewarm(), timeout_s=60, note_every_s=30))
        await asyncio.sleep(0.05)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer

    logging.getLogger(servers.__name__).disabled = True
    try:
        run(main())
    finally:
        logging.getLogger(servers.__name__).disabled = False
    assert state["cancelled"]


def test_the_deadline_is_a_validated_value() -> None:
    from pydantic import ValidationError

    from serve_app.config import KVTransferSpec

    assert KVTransferSpec().prewarm_timeout_s == 120
    for bad in (0, -1, 7200):
        with pytest.raises(ValidationError, match="prewarm_timeout_s"):
            KVTransferSpec(prewarm_timeout_s=bad)


def test_the_notes_name_the_step_the_prewarm_waits_in(warnings) -> None:
    """Waiting for prefill's pre-warm prefill vs pulling its KV over NIXL: the first points at prefill, the second
    at the network between the pods. Read from the coroutine's locals, named as Ray's pre-warm names them."""

    async def broadcasting():
        attempt = 2  # read from the frame, as in Ray's pre-warm
        assert "attempt" in locals()
        await asyncio.sleep(3600)

    async def pulling():
        decode_reqs = ["p0", "p1"]
        assert "decode_reqs" in locals()
        await asyncio.sleep(3600)

    for coro, step in ((broadcasting(), "waiting for the prefill replicas to prefill the pre-warm request (Ray's try 2)"),
                       (pulling(), "pulling the pre-warm's KV from 2 prefill replica(s)")):
        warnings.clear()
        assert run(bounded_prewarm(coro, timeout_s=0.15, note_every_s=0.1)) is False
        assert step in warnings[0] and step in warnings[-1], warnings


def test_rays_prewarm_still_has_the_locals_the_step_is_read_from() -> None:
    from serve_app.upstream import PDDecodeServer

    names = PDDecodeServer._maybe_prewarm.__code__.co_varnames
    assert {"attempt", "decode_reqs"} <= set(names), names


class Roles:
    """The decode replica's role watch as prewarm_until_done reads it: prefill's state per read, from a script."""

    def __init__(self, running: list) -> None:
        self.running = list(running)  # None: not read yet; n: serving prefill replicas
        self.reads = 0

    def state(self, role: str):
        assert role == "prefill"
        self.reads += 1
        n = self.running.pop(0) if len(self.running) > 1 else self.running[0]
        return None if n is None else RoleState("Prefill:tiny", n, "DEPLOYING" if n == 0 else "RUNNING", "", 0.0)


class Failover:
    def __init__(self, roles: Roles) -> None:
        self.roles = roles


def test_a_prewarm_starts_once_prefill_serves_and_a_stuck_attempt_is_tried_again(warnings) -> None:
    """The hang seen on the real node: a first attempt that never ends. It is cancelled at its deadline and a
    second attempt (once prefill serves) finishes: disaggregation on, no operator needed."""
    roles = Roles([None, None, 0, 0, 1])
    starts: list[int] = []

    def start():
        starts.append(roles.reads)

        async def prewarm():
            await asyncio.sleep(3600 if len(starts) == 1 else 0.01)
        return prewarm()

    done = run(prewarm_until_done(start, lambda: Failover(roles), timeout_s=0.2, note_every_s=0.1, poll_s=0.01))
    assert done is True
    assert starts[0] >= 5, starts  # not before the read that found a serving prefill replica
    assert len(starts) == 2, starts
    stuck = [w for w in warnings if "not done after" in w]
    assert len(stuck) == 1 and "attempt 1 of 3" in stuck[0] and "trying again" in stuck[0], warnings
    assert warnings[-1].startswith("INFO NIXL pre-warm done") and "attempt 2 of 3" in warnings[-1], warnings


def test_after_the_last_attempt_requests_go_to_prefill_anyway(warnings) -> None:
    calls = []

    def start():
        calls.append(1)

        async def prewarm():
            raise RuntimeError("broadcast() found no replica")
        return prewarm()

    assert run(prewarm_until_done(start, lambda: Failover(Roles([2])), timeout_s=1, attempts=3, poll_s=0.01)) is False
    assert len(calls) == 3
    assert "attempt 3 of 3" in warnings[-1] and "requests go to prefill again" in warnings[-1], warnings
    assert all("trying again" in w for w in warnings[:-1]), warnings


def test_waiting_for_prefill_is_said_and_starts_nothing(warnings) -> None:
    """No replica yet (`_failover` not set), then a prefill role that stays down: no pre-warm starts, and the wait
    is said at WARNING with Serve's reason."""
    calls = []
    seen = iter([None] * 3)

    def failover():
        return next(seen, Failover(Roles([0])))

    async def main():
        task = asyncio.ensure_future(prewarm_until_done(lambda: calls.append(1), failover, timeout_s=1,
                                                        note_every_s=0.05, poll_s=0.01))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert calls == []
    assert any("waits for a serving prefill replica" in w and "has no running replica" in w for w in warnings), warnings


def test_a_watch_that_cannot_read_prefill_does_not_keep_the_prewarm_from_starting(warnings) -> None:
    calls = []

    def start():
        calls.append(1)

        async def prewarm():
            pass
        return prewarm()

    assert run(prewarm_until_done(start, lambda: Failover(Roles([None])), timeout_s=0.1, poll_s=0.01)) is True
    assert calls == [1]
    assert any("starts without a read of prefill's state" in w for w in warnings), warnings
