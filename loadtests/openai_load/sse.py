"""Reads an OpenAI-style server-sent-event stream and times its tokens.

Definitions (all times from the moment the request is sent, perf_counter clock):
- TTFT: arrival of the first chunk that carries generated text (chat `delta.content` or
  `delta.reasoning_content`/`reasoning`, completions `text`); role-only chunks do not count.
- E2E: arrival of `data: [DONE]` (or the end of the stream).
- output tokens: `usage.completion_tokens` from the final usage chunk (we always ask for
  `stream_options.include_usage`); if the server sends no usage, the number of text chunks.
- ITL: mean gap between tokens after the first one,
  (time of last text chunk - time of first text chunk) / (output tokens - 1). One value per
  request (a.k.a. TPOT). Per-chunk gaps are not used because servers may batch several tokens
  into one chunk (Ray Serve LLM does), which makes chunk gaps bimodal and not per-token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol

from .profiles import Api


@dataclass
class StreamResult:
    """What one streamed response looked like."""

    e2e_s: float = 0.0
    first_token_s: float | None = None
    last_token_s: float | None = None
    text_chunks: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    text: list[str] = field(default_factory=list)
    # the server's own record of the request, if it sent one as an SSE comment (`: rld-trace {...}`,
    # this project's app does when asked with `x-rld-trace: 1`)
    server_trace: dict | None = None
    # gaps between consecutive text chunks as seen by the client, binned (`gap_bin`): per-token inter-token
    # latency where a server sends one token per chunk and coalesced chunks arrive together (gaps ~0)
    gap_hist: dict[int, int] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.text_chunks

    @property
    def ttft_s(self) -> float | None:
        return self.first_token_s

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency after the first token; None with fewer than 2 tokens."""
        n = self.output_tokens
        if self.first_token_s is None or self.last_token_s is None or n < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (n - 1)

    @property
    def output_tokens_per_s(self) -> float | None:
        """Output tokens over the request's end-to-end time."""
        if self.e2e_s <= 0 or self.output_tokens == 0:
            return None
        return self.output_tokens / self.e2e_s

    def problem(self) -> str | None:
        """Why this response counts as failed, or None if it is a success."""
        if self.error:
            return self.error
        if not self.done:
            return "stream ended without data: [DONE]"
        if self.text_chunks == 0:
            return "stream carried no generated text"
        return None


def _chunk_text(obj: dict, api: Api) -> str:
    choices = obj.get("choices") or []
    if not choices:
        return ""
    c0 = choices[0]
    if api == "chat":
        delta = c0.get("delta") or {}
        return (delta.get("content") or "") + (
            delta.get("reasoning_content") or delta.get("reasoning") or ""
        )
    return c0.get("text") or ""


def _finish_reason(obj: dict) -> str | None:
    for c in obj.get("choices") or []:
        if c.get("finish_reason"):
            return str(c["finish_reason"])
    return None


SERVER_TRACE_PREFIX = b": rld-trace "


def gap_bin(gap_ms: float) -> int:
    """Histogram bin of an inter-chunk gap: 0.5 ms wide below 100 ms, 5 ms wide up to 2 s, one bin above."""
    if gap_ms < 100:
        return int(gap_ms * 2)
    return 200 + min(int((gap_ms - 100) / 5), 380)


def bin_value_ms(b: int) -> float:
    """The middle of bin `b` (gap_bin's inverse), in ms."""
    if b < 200:
        return (b + 0.5) / 2
    return 100 + (b - 200 + 0.5) * 5


def hist_percentile(hist: dict[int, int], q: float) -> float:
    """Percentile q (0-100) of a gap histogram (bins -> counts), by bin middles; NaN when empty."""
    total = sum(hist.values())
    if not total:
        return float("nan")
    rank = q / 100 * (total - 1)
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen > rank:
            return bin_value_ms(b)
    return bin_value_ms(max(hist))


def consume_sse(
    lines: Iterable[bytes],
    api: Api,
    start: float,
    clock: Callable[[], float] = time.perf_counter,
    keep_text: bool = False,
) -> StreamResult:
    """Read SSE `lines` (one line per item, as they arrive) and time the tokens.

    `start` is the clock value when the request was sent. Lines that are not `data:` lines
    (comments, `event:`, blanks) are skipped, but for a `: rld-trace {...}` comment, kept as `server_trace`.
    """
    r = StreamResult()
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            if line.startswith(SERVER_TRACE_PREFIX):
                try:
                    r.server_trace = json.loads(line[len(SERVER_TRACE_PREFIX):])
                except ValueError:
                    pass
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            r.done = True
            break
        try:
            obj = json.loads(payload)
        except ValueError:
            r.error = f"malformed SSE data: {payload[:200]!r}"
            break
        if not isinstance(obj, dict):
            r.error = f"unexpected SSE data: {payload[:200]!r}"
            break
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else err
            r.error = f"server error in stream: {msg or obj}"[:500]
            break
        now = clock() - start
        text = _chunk_text(obj, api)
        if text:
            if r.first_token_s is None:
                r.first_token_s = now
            else:
                b = gap_bin((now - r.last_token_s) * 1000)  # type: ignore[operator]
                r.gap_hist[b] = r.gap_hist.get(b, 0) + 1
            r.last_token_s = now
            r.text_chunks += 1
            if keep_text:
                r.text.append(text)
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            r.usage_completion_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                r.usage_prompt_tokens = int(usage["prompt_tokens"])
        r.finish_reason = _finish_reason(obj) or r.finish_reason
    r.e2e_s = clock() - start
    return r


class _LineReader(Protocol):
    def readline(self, sep: bytes = ...) -> bytes: ...


def iter_response_lines(raw: _LineReader) -> Iterator[bytes]:
    """Yield body lines of a geventhttpclient response as soon as each is complete.

    Locust's `FastResponse.iter_content(n)` blocks until n bytes arrive, which would delay
    each SSE event until more data comes and inflate TTFT; `readline` returns per line.
    """
    while True:
        line = raw.readline(b"\n")
        if not line:
            return
        yield line
