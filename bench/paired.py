"""Paired TTFT at concurrency 1: the same prompt to two servers, alternately, one request at a time.

Background load on a shared 2-core machine drifts over minutes, so comparing two ladders run
minutes apart mixes the servers' difference with the drift. Here both servers are up and each
round sends one identical prompt to each (order alternating A-B, B-A), so drift hits both alike.
Streams are timed with the locustfile's own SSE code (loadtests/openai_load/sse.py).
"""

from __future__ import annotations

import http.client
import json
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench.ladder import Workload
from loadtests.openai_load.prompts import Calibration, PromptFactory
from loadtests.openai_load.samples import describe
from loadtests.openai_load.sse import StreamResult, consume_sse

from loadtests.openai_load.profiles import get_profile

INSTRUCTION = get_profile("chat").instruction  # the bench drives the `chat` workload


def stream_once(base_url: str, body: dict[str, Any], timeout_s: float = 120.0,
                request_id: str | None = None, headers: dict[str, str] | None = None) -> StreamResult:
    """One streamed request; `request_id` goes out as `x-request-id` (the app's trace lines carry it)."""
    u = urlsplit(base_url)
    path = "/chat/completions" if "messages" in body else "/completions"
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    sent = {"Content-Type": "application/json", "Accept-Encoding": "identity", **(headers or {})}
    if request_id:
        sent["x-request-id"] = request_id
        sent["x-rld-trace"] = "1"  # our app answers with its per-hop record (StreamResult.server_trace)
    try:
        t0 = time.perf_counter()
        conn.request("POST", u.path.rstrip("/") + path, body=json.dumps(body), headers=sent)
        resp = conn.getresponse()
        if resp.status != 200:
            r = StreamResult(e2e_s=time.perf_counter() - t0)
            r.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return r
        return consume_sse(iter(resp.readline, b""), "chat" if "messages" in body else "completions", t0)
    finally:
        conn.close()


@dataclass(frozen=True)
class PairedResult:
    modes: tuple[str, str]
    pairs: int
    ttft_ms: dict[str, dict[str, float]]
    itl_ms: dict[str, dict[str, float]]
    e2e_ms: dict[str, dict[str, float]]
    ttft_diff_ms: dict[str, float]  # per pair: second mode - first mode
    errors: dict[str, int]
    # per mode, per request in send order: (x-request-id, client TTFT in ms or None on error)
    requests: dict[str, list[tuple[str, float | None]]] | None = None

    @property
    def ttft_p50_ratio(self) -> float:
        a, b = self.modes
        return self.ttft_ms[b]["p50"] / self.ttft_ms[a]["p50"]

    def line(self) -> str:
        a, b = self.modes
        return (f"paired TTFT at 1 user ({self.pairs} identical prompts, alternating): {b} p50 "
                f"{self.ttft_ms[b]['p50']:.1f} ms vs {a} {self.ttft_ms[a]['p50']:.1f} ms = "
                f"{self.ttft_p50_ratio:.2f}x; median extra {self.ttft_diff_ms['p50']:.1f} ms per request")


Rounds = dict[str, list[tuple[str, StreamResult]]]  # per server: (request id, result), in round order


def ttft_rounds(urls: dict[str, str], calibration: Calibration, model: str, w: Workload, rounds: int,
                time_limit_s: float = 180.0, seed: int = 7, tag: str = "paired",
                headers: dict[str, str] | None = None) -> Rounds:
    """Each round sends one identical prompt to every server in `urls`, one request at a time, the
    order rotated from round to round so no server always goes first. Bounded by `rounds` and
    `time_limit_s`. Request ids are `<tag>-<server>-<round>`."""
    factory = PromptFactory(calibration, w.api, INSTRUCTION)  # type: ignore[arg-type]
    servers = list(urls.items())
    results: Rounds = {name: [] for name in urls}
    deadline = time.monotonic() + time_limit_s
    for i in range(rounds):
        if time.monotonic() > deadline:
            break
        body = {"model": model, **factory.make(w.input_tokens, random.Random(seed * 100003 + i)),
                "max_tokens": w.output_tokens, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True}
        shift = i % len(servers)
        for name, url in servers[shift:] + servers[:shift]:
            request_id = f"{tag}-{name}-{i}"
            results[name].append((request_id, stream_once(url, body, request_id=request_id, headers=headers)))
    return results


def pair_of(results: Rounds, a: str, b: str) -> PairedResult:
    """The paired comparison of servers `a` (baseline) and `b` from the same rounds."""

    def ok(mode: str) -> list[StreamResult]:
        return [r for _, r in results[mode] if r.problem() is None]

    diffs = [rb.ttft_s * 1000 - ra.ttft_s * 1000  # type: ignore[operator]
             for (_, ra), (_, rb) in zip(results[a], results[b]) if ra.problem() is None and rb.problem() is None]
    return PairedResult(
        modes=(a, b), pairs=min(len(results[a]), len(results[b])),
        ttft_ms={m: describe([r.ttft_s * 1000 for r in ok(m) if r.ttft_s is not None]) for m in (a, b)},
        itl_ms={m: describe([r.itl_s * 1000 for r in ok(m) if r.itl_s is not None]) for m in (a, b)},
        e2e_ms={m: describe([r.e2e_s * 1000 for r in ok(m)]) for m in (a, b)},
        ttft_diff_ms=describe(diffs),
        errors={m: len(results[m]) - len(ok(m)) for m in (a, b)},
        requests={m: [(rid, r.ttft_s * 1000 if r.problem() is None and r.ttft_s is not None else None)
                      for rid, r in results[m]] for m in (a, b)},
    )


def paired_ttft(urls: dict[str, str], calibration: Calibration, model: str, w: Workload, pairs: int,
                time_limit_s: float = 180.0, seed: int = 7, tag: str = "paired",
                headers: dict[str, str] | None = None) -> PairedResult:
    """`urls` has two entries {mode: base_url}; the first is the baseline. Bounded by `pairs`
    rounds and `time_limit_s`. Request ids are `<tag>-<mode>-<round>`."""
    (a, _), (b, _) = list(urls.items())
    return pair_of(ttft_rounds(urls, calibration, model, w, pairs, time_limit_s, seed, tag, headers), a, b)
