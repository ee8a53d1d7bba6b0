"""The hostile requests of issue 18 and the concurrent stream they must not stall: shared by tests/resilience
(the separate frontend) and tests/direct (the default graph, the frontend inside the decode replica, whose event
loop also streams every token of that replica)."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Callable, Optional

import httpx

from devstack.serve_config import MODEL_ID

from .resilience_helpers import error_of, measured, wait_until

# Each hostile request is answered (4xx) within ANSWER_S, and the concurrent stream never waits longer than GAP_S
# between two chunks, on top of what this machine takes right now for the same without the hostile input (a small
# 400; the stream's own longest gap before): on an idle machine that is ~2 s, on a loaded one it grows with the load
# instead of failing on it (issue 22), while a blocked event loop (34 s on main for 45 KB) still fails.
ANSWER_S = 2.0
GAP_S = 2.0
BASELINE_FACTOR = 3


def baseline_answer_s(http: httpx.Client) -> float:
    """The slowest of three small bad requests' 400s now."""
    took = []
    for _ in range(3):
        response, seconds = timed(lambda: http.post("/v1/chat/completions", json=chat(max_tokens=-1)))
        assert response.status_code == 400, response.text[:300]
        took.append(seconds)
    return max(took)
MESSAGES = [{"role": "user", "content": "hello"}]
INTERNAL = re.compile(r"Traceback|File \"|pid=|ip=|\d{1,3}(\.\d{1,3}){3}|ray::|Serve says|actor_id", re.IGNORECASE)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 4, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "prompt": "hello", "max_tokens": 4, **fields}


def junk_keys(n: int, **fields: Any) -> dict[str, Any]:
    return {**chat(), **{f"k{i}": 0 for i in range(n)}, **fields}


# (name, path, body, expected status, expected param (None: any)); each stands for a class of the findings.
HOSTILE: list[tuple[str, str, Any, int, Optional[str]]] = [
    ("4000 junk keys + empty tools (45 KB; 34 s of blocked loop on main)", "/v1/chat/completions",
     junk_keys(4000, tools=[]), 400, None),
    ("16000 junk keys (190 KB; 196 s on main)", "/v1/chat/completions", junk_keys(16000, tools=[]), 400, None),
    ("empty tools names tools", "/v1/chat/completions", chat(temperature=0.5, tools=[]), 400, "tools"),
    ("model-validator conflict", "/v1/chat/completions",
     chat(add_generation_prompt=True, continue_final_message=True), 400, None),
    ("200k bad_words (2 s per decode step on main)", "/v1/completions",
     completion(bad_words=["w"] * 200_000), 400, "bad_words"),
    ("400k stop strings (278 ms per token on main)", "/v1/chat/completions", chat(stop=["s"] * 400_000), 400, "stop"),
    ("100k logit_bias entries", "/v1/chat/completions",
     chat(logit_bias={str(i): 1 for i in range(100_000)}), 400, "logit_bias"),
    ("10k tools", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(10_000)]), 400, "tools"),
    ("1 MB response_format schema", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"d": "x" * 1_000_000}}}),
     400, "response_format"),
    ("prompt_logprobs (vLLM #38830)", "/v1/completions", completion(prompt_logprobs=5), 400, "prompt_logprobs"),
    ("echo + logprobs on a long prompt", "/v1/completions",
     completion(prompt="word " * 1500, echo=True, logprobs=5), 400, "echo"),
    ("deep nesting", "/v1/chat/completions", chat(metadata=json.loads("[" * 200 + "]" * 200)), 400, None),
    ("too many prompts x n", "/v1/completions", completion(prompt=["p"] * 65, n=8), 400, "prompt"),
    ("50-byte schema pattern [a-z]{1,20000} (42 s of grammar expansion in vLLM's validation)", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
         "type": "string", "pattern": "[a-z]{1,20000}"}}}), 400, "response_format.json_schema.schema.pattern"),
    ("nested counts in a tool's pattern (12 s)", "/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
         "s": {"type": "string", "pattern": "((.{1,10}){1,10}){1,10}"}}}}}], tool_choice="required"),
     400, "tools.0.function.parameters.properties.s.pattern"),
    ("3000 nested groups in a schema pattern (50000 crashed xgrammar)", "/v1/completions",
     completion(structured_outputs={"json": {"type": "string", "pattern": "(" * 3000 + "a" + ")" * 3000}}),
     400, "structured_outputs.json.pattern"),
]


class Stream:
    """One long streamed chat request in the background; records the gaps between its chunks."""

    def __init__(self, client: httpx.Client, max_tokens: int = 600) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.arrivals: list[float] = []
        self.status: Optional[int] = None
        self.done_event = False
        self.error: Optional[str] = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Count slowly from one to one thousand."}],
                "max_tokens": self.max_tokens, "stream": True, "ignore_eos": True}
        try:
            with self.client.stream("POST", "/v1/chat/completions", json=body, timeout=300) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        self.arrivals.append(time.monotonic())
                        if line.strip() == "data: [DONE]":
                            self.done_event = True
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def start(self) -> "Stream":
        self._thread.start()
        wait_until("the concurrent stream's first chunks", lambda: len(self.arrivals) >= 3 or self.error is not None,
                   timeout_s=180, every_s=0.2)
        assert self.error is None, self.error
        return self

    def gaps_between(self, start: float, end: float) -> float:
        """The longest wait between two chunks (or from `start` to the first, or the last to `end`) in [start, end];
        a stream that ended before `end` counts up to its last chunk."""
        if self.done_event:
            end = min(end, self.arrivals[-1])
        inside = [t for t in self.arrivals if start <= t <= end]
        points = [start, *inside, end]
        return max(b - a for a, b in zip(points, points[1:]))

    def join(self) -> None:
        self._thread.join(timeout=300)


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def hostile_requests_get_a_fast_4xx_while_a_stream_keeps_flowing(http: httpx.Client) -> None:
    """Each of HOSTILE gets its 4xx (naming its param, no internal text) fast, while a long stream on the same
    endpoint keeps its inter-chunk gaps short: the answering event loop is never blocked."""
    stream = Stream(http, max_tokens=1000).start()
    answer_bound = ANSWER_S + BASELINE_FACTOR * baseline_answer_s(http)
    gap_bound = GAP_S + BASELINE_FACTOR * stream.gaps_between(stream.arrivals[0], stream.arrivals[-1])
    began = time.monotonic()
    slowest = 0.0
    overlapped = 0
    for name, path, body, status, param in HOSTILE:
        raw = json.dumps(body).encode()
        response, took = timed(lambda p=path, r=raw: http.post(p, content=r, headers={"content-type": "application/json"}))
        assert response.status_code == status, f"{name}: {response.status_code} {response.text[:300]}"
        error = error_of(response)
        if param is not None:
            assert error["param"] == param, f"{name}: {error}"
        assert not INTERNAL.search(error["message"]), f"{name}: {error['message']}"
        assert took < answer_bound, f"{name}: answered in {took:.2f} s ({len(raw)} bytes; bound {answer_bound:.2f} s)"
        slowest = max(slowest, took)
        overlapped += not stream.done_event
        measured(f"hostile: {name}: {response.status_code} in {took * 1000:.0f} ms ({len(raw) // 1024} KB)")
    ended = time.monotonic()
    gap = stream.gaps_between(began, ended)
    measured(f"hostile: {len(HOSTILE)} requests, slowest answer {slowest * 1000:.0f} ms; concurrent stream's "
             f"longest gap meanwhile {gap * 1000:.0f} ms ({overlapped} requests answered while it ran)")
    assert overlapped >= 5, "the concurrent stream ended before the heavy hostile requests were sent"
    assert gap < gap_bound, f"the concurrent stream stalled {gap:.2f} s (bound {gap_bound:.2f} s) while hostile requests were answered"
    stream.join()
    assert stream.status == 200 and stream.done_event, (stream.status, stream.error)
