"""serve_app.engine.servers.bounded_prewarm: decode's NIXL pre-warm is bounded. While it runs decode prefills every
request itself, so one that never ends must not keep disaggregation off: it is reported at WARNING while it runs,
cancelled at its deadline, and a failure or the deadline lets requests go to prefill again. Real asyncio with small
times; tests/e2e runs the real pre-warm between pods."""

from __future__ import annotations

import asyncio
import logging

import pytest

from serve_app.engine import servers
from serve_app.engine.servers import bounded_prewarm


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
    assert len(warnings) == 1 and "did not complete" in warnings[0] and "RuntimeError" in warnings[0], warnings


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

    assert KVTransferSpec().prewarm_timeout_s == 300
    for bad in (0, -1, 7200):
        with pytest.raises(ValidationError, match="prewarm_timeout_s"):
            KVTransferSpec(prewarm_timeout_s=bad)
