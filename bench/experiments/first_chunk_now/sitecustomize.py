"""Experiment, not product code: Ray Serve LLM's stream Batcher with the first chunk sent at once.

Put this folder on PYTHONPATH of every Ray process (bench --app-env PYTHONPATH=<this folder>) and
Python imports it at start-up. Ray 2.58's `Batcher.stream` waits one full interval (default 50 ms)
before its first drain, so a streamed response's first token leaves the replica no earlier than
50 ms after the request reached it. Here the first drain happens as soon as anything is queued
(plus 1 ms for chunks produced in the same engine step, e.g. chat's role chunk and first token);
later drains keep the interval, so per-chunk Serve overhead stays amortized. This is what
issue #9 proposes as a `_batch_output_stream` override in serve_app/servers.py.
"""

import asyncio


def _patch() -> None:
    try:
        from ray.llm._internal.serve.utils import batcher
    except Exception:  # noqa: BLE001 - not a Ray LLM process
        return
    original = batcher.Batcher.stream

    async def stream(self):  # type: ignore[no-untyped-def]
        if not self.interval_s:  # 0 (no batching) or None (one batch): Ray's own behaviour
            async for out in original(self):
                yield out
            return
        try:
            while self.queue.empty() and not self.read_task.done():
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.001)
            results, is_done = self.check_done_and_drain()
            if results:
                yield self._merge_results(results)
            if is_done:
                self.read_task.result()
                return
        except BaseException:
            if not self.read_task.done():
                self.read_task.cancel()
            raise
        async for out in original(self):
            yield out

    batcher.Batcher.stream = stream
    # Proof that it loaded: lands in the Ray worker's .err log (…/session_latest/logs/worker-*.err).
    import os
    import sys
    print(f"first_chunk_now: Batcher.stream patched in pid {os.getpid()}", file=sys.stderr, flush=True)


_patch()
