"""Per-request timings of the serving roles, exported as Prometheus metrics through Ray.

Recorded with `ray.util.metrics`, so every replica's values reach the Ray metrics agent of its node
and show up on that node's `--metrics-export-port` (Ray prefixes each name with `ray_`). Labels:
`model`, `mode` (disaggregated | aggregated), `role` (prefill | decode: the replica that recorded it)
and `path` (remote: prefill ran on the prefill role and the KV moved; local: the serving engine
prefilled the prompt itself; fallback: remote prefill failed before the first token and decode
prefilled it itself, see serve_app/engine/failover.py).

| metric (as exported)                         | type      | what it measures |
|----------------------------------------------|-----------|------------------|
| ray_rld_requests_total                       | counter   | chat/completions requests accepted, by path |
| ray_rld_prompt_tokens_total                  | counter   | prompt tokens by path: remote = `remote_num_tokens` prefill handed off, local = tokens decode counted |
| ray_rld_request_errors_total                 | counter   | requests whose first chunk was an error response or that raised (not client cancellations) |
| ray_rld_prefill_seconds                      | histogram | decode role, remote path: prefill request sent -> prefill response (with kv_transfer_params) back. Includes the prefill queue and the handle round trip |
| ray_rld_kv_handoff_seconds                   | histogram | decode role, remote path, streaming only: prefill response received -> decode's first output chunk. That is decode scheduling + the NIXL KV pull + one decode step; vLLM's own `vllm:nixl_xfer_time_seconds` isolates the transfer |
| ray_rld_time_to_first_token_seconds          | histogram | streaming only: request reached the serving role -> its first output chunk |
| ray_rld_request_seconds                      | histogram | request reached the recording role -> last chunk; with role="prefill" it is the prefill replica's own time (prompt prefill + 1 token) |
| ray_rld_hop_seconds                          | histogram | frontend, streamed requests: one sample per segment of the request's way to its first byte out (label `hop`, serve_app/telemetry/hops.py SEGMENTS) |
| ray_rld_overhead_seconds                     | histogram | frontend, streamed requests: first byte out minus the engine's own time to its first chunk (what serving adds) |

Non-streaming responses arrive in one piece, so they feed neither TTFT nor KV hand-off.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Literal, Optional

from ray.util.metrics import Counter, Histogram

from serve_app.telemetry.hops import HopClock, ReplicaStamps

Path = Literal["remote", "local", "fallback"]

# Seconds; fine at the low end (1-5 ms steps resolve per-hop costs), wide enough for long prompts on a
# 2-core CPU box.
LATENCY_BOUNDARIES_S = [
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.25, 0.3, 0.5, 0.75, 1, 2, 2.5, 5, 10, 30, 60, 120, 300,
]
HOP_BOUNDARIES_S = [
    0.0002, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.2, 0.5, 1, 5, 30, 300,
]
TAG_KEYS = ("model", "mode", "role", "path")
HOP_TAG_KEYS = ("model", "mode", "path", "hop")


class RequestMetrics:
    """The metric objects of one replica; the role-constant labels are set once here."""

    def __init__(self, *, model: str, mode: str, role: str) -> None:
        self._tags = {"model": model, "mode": mode, "role": role}
        self._mode = mode

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
        self, chunks: AsyncIterator[Any], clock: HopClock, *, path: Path, stream: bool
    ) -> AsyncIterator[Any]:
        """Pass `chunks` through, recording the request's timings when it ends. A streamed response's
        first batch also carries this replica's clock stamps back to the frontend (`ReplicaStamps`)."""
        outcome = "error"
        try:
            async for chunk in chunks:
                if "replica_first_out" not in clock.stamps:
                    clock.stamp("replica_first_out")
                    if _is_error(chunk):
                        yield chunk
                        return
                    if stream and isinstance(chunk, list):
                        # By the first chunk the path is final (failover may have turned remote into fallback).
                        final = clock.path or path
                        chunk = [*chunk, ReplicaStamps(dict(clock.stamps), final, self._mode, clock.prompt_tokens)]
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

    def _record(self, clock: HopClock, tags: dict[str, str], *, stream: bool) -> None:
        s = clock.stamps
        end = time.time()
        self.total.observe(end - s["replica_received"], tags=tags)
        if "prefill_sent" in s and "prefill_returned" in s:
            self.prefill.observe(s["prefill_returned"] - s["prefill_sent"], tags=tags)
        if clock.prompt_tokens and tags["path"] == "remote":  # the local path counted them on accept
            self.prompt_tokens.inc(clock.prompt_tokens, tags=tags)
        if stream and "replica_first_out" in s:
            self.ttft.observe(s["replica_first_out"] - s["replica_received"], tags=tags)
            if "prefill_returned" in s:
                self.kv_handoff.observe(s["replica_first_out"] - s["prefill_returned"], tags=tags)


class HopMetrics:
    """The frontend's per-hop histograms, fed once per streamed request from its assembled clock."""

    def __init__(self) -> None:
        self.hops = Histogram("rld_hop_seconds", description="Seconds per segment of a request's way to its "
                              "first byte out (serve_app/telemetry/hops.py).", boundaries=HOP_BOUNDARIES_S,
                              tag_keys=HOP_TAG_KEYS)
        self.overhead = Histogram("rld_overhead_seconds", description="First byte out of the frontend minus "
                                  "the engine's own time to its first chunk.", boundaries=HOP_BOUNDARIES_S,
                                  tag_keys=("model", "mode", "path"))

    def record(self, clock: HopClock, model: str) -> None:
        base = {"model": model, "mode": clock.mode or "", "path": clock.path or ""}
        segments = clock.segments()
        for hop, seconds in segments.items():
            self.hops.observe(max(seconds, 0.0), tags={**base, "hop": hop})
        if "ingress_total" in segments and "engine" in segments:
            self.overhead.observe(max(segments["ingress_total"] - segments["engine"], 0.0), tags=base)


def _is_error(chunk: Any) -> bool:
    first = chunk[0] if isinstance(chunk, list) and chunk else chunk
    return type(first).__name__ == "ErrorResponse"
