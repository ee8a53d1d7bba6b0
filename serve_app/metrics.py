"""Per-request timings of the serving roles, exported as Prometheus metrics through Ray.

Recorded with `ray.util.metrics`, so every replica's values reach the Ray metrics agent of its node
and show up on that node's `--metrics-export-port` (Ray prefixes each name with `ray_`). Labels:
`model`, `mode` (disaggregated | aggregated), `role` (prefill | decode: the replica that recorded it)
and `path` (remote: prefill ran on the prefill role and the KV moved; local: the serving engine
prefilled the prompt itself; fallback: remote prefill failed before the first token and decode
prefilled it itself, see serve_app/failover.py).

| metric (as exported)                         | type      | what it measures |
|----------------------------------------------|-----------|------------------|
| ray_rld_requests_total                       | counter   | chat/completions requests accepted, by path |
| ray_rld_prompt_tokens_total                  | counter   | prompt tokens by path: remote = `remote_num_tokens` prefill handed off, local = tokens decode counted |
| ray_rld_request_errors_total                 | counter   | requests whose first chunk was an error response or that raised (not client cancellations) |
| ray_rld_prefill_seconds                      | histogram | decode role, remote path: prefill request sent -> prefill response (with kv_transfer_params) back. Includes the prefill queue and the handle round trip |
| ray_rld_kv_handoff_seconds                   | histogram | decode role, remote path, streaming only: prefill response received -> decode's first output chunk. That is decode scheduling + the NIXL KV pull + one decode step; vLLM's own `vllm:nixl_xfer_time_seconds` isolates the transfer |
| ray_rld_time_to_first_token_seconds          | histogram | streaming only: request reached the serving role -> its first output chunk |
| ray_rld_request_seconds                      | histogram | request reached the recording role -> last chunk; with role="prefill" it is the prefill replica's own time (prompt prefill + 1 token) |

Non-streaming responses arrive in one piece, so they feed neither TTFT nor KV hand-off.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Optional

from ray.util.metrics import Counter, Histogram

Path = Literal["remote", "local", "fallback"]

# Seconds; wide enough for a 2-core CPU box and for long GPU prompts.
LATENCY_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
TAG_KEYS = ("model", "mode", "role", "path")


@dataclass
class RequestClock:
    """Monotonic timestamps of one request as it crosses a serving role."""

    arrived: float = field(default_factory=time.monotonic)
    prefill_sent: Optional[float] = None
    prefill_done: Optional[float] = None
    first_chunk: Optional[float] = None
    handed_off_tokens: Optional[int] = None
    path: Optional[Path] = None  # set when the path is decided late (remote prefill failed -> fallback)


class RequestMetrics:
    """The metric objects of one replica; the role-constant labels are set once here."""

    def __init__(self, *, model: str, mode: str, role: str) -> None:
        self._tags = {"model": model, "mode": mode, "role": role}

        def histogram(name: str, description: str) -> Histogram:
            h = Histogram(name, description=description, boundaries=LATENCY_BOUNDARIES_S, tag_keys=TAG_KEYS)
            h.set_default_tags(self._tags)
            return h

        def counter(name: str, description: str) -> Counter:
            c = Counter(name, description=description, tag_keys=TAG_KEYS)
            c.set_default_tags(self._tags)
            return c

        self.requests = counter("rld_requests", "Chat/completions requests accepted, by prefill path.")
        self.prompt_tokens = counter("rld_prompt_tokens", "Prompt tokens, by prefill path.")
        self.errors = counter("rld_request_errors", "Requests that ended in an error response or exception.")
        self.prefill = histogram("rld_prefill_seconds", "Remote prefill round trip seen by decode.")
        self.kv_handoff = histogram(
            "rld_kv_handoff_seconds", "Prefill response -> first decode chunk (KV pull + first step)."
        )
        self.ttft = histogram("rld_time_to_first_token_seconds", "Request arrival -> first streamed chunk.")
        self.total = histogram("rld_request_seconds", "Request arrival -> last chunk.")

    def accepted(self, path: Path, prompt_tokens: Optional[int] = None) -> None:
        self.requests.inc(1, tags={"path": path})
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens, tags={"path": path})

    async def observe(
        self, chunks: AsyncIterator[Any], clock: RequestClock, *, path: Path, stream: bool
    ) -> AsyncIterator[Any]:
        """Pass `chunks` through unchanged, recording the request's timings when it ends."""
        outcome = "error"
        try:
            async for chunk in chunks:
                if clock.first_chunk is None:
                    clock.first_chunk = time.monotonic()
                    if _is_error(chunk):
                        yield chunk
                        return
                yield chunk
            outcome = "ok"
        except (GeneratorExit, asyncio.CancelledError):
            outcome = "cancelled"
            raise
        finally:
            tags = {"path": clock.path or path}
            if outcome == "ok":
                self._record(clock, tags, stream=stream)
            elif outcome == "error":
                self.errors.inc(1, tags=tags)
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()  # end the upstream now (engine abort, counters), not when it is collected

    def _record(self, clock: RequestClock, tags: dict[str, str], *, stream: bool) -> None:
        end = time.monotonic()
        self.total.observe(end - clock.arrived, tags=tags)
        if clock.prefill_sent is not None and clock.prefill_done is not None:
            self.prefill.observe(clock.prefill_done - clock.prefill_sent, tags=tags)
        if clock.handed_off_tokens:
            self.prompt_tokens.inc(clock.handed_off_tokens, tags=tags)
        if stream and clock.first_chunk is not None:
            self.ttft.observe(clock.first_chunk - clock.arrived, tags=tags)
            if clock.prefill_done is not None:
                self.kv_handoff.observe(clock.first_chunk - clock.prefill_done, tags=tags)


def _is_error(chunk: Any) -> bool:
    first = chunk[0] if isinstance(chunk, list) and chunk else chunk
    return type(first).__name__ == "ErrorResponse"
