"""The stream batcher's decisions (serve_app/engine/batching.py): the interval under load, one string per
message, and the adaptive StreamBatcher end to end on a fake engine (plain asyncio, no Ray cluster)."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncGenerator

import pytest

from serve_app.config import AppConfig
from serve_app.upstream import ErrorInfo, ErrorResponse
from serve_app.engine.batching import StreamBatcher, StreamLoad, batch_interval_s, merge_chunks
from serve_app.llm_configs import STREAM_MAX_INTERVAL_MS, STREAM_MAX_MESSAGES_PER_S, experimental_configs
from serve_app.telemetry.hops import HopClock


@pytest.mark.parametrize(
    ("streams", "expected_ms"),
    [(0, 50), (1, 50), (100, 50), (200, 50), (400, 100), (800, 200), (5000, 200)],
)
def test_the_interval_keeps_all_streams_within_the_message_budget(streams: int, expected_ms: float) -> None:
    # 4000 messages/s in all: 200 streams at the 50 ms base interval; beyond that the interval grows to 200 ms.
    assert batch_interval_s(streams, 0.05, 0.2, 4000) == pytest.approx(expected_ms / 1000)


def test_no_budget_or_a_cap_below_the_base_keeps_the_base_interval() -> None:
    assert batch_interval_s(10_000, 0.05, 0.2, 0) == 0.05
    assert batch_interval_s(10_000, 0.05, 0.02, 4000) == 0.05


def test_stream_load_counts_open_streams() -> None:
    load = StreamLoad(50, 200, 4000)
    assert load.interval_s() == 0.05
    load.active = 600
    assert load.interval_s() == pytest.approx(0.15)


def test_a_message_is_one_string_but_errors_stay_items_of_their_own() -> None:
    error = ErrorResponse(error=ErrorInfo(message="boom", type="x", code=500))
    assert merge_chunks([]) == []
    assert merge_chunks(["data: 1\n\n"]) == ["data: 1\n\n"]
    assert merge_chunks(["data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"]) == ["data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"]
    engine_error = 'data: {"error": {"message": "dead"}}\n\n'
    assert merge_chunks(["a", "b", engine_error, "c", error, "d", "e"]) == ["ab", engine_error, "c", error, "de"]


def test_app_config_reaches_the_replicas_experimental_configs() -> None:
    app = AppConfig.model_validate({"model": {"id": "m", "source": "/m"}, "prefill": {}, "decode": {},
                                    "streaming": {"max_messages_per_s": 1500, "max_batch_interval_ms": 120}})
    configs = experimental_configs(app, "decode", app.decode)
    assert configs[STREAM_MAX_MESSAGES_PER_S] == 1500 and configs[STREAM_MAX_INTERVAL_MS] == 120
    defaults = AppConfig.model_validate({"model": {"id": "m", "source": "/m"}, "prefill": {}, "decode": {}}).streaming
    assert defaults.max_messages_per_s > 0 and defaults.max_batch_interval_ms >= defaults.batch_interval_ms


async def _engine(n: int, every_s: float) -> AsyncGenerator[str, None]:
    for i in range(n):
        await asyncio.sleep(every_s)
        yield f"data: {i}\n\n"


def _run(load: StreamLoad | None, n: int = 40, every_s: float = 0.005, clock: HopClock | None = None):
    async def collect():
        t0 = time.monotonic()
        batcher = StreamBatcher(_engine(n, every_s), interval_ms=50, load=load, clock=clock)
        return [(time.monotonic() - t0, list(b)) async for b in batcher.stream()]

    return asyncio.run(collect())


def test_under_load_messages_are_fewer_but_the_first_chunk_and_the_end_are_not_held() -> None:
    n = 40  # a chunk every 5 ms: 0.2 s of stream
    quiet = _run(StreamLoad(50, 200, 4000))
    load = StreamLoad(50, 200, 4000)
    load.active = 799  # this stream makes 800: interval 200 ms
    busy = _run(load)
    for batches in (quiet, busy):
        text = "".join(s for _, batch in batches for s in batch)
        assert text == "".join(f"data: {i}\n\n" for i in range(n)), "chunks lost or reordered"
        assert batches[0][1] == ["data: 0\n\n"] and batches[0][0] < 0.04, batches[0]  # the first leaves at once
        assert all(len(batch) == 1 for _, batch in batches)  # one string per message
    assert len(busy) < len(quiet), (len(busy), len(quiet))
    gaps = [b[0] - a[0] for a, b in zip(busy, busy[1:-1])]
    assert all(gap >= 0.19 for gap in gaps), gaps  # 200 ms apart (the last batch may leave sooner)
    quiet_gaps = [b[0] - a[0] for a, b in zip(quiet, quiet[1:-1])]
    assert all(gap >= 0.045 for gap in quiet_gaps) and min(quiet_gaps) < 0.15, quiet_gaps  # 50 ms apart
    assert load.active == 799  # the stream no longer counts once it ended


def test_the_clock_gets_the_engines_first_chunk() -> None:
    clock = HopClock()
    _run(None, n=3, clock=clock)
    assert 0.0 < clock.stamps["engine_first_chunk"] - clock.stamps["engine_called"] < 0.1


@pytest.mark.parametrize("interval_ms", [0, None])
def test_rays_paths_still_stamp_the_clock(interval_ms) -> None:
    clock = HopClock()

    async def collect():
        return [list(b) async for b in StreamBatcher(_engine(3, 0.001), interval_ms=interval_ms, clock=clock).stream()]

    batches = asyncio.run(collect())
    assert "".join(s for b in batches for s in b) == "".join(f"data: {i}\n\n" for i in range(3))
    assert "engine_first_chunk" in clock.stamps and "engine_called" in clock.stamps


def test_the_serving_process_settles_like_vllms_own_after_start_up() -> None:
    import gc

    from serve_app.upstream import vllm_envs as envs

    from serve_app.engine.servers import settle_serving_process

    try:
        settle_serving_process()
        assert envs._is_envs_cache_enabled()
        assert gc.get_freeze_count() > 0
    finally:
        envs.disable_envs_cache()
        gc.unfreeze()
