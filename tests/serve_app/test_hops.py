"""The per-request hop clock and the stream batcher (serve_app/telemetry/hops.py), without a cluster."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncGenerator

import pytest

from serve_app.upstream import Batcher
from serve_app.telemetry import hops
from serve_app.engine.batching import StreamBatcher, stamp_first
from serve_app.telemetry.hops import HopClock, ReplicaStamps


async def _engine(delays_s: list[float], fail_at: int | None = None) -> AsyncGenerator[int, None]:
    """Yields i after sleeping delays_s[i]: a stand-in for vLLM's stream of chunks."""
    for i, delay in enumerate(delays_s):
        await asyncio.sleep(delay)
        if i == fail_at:
            raise RuntimeError("engine failed")
        yield i


def _batches(batcher: type, delays_s: list[float], interval_ms: float | None) -> list[tuple[float, list[int]]]:
    """(seconds since the stream started, batch) for each batch the batcher yields."""

    async def collect() -> list[tuple[float, list[int]]]:
        t0 = time.monotonic()
        stream = batcher(_engine(delays_s), interval_ms=interval_ms).stream()  # needs a running loop
        return [(time.monotonic() - t0, list(batch)) async for batch in stream]

    return asyncio.run(collect())


def test_the_first_chunk_leaves_at_once_while_ray_holds_it_for_the_tick() -> None:
    delays = [0.005, 0.2]  # first chunk after 5 ms, then a quiet gap
    ours = _batches(StreamBatcher, delays, 100)
    rays = _batches(Batcher, delays, 100)
    assert ours[0][1] == [0] and ours[0][0] < 0.05, ours
    assert rays[0][1] == [0] and rays[0][0] >= 0.095, rays  # Ray: the first drain waits a full interval
    # After a quiet interval the next chunk leaves at once too (0.205 s, not the next 100 ms tick).
    assert ours[1][1] == [1] and ours[1][0] < 0.25, ours


def test_fast_chunks_are_batched_at_most_one_message_per_interval() -> None:
    delays = [0.0] + [0.004] * 60  # 61 chunks over ~0.25 s
    batches = _batches(StreamBatcher, delays, 50)
    assert [c for _, batch in batches for c in batch] == list(range(61)), "chunks lost or reordered"
    assert batches[0][1] == [0]
    assert len(batches) <= 2 + 0.3 / 0.05, f"{len(batches)} messages for 61 chunks in ~0.25 s"
    gaps = [b[0] - a[0] for a, b in zip(batches, batches[1:-1])]
    assert all(gap >= 0.045 for gap in gaps), gaps  # the rate limit holds (the last batch may flush early)


def test_the_end_of_the_stream_is_sent_without_waiting_for_the_interval() -> None:
    batches = _batches(StreamBatcher, [0.0, 0.001, 0.001], 500)
    assert [c for _, b in batches for c in b] == [0, 1, 2]
    assert batches[-1][0] < 0.1, batches


def test_an_engine_error_reaches_the_consumer() -> None:
    async def consume() -> list[list[int]]:
        return [list(b) async for b in StreamBatcher(_engine([0.0, 0.01, 0.01], fail_at=2), interval_ms=50).stream()]

    with pytest.raises(RuntimeError, match="engine failed"):
        asyncio.run(consume())


@pytest.mark.parametrize(("interval_ms", "expected"), [(0, [[0], [1], [2]]), (None, [[0, 1, 2]])])
def test_interval_zero_and_none_keep_rays_behaviour(interval_ms: float | None, expected: list[list[int]]) -> None:
    batches = _batches(StreamBatcher, [0.0, 0.01, 0.01], interval_ms)
    assert [b for _, b in batches] == expected


def test_stamp_first_records_when_the_engine_was_asked_and_answered() -> None:
    clock = HopClock()

    async def consume() -> list[int]:
        return [c async for c in stamp_first(_engine([0.02, 0.0]), clock, called="engine_called",
                                                  first="engine_first_chunk")]

    assert asyncio.run(consume()) == [0, 1]
    assert 0.015 <= clock.stamps["engine_first_chunk"] - clock.stamps["engine_called"] < 0.2


@pytest.mark.parametrize("path", ["local", "remote"])
def test_each_paths_segments_add_up_to_the_frontends_time_to_first_byte(path: str) -> None:
    names = ["ingress_received", "ingress_dispatched", "replica_received"]
    names += ["prefill_sent", "prefill_returned"] if path == "remote" else []
    names += ["engine_called", "engine_first_chunk", "replica_first_out", "ingress_first_in", "ingress_first_out"]
    clock = HopClock(path=path, stamps={name: 1000.0 + i * i * 0.001 for i, name in enumerate(names)})
    segments = clock.segments()
    total = sum(segments[s] for s in hops.PATH_SEGMENTS[path])
    assert total == pytest.approx(segments["ingress_total"])
    trace = hops.parse_trace_line("prefix " + hops.trace_line(clock, "req-1"))
    assert trace is not None and trace["request_id"] == "req-1" and trace["path"] == path
    assert trace["t_ms"]["ingress_received"] == 0 and trace["segments_ms"]["ingress_total"] == pytest.approx(
        segments["ingress_total"] * 1000, abs=0.01)


def test_the_frontend_merges_the_replicas_stamps_without_overwriting_its_own() -> None:
    clock = HopClock(stamps={"ingress_received": 1.0, "ingress_dispatched": 1.1})
    clock.merge(ReplicaStamps({"ingress_received": 5.0, "replica_received": 1.2}, "remote", "disaggregated", 601))
    assert clock.stamps == {"ingress_received": 1.0, "ingress_dispatched": 1.1, "replica_received": 1.2}
    assert (clock.path, clock.mode, clock.prompt_tokens) == ("remote", "disaggregated", 601)


def _asgi_stream(wants_trace: bool, allowed: bool = True) -> bytes:
    """The bytes a client receives from the frontend's middleware around a two-chunk SSE response whose
    serving replica's stamps arrived (as `_get_response` merges them)."""
    from serve_app.frontend.app import CLOCK_STATE_KEY, HopClockMiddleware

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        clock = scope["state"][CLOCK_STATE_KEY]
        clock.merge(ReplicaStamps({"replica_received": time.time(), "replica_first_out": time.time()},
                                  "local", "aggregated"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'data: {"choices": [{"text": "a"}]}\n\n', "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent: list[bytes] = []

    async def send(message):  # type: ignore[no-untyped-def]
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    headers = [(b"x-request-id", b"req-9")] + ([(b"x-rld-trace", b"1")] if wants_trace else [])
    asyncio.run(HopClockMiddleware(app, client_trace=allowed)({"type": "http", "headers": headers}, None, send))
    return b"".join(sent)


def test_a_client_that_asks_gets_the_record_in_the_stream_and_others_do_not() -> None:
    from loadtests.openai_load.sse import consume_sse

    plain, traced = _asgi_stream(False), _asgi_stream(True)
    assert b"rld-trace" not in plain
    assert b"rld-trace" not in _asgi_stream(True, allowed=False)  # frontend.client_trace off (the default): ignored
    result = consume_sse(iter(traced.splitlines(keepends=True)), "completions", time.perf_counter())
    assert result.done and result.text_chunks == 1  # the comment does not disturb the stream
    trace = result.server_trace
    assert trace is not None and trace["request_id"] == "req-9" and trace["path"] == "local"
    assert {"ingress_received", "replica_first_out", "ingress_first_out"} <= set(trace["t_ms"])


def test_the_remote_path_reports_its_own_segments_only() -> None:
    names = ["ingress_received", "ingress_dispatched", "replica_received", "prefill_sent", "prefill_returned",
             "engine_called", "engine_first_chunk", "replica_first_out", "ingress_first_in", "ingress_first_out"]
    clock = HopClock(path="remote", stamps={name: float(i) for i, name in enumerate(names)})
    assert set(clock.segments()) == {*hops.PATH_SEGMENTS["remote"], "ingress_total"}
    assert "replica_to_engine" not in clock.segments()  # it would span the whole remote prefill
