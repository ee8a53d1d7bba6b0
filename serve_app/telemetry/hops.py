"""One clock per request, from the frontend to the first byte out.

Why: a serving layer slower than the engine it wraps is the first thing a user measures, and "Serve is
slow" is not actionable. Every streamed request carries a `HopClock`: wall-clock stamps taken where the
request crosses a boundary. The serving replica (decode, or the aggregated engine) stamps its part and
sends it back riding on the first output batch; the ingress adds its own, records one histogram sample
per segment (`ray_rld_hop_seconds{hop=...}`, buckets fine enough for 1-5 ms) and logs one trace line
(`RLD_TRACE {...}`, on the frontend's stderr) that benchmarks collect by request id. So there is one definition of "overhead":
the time to the first byte out minus the engine's own time to its first chunk.

Stamps (seconds since the epoch; cross-process segments assume the hosts' clocks agree, which NTP/chrony
keeps within a millisecond or so on EKS; on one machine they are exact):

    ingress_received     the ingress replica's ASGI app got the request (after the Serve proxy)
    ingress_dispatched   body parsed and validated, handle call made to the serving deployment
    replica_received     the serving replica's chat()/completions() started
    prefill_sent         (remote path) the prefill request left for the prefill deployment
    prefill_returned     (remote path) the prefill response, with kv_transfer_params, arrived
    engine_called        the local vLLM engine's generator was first asked for output
    engine_first_chunk   vLLM yielded its first streamed chunk (render + schedule + prefill/KV pull + step)
    replica_first_out    the first batch left the replica (after `StreamBatcher`)
    ingress_first_in     the first batch reached the ingress
    ingress_first_out    the ingress handed the first bytes to the HTTP response

The stream batching that decides when the first token may leave the serving replica lives in
serve_app/engine/batching.py.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional

STAMPS = (
    "ingress_received",
    "ingress_dispatched",
    "replica_received",
    "prefill_sent",
    "prefill_returned",
    "engine_called",
    "engine_first_chunk",
    "replica_first_out",
    "ingress_first_in",
    "ingress_first_out",
)
# Segment name -> (from stamp, to stamp). Consecutive on each path, so on the remote path they add up to
# ingress_received -> ingress_first_out; `engine` overlaps the decode-side ones and is reported beside them.
SEGMENTS = {
    "ingress_parse": ("ingress_received", "ingress_dispatched"),
    "ingress_to_replica": ("ingress_dispatched", "replica_received"),
    "replica_to_prefill": ("replica_received", "prefill_sent"),
    "prefill": ("prefill_sent", "prefill_returned"),
    "replica_to_engine": ("replica_received", "engine_called"),  # local path
    "handoff_to_engine": ("prefill_returned", "engine_called"),  # remote path
    "engine": ("engine_called", "engine_first_chunk"),
    "batch_wait": ("engine_first_chunk", "replica_first_out"),
    "replica_to_ingress": ("replica_first_out", "ingress_first_in"),
    "ingress_out": ("ingress_first_in", "ingress_first_out"),
    "ingress_total": ("ingress_received", "ingress_first_out"),
}
# Segments that partition ingress_total on each path (the per-hop record "accounts for" TTFT with these).
PATH_SEGMENTS = {
    "local": ("ingress_parse", "ingress_to_replica", "replica_to_engine", "engine", "batch_wait",
              "replica_to_ingress", "ingress_out"),
    "remote": ("ingress_parse", "ingress_to_replica", "replica_to_prefill", "prefill", "handoff_to_engine",
               "engine", "batch_wait", "replica_to_ingress", "ingress_out"),
}
TRACE_LOG_PREFIX = "RLD_TRACE "
# A client that sends this header gets its request's record in the stream itself, as an SSE comment
# (`: rld-trace {...}`) right after the first chunk; SSE clients ignore comments.
TRACE_REQUEST_HEADER = b"x-rld-trace"
TRACE_SSE_PREFIX = b": rld-trace "


@dataclass
class HopClock:
    """Wall-clock stamps of one request (see the module doc for what each means)."""

    stamps: dict[str, float] = field(default_factory=dict)
    path: Optional[str] = None  # "local" | "remote" (set by the serving replica)
    mode: Optional[str] = None
    prompt_tokens: Optional[int] = None
    model: Optional[str] = None  # set by the frontend

    def merge(self, replica: "ReplicaStamps") -> None:
        """Take the serving replica's stamps and labels (they ride on its first output batch)."""
        for name, at in replica.stamps.items():
            self.stamps.setdefault(name, at)
        self.path, self.mode = replica.path, replica.mode
        if replica.prompt_tokens is not None:
            self.prompt_tokens = replica.prompt_tokens

    def stamp(self, name: str, at: Optional[float] = None) -> None:
        if name not in self.stamps:  # the first time counts (e.g. the first chunk)
            self.stamps[name] = time.time() if at is None else at

    def segments(self) -> dict[str, float]:
        """Seconds per segment whose two stamps exist; once the path is known, only that path's segments
        (on the remote path `replica_received -> engine_called` spans the whole prefill, not a hop)."""
        s = self.stamps
        names = (*PATH_SEGMENTS[self.path], "ingress_total") if self.path in PATH_SEGMENTS else SEGMENTS
        return {name: s[b] - s[a] for name in names for a, b in [SEGMENTS[name]] if a in s and b in s}

    def trace(self, request_id: str) -> dict[str, Any]:
        t0 = self.stamps.get("ingress_received", min(self.stamps.values(), default=0.0))
        return {
            "request_id": request_id,
            "model": self.model,
            "path": self.path,
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "t_ms": {k: round((v - t0) * 1000, 3) for k, v in sorted(self.stamps.items(), key=lambda kv: kv[1])},
            "segments_ms": {k: round(v * 1000, 3) for k, v in self.segments().items()},
        }


@dataclass
class ReplicaStamps:
    """What the serving replica sends back to the ingress, appended to its first output batch."""

    stamps: dict[str, float]
    path: str
    mode: str
    prompt_tokens: Optional[int] = None


def trace_line(clock: HopClock, request_id: str) -> str:
    return TRACE_LOG_PREFIX + json.dumps(clock.trace(request_id), separators=(",", ":"))


def trace_logger() -> logging.Logger:
    """Where the frontend writes trace lines: a file of its own beside Serve's replica log
    (`serve/rld_traces_<pid>.log` in the Ray session's logs), one flushed line per request.

    Not Serve's replica logger, nor sys.stderr (which Serve redirects into that logger in replicas): in
    Serve's high-throughput mode the replica logger buffers a thousand records before it writes, and a
    benchmark wants each line as soon as the response is done. Outside a Serve replica: the process's
    real stderr.
    """
    log = logging.getLogger("serve_app.trace")
    if not log.handlers:
        log.addHandler(_trace_handler())
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def _trace_handler() -> logging.Handler:
    for handler in logging.getLogger("ray.serve").handlers:
        target = getattr(handler, "target", handler)  # Serve wraps its file handler in a MemoryHandler
        base = getattr(target, "baseFilename", None)
        if base:
            handler_ = logging.FileHandler(os.path.join(os.path.dirname(base), f"rld_traces_{os.getpid()}.log"))
            break
    else:
        handler_ = logging.StreamHandler(sys.__stderr__)
    handler_.setFormatter(logging.Formatter("%(message)s"))
    return handler_


def parse_trace_line(line: str) -> Optional[dict[str, Any]]:
    """The trace dict of a log line holding one (benchmarks read replica logs with this)."""
    at = line.find(TRACE_LOG_PREFIX)
    if at < 0:
        return None
    try:
        return json.loads(line[at + len(TRACE_LOG_PREFIX):])
    except json.JSONDecodeError:
        return None


# The serving replica's clock for the request being processed. Set around the code that builds the
# engine stream (it runs in the caller's context), read by `_batch_output_stream`.
CURRENT: contextvars.ContextVar[Optional[HopClock]] = contextvars.ContextVar("rld_hop_clock", default=None)


def read_traces(log_dir: os.PathLike[str] | str) -> dict[str, dict[str, Any]]:
    """Every trace line the frontends logged under a Ray session's log folder, by request id."""
    from pathlib import Path

    traces: dict[str, dict[str, Any]] = {}
    logs = Path(log_dir)
    for log in sorted([*logs.glob("serve/rld_traces_*.log"), *logs.glob("worker-*.err"), *logs.glob("serve/replica_*.log")]):
        with open(log, errors="replace") as lines:
            for line in lines:
                trace = parse_trace_line(line) if TRACE_LOG_PREFIX in line else None
                if trace is not None:
                    traces[trace["request_id"]] = trace
    return traces
