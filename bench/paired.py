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


def stream_once(base_url: str, body: dict[str, Any], timeout_s: float = 120.0) -> StreamResult:
    u = urlsplit(base_url)
    path = "/chat/completions" if "messages" in body else "/completions"
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        t0 = time.perf_counter()
        conn.request("POST", u.path.rstrip("/") + path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Accept-Encoding": "identity"})
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

    @property
    def ttft_p50_ratio(self) -> float:
        a, b = self.modes
        return self.ttft_ms[b]["p50"] / self.ttft_ms[a]["p50"]

    def line(self) -> str:
        a, b = self.modes
        return (f"paired TTFT at 1 user ({self.pairs} identical prompts, alternating): {b} p50 "
                f"{self.ttft_ms[b]['p50']:.1f} ms vs {a} {self.ttft_ms[a]['p50']:.1f} ms = "
                f"{self.ttft_p50_ratio:.2f}x; median extra {self.ttft_diff_ms['p50']:.1f} ms per request")


def paired_ttft(urls: dict[str, str], calibration: Calibration, model: str, w: Workload, pairs: int,
                time_limit_s: float = 180.0, seed: int = 7) -> PairedResult:
    """`urls` has two entries {mode: base_url}; the first is the baseline. Bounded by `pairs`
    rounds and `time_limit_s`."""
    (a, ua), (b, ub) = list(urls.items())
    factory = PromptFactory(calibration, w.api, INSTRUCTION)  # type: ignore[arg-type]
    results: dict[str, list[StreamResult]] = {a: [], b: []}
    deadline = time.monotonic() + time_limit_s
    done = 0
    for i in range(pairs):
        if time.monotonic() > deadline:
            break
        body = {"model": model, **factory.make(w.input_tokens, random.Random(seed * 100003 + i)),
                "max_tokens": w.output_tokens, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True}
        order = [(a, ua), (b, ub)] if i % 2 == 0 else [(b, ub), (a, ua)]
        for mode, url in order:
            results[mode].append(stream_once(url, body))
        done += 1

    def ok(mode: str) -> list[StreamResult]:
        return [r for r in results[mode] if r.problem() is None]

    diffs = [rb.ttft_s * 1000 - ra.ttft_s * 1000  # type: ignore[operator]
             for ra, rb in zip(results[a], results[b]) if ra.problem() is None and rb.problem() is None]
    return PairedResult(
        modes=(a, b), pairs=done,
        ttft_ms={m: describe([r.ttft_s * 1000 for r in ok(m) if r.ttft_s is not None]) for m in (a, b)},
        itl_ms={m: describe([r.itl_s * 1000 for r in ok(m) if r.itl_s is not None]) for m in (a, b)},
        e2e_ms={m: describe([r.e2e_s * 1000 for r in ok(m)]) for m in (a, b)},
        ttft_diff_ms=describe(diffs),
        errors={m: len(results[m]) - len(ok(m)) for m in (a, b)},
    )
