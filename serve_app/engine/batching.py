"""How a streamed engine response is cut into Serve messages on the serving replica.

Batching (`StreamBatcher`): Ray Serve LLM's `Batcher` drains its queue on a fixed tick
(`stream_batching_interval_ms`, default 50 ms) that starts with the stream, so the first token waits for
the next tick: up to a whole interval on top of the engine's time to first token (ray-project/ray#59681).
Sending every chunk as its own Serve message is worse: each crosses replica -> ingress -> proxy in
Python. `StreamBatcher` keeps the interval as a rate limit instead of a clock: a chunk that arrives
after a quiet interval leaves at once (so the first one always does); chunks arriving sooner wait until
one interval after the previous send and leave together. At most one message per interval, as before.

Under load (`StreamLoad`): every message costs the serving replica, the frontend and the HTTP path the same
Python work whatever it carries, and with hundreds of streams a fixed 50 ms interval means tens of
thousands of messages a second through single-threaded event loops. So the interval grows with the
number of streams open in the replica, keeping all of them together within a message budget
(`streaming.max_messages_per_s`), never above `streaming.max_batch_interval_ms`; with few streams it stays
the base interval. The first chunk of every stream still leaves at once, and the end of a stream is sent as
soon as the engine ends it, so time to first token and time per output token (first to last token) are
unchanged: only how tokens are grouped between them is.

Encode once: the chunks of one message travel as one string (SSE events concatenated), not a list of
per-token strings, so Serve pickles one object per message and the frontend joins nothing. An engine error
event (`data: {"error"...`) stays an item of its own, so the frontend still recognises it.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, AsyncIterator, Iterable, List, Optional, TypeVar


from serve_app.upstream import Batcher
from serve_app.telemetry.hops import HopClock

T = TypeVar("T")
ERROR_EVENT_PREFIX = 'data: {"error"'


async def stamp_first(chunks: AsyncIterator[T], clock: Optional[HopClock], *, called: str,
                      first: str) -> AsyncGenerator[T, None]:
    """Pass `chunks` through, stamping `called` when first asked for output and `first` at the first item."""
    if clock is not None:
        clock.stamp(called)
    async for chunk in chunks:
        if clock is not None:
            clock.stamp(first)
            clock = None
        yield chunk


def batch_interval_s(active_streams: int, base_s: float, max_s: float, max_messages_per_s: float) -> float:
    """The interval that keeps `active_streams` streams within `max_messages_per_s` messages a second in all:
    never below `base_s`, never above `max_s` (when `max_s` < `base_s`, `base_s`); budget 0: always `base_s`."""
    if max_messages_per_s <= 0 or active_streams <= 0:
        return base_s
    return max(base_s, min(max_s, active_streams / max_messages_per_s))


class StreamLoad:
    """The streams open in one serving replica and the batch interval they get (see the module doc)."""

    def __init__(self, base_ms: float, max_ms: float, max_messages_per_s: float) -> None:
        self.base_s, self.max_s, self.budget = base_ms / 1000, max_ms / 1000, max_messages_per_s
        self.active = 0

    def interval_s(self) -> float:
        return batch_interval_s(self.active, self.base_s, self.max_s, self.budget)


def merge_chunks(items: List[Any]) -> List[Any]:
    """Consecutive SSE strings joined into one; anything else (an ErrorResponse, an engine error event)
    stays an item of its own, in order."""
    merged: List[Any] = []
    run: List[str] = []
    for item in items:
        if isinstance(item, str) and not item.startswith(ERROR_EVENT_PREFIX):
            run.append(item)
            continue
        if run:
            merged.append("".join(run))
            run = []
        merged.append(item)
    if run:
        merged.append(run[0] if len(run) == 1 else "".join(run))
    return merged


class StreamBatcher(Batcher):
    """Ray's Batcher with the interval as a rate limit: a chunk after a quiet interval leaves at once.

    `interval_ms` 0 (a message per chunk) and None (one batch at the end) keep Ray's behaviour. With `load`,
    the interval is `load.interval_s()` (the base interval grown with the replica's open streams), and this
    stream counts as open while it is iterated. `clock` gets `first_stamp` at the engine's first chunk.
    """

    def __init__(self, generator: AsyncGenerator[T, None], interval_ms: Optional[float], *,
                 load: Optional[StreamLoad] = None, clock: Optional[HopClock] = None,
                 called_stamp: str = "engine_called", first_stamp: str = "engine_first_chunk"):
        self._arrived = asyncio.Event()
        self._buffer: List[Any] = []
        self._load = load
        self._clock, self._called_stamp, self._first_stamp = clock, called_stamp, first_stamp
        self._wake: Optional[asyncio.Future] = None  # set while the stream waits out an interval
        if not interval_ms and clock is not None:  # Ray's paths below read the generator themselves
            generator = stamp_first(generator, clock, called=called_stamp, first=first_stamp)
        super().__init__(generator, interval_ms=interval_ms)

    def _merge_results(self, results: List[T]) -> Iterable[T]:
        return merge_chunks(results)

    async def read(self) -> None:
        clock = self._clock
        if clock is not None:
            clock.stamp(self._called_stamp)
        try:
            async for item in self.generator:
                if clock is not None:
                    clock.stamp(self._first_stamp)
                    clock = None
                self._buffer.append(item)
                self._arrived.set()
        finally:
            self.done_event.set()
            self._arrived.set()
            if self._wake is not None and not self._wake.done():
                self._wake.set_result(None)

    def check_done_and_drain(self):
        done = self.read_task.done()
        items, self._buffer = self._buffer, []
        return items, done

    async def _hold(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        """Sleep `seconds`, or less if the engine's stream ends meanwhile (no exception on the usual path)."""
        wake = loop.create_future()
        self._wake = wake
        timer = loop.call_later(seconds, _resolve, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    async def stream(self) -> AsyncGenerator[Iterable[T], None]:
        if not self.interval_s:
            async for batch in super().stream():
                yield batch
            return
        loop = asyncio.get_running_loop()
        load = self._load
        if load is not None:
            load.active += 1
        last_sent = float("-inf")
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                interval = load.interval_s() if load is not None else self.interval_s
                hold = last_sent + interval - loop.time()
                if hold > 0 and not self.done_event.is_set():
                    # Sent less than an interval ago: gather what comes until then, or until the end.
                    await self._hold(loop, hold)
                results, is_done = self.check_done_and_drain()
                if results:
                    yield self._merge_results(results)
                    last_sent = loop.time()
                if is_done:
                    self.read_task.result()  # re-raise the engine's exception, if any
                    return
        finally:
            if load is not None:
                load.active -= 1
            if not self.read_task.done():
                self.read_task.cancel()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
