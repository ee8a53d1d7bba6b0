"""How a streamed engine response is cut into Serve messages on the serving replica.

Batching (`StreamBatcher`): Ray Serve LLM's `Batcher` drains its queue on a fixed tick
(`stream_batching_interval_ms`, default 50 ms) that starts with the stream, so the first token waits for
the next tick: up to a whole interval on top of the engine's time to first token (ray-project/ray#59681).
Sending every chunk as its own Serve message is worse: each crosses replica -> ingress -> proxy in
Python. `StreamBatcher` keeps the interval as a rate limit instead of a clock: a chunk that arrives
after a quiet interval leaves at once (so the first one always does); chunks arriving sooner wait until
one interval after the previous send and leave together. At most one message per interval, as before.
"""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator, AsyncIterator, Iterable, Optional, TypeVar


from serve_app.upstream import Batcher
from serve_app.telemetry.hops import HopClock

T = TypeVar("T")


async def stamp_first(chunks: AsyncIterator[T], clock: Optional[HopClock], *, called: str,
                      first: str) -> AsyncGenerator[T, None]:
    """Pass `chunks` through, stamping `called` when first asked for output and `first` at the first item."""
    if clock is not None:
        clock.stamp(called)
    async for chunk in chunks:
        if clock is not None:
            clock.stamp(first)
        yield chunk


class StreamBatcher(Batcher):
    """Ray's Batcher with the interval as a rate limit: a chunk after a quiet interval leaves at once.

    `interval_ms` 0 (a message per chunk) and None (one batch at the end) keep Ray's behaviour.
    """

    def __init__(self, generator: AsyncGenerator[T, None], interval_ms: Optional[float]):
        self._arrived = asyncio.Event()
        super().__init__(generator, interval_ms=interval_ms)

    async def read(self) -> None:
        try:
            async for item in self.generator:
                self.queue.put_nowait(item)
                self._arrived.set()
        finally:
            self.done_event.set()
            self._arrived.set()

    async def stream(self) -> AsyncGenerator[Iterable[T], None]:
        if not self.interval_s:
            async for batch in super().stream():
                yield batch
            return
        loop = asyncio.get_running_loop()
        last_sent = float("-inf")
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                hold = last_sent + self.interval_s - loop.time()
                if hold > 0 and not self.done_event.is_set():
                    # Sent less than an interval ago: gather what comes until then, or until the end.
                    try:
                        await asyncio.wait_for(self.done_event.wait(), timeout=hold)
                    except asyncio.TimeoutError:
                        pass
                results, is_done = self.check_done_and_drain()
                if results:
                    yield self._merge_results(results)
                    last_sent = loop.time()
                if is_done:
                    self.read_task.result()  # re-raise the engine's exception, if any
                    return
        finally:
            if not self.read_task.done():
                self.read_task.cancel()
