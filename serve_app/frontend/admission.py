"""Admission control: a bounded queue per ingress replica, 429 + Retry-After beyond it.

Why: without it every request that reaches an ingress is forwarded, and the queueing happens inside
vLLM (engines accept up to 1e9 requests) or in Serve's proxy (unbounded): under overload clients wait
minutes and time out anyway. Here at most `max_in_flight` requests run per ingress replica, up to
`max_queued` wait for a slot (FIFO, at most `max_queue_wait_s`), and the rest are answered at once
with 429 and Retry-After, which clients and load balancers understand.

Slots count engine sequences, not requests: a request holds `weight` slots, its prompts x n (one batched
completions request may carry 64 prompts x n=8 = 512 sequences), at most `max_in_flight` (so a heavy request
still runs alone rather than never). Waiters are served strictly in order: a heavy one at the head waits
until enough slots are free, and lighter ones behind it do not overtake it (no starvation).

A slot is held until the response is fully sent (streams included) or the client goes away;
`ReleasingResponse` ties the release to the ASGI response, so no path can leak a slot.
The overflow decision ("is the cluster saturated?") reads `queued` from here.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Callable, Optional

from starlette.responses import Response

from serve_app.frontend.errors import OpenAIError


class Overloaded(OpenAIError):
    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(429, message, code="overloaded", retry_after_s=retry_after_s)


class _Gauges:
    """ray.util.metrics objects are created in the replica, lazily."""

    def __init__(self) -> None:
        self._made = False

    def _make(self) -> None:
        from ray.util.metrics import Counter, Gauge

        self.in_flight = Gauge(
            "rld_admission_in_flight", description="Sequences (prompts x n) running on this ingress replica."
        )
        self.queued = Gauge("rld_admission_queued", description="Requests waiting for an admission slot.")
        self.rejected = Counter(
            "rld_admission_rejections",
            description="Requests answered 429 by admission control: queue full, or waited too long.",
            tag_keys=("reason",),
        )
        self._made = True

    def update(self, in_flight: int, queued: int) -> None:
        if not self._made:
            self._make()
        self.in_flight.set(in_flight)
        self.queued.set(queued)

    def reject(self, reason: str) -> None:
        if not self._made:
            self._make()
        self.rejected.inc(1, tags={"reason": reason})


class Admission:
    """Slots and a FIFO queue of one ingress replica (one event loop: no locks needed). Slots are sequences."""

    def __init__(
        self,
        max_in_flight: int,
        max_queued: int,
        *,
        max_queue_wait_s: float,
        retry_after_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.max_queue_wait_s = max_queue_wait_s
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self._waiters: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()
        self._gauges = _Gauges()
        self._clock = clock

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def weigh(self, weight: int) -> int:
        """The slots a request of `weight` sequences holds: at least 1, at most all of them."""
        return max(1, min(int(weight), self.max_in_flight))

    def has_free_slot(self, weight: int = 1) -> bool:
        return self.in_flight + self.weigh(weight) <= self.max_in_flight and not self._waiters

    def would_queue(self, weight: int = 1) -> bool:
        """True when a request of `weight` sequences arriving now would have to wait (saturated)."""
        return not self.has_free_slot(weight)

    async def acquire(self, weight: int = 1) -> Callable[[], None]:
        """Wait for `weight` slots (a request's sequences); returns their (idempotent) release. Raises
        Overloaded (429) when the queue is full or the wait exceeds max_queue_wait_s."""
        weight = self.weigh(weight)
        if self.has_free_slot(weight):
            self.in_flight += weight
            self._publish()
            return self._releaser(weight)
        if len(self._waiters) >= self.max_queued:
            self._gauges.reject("queue_full")
            raise Overloaded(
                f"This endpoint is at capacity ({self.in_flight} sequences running, {len(self._waiters)} requests "
                f"queued). Retry after {self.retry_after_s} s.",
                retry_after_s=self.retry_after_s,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (waiter, weight)
        self._waiters.append(entry)
        self._publish()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=self.max_queue_wait_s)
        except asyncio.TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return self._releaser(weight)  # granted at the last moment
            self._remove(entry)
            self._gauges.reject("queue_timeout")
            raise Overloaded(
                f"This endpoint is at capacity: the request waited {self.max_queue_wait_s:.0f} s for a slot. "
                f"Retry after {self.retry_after_s} s.",
                retry_after_s=self.retry_after_s,
            ) from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(weight)  # granted, but the caller went away
            else:
                self._remove(entry)
            raise
        return self._releaser(weight)

    def _remove(self, entry: tuple[asyncio.Future[None], int]) -> None:
        try:
            self._waiters.remove(entry)
        except ValueError:
            pass
        if not entry[0].done():
            entry[0].cancel()
        self._grant()  # the head may have changed: a lighter waiter behind a removed heavy one may fit now

    def _releaser(self, weight: int) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release(weight)

        return release

    def _release(self, weight: int) -> None:
        self.in_flight -= weight
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters in order, as long as the one at the head fits."""
        while self._waiters:
            waiter, weight = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.in_flight + weight > self.max_in_flight:
                break
            self._waiters.popleft()
            self.in_flight += weight
            waiter.set_result(None)
        self._publish()

    def _publish(self) -> None:
        self._gauges.update(self.in_flight, len(self._waiters))


class ReleasingResponse(Response):
    """Wraps any Starlette response; runs `release` once the response is sent, failed or abandoned."""

    def __init__(self, inner: Response, release: Callable[[], None], extra_headers: Optional[dict[str, str]] = None):
        self._inner = inner
        self._release = release
        for name, value in (extra_headers or {}).items():
            inner.headers[name] = value
        self.status_code = inner.status_code
        self.background = None

    @property
    def headers(self) -> Any:  # type: ignore[override]
        return self._inner.headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            self._release()
