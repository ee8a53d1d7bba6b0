"""Timing accuracy of the locustfile against a deterministic SSE server (real HTTP on 127.0.0.1).

The server answers like an OpenAI endpoint but with known timing: the first token after
FIRST_S, then one token every GAP_S. The measured TTFT/ITL/E2E must match, which they would not
if the stream were read in fixed-size blocks (Locust's iter_content waits for 1 KiB). It has no
/tokenize, so prompts are calibrated from usage.prompt_tokens (the `usage-exact` method: its
prompt_tokens is one per word), and calibrated prompts must hit the target exactly.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
from .lt_helpers import run_locust

FIRST_S = 0.30
GAP_S = 0.05
TEMPLATE_TOKENS = 7  # the stub's "chat template" overhead


class _StubOpenAI(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    in_flight = 0
    most_in_flight = 0  # the most streamed requests served at once since the last reset

    @classmethod
    def reset_concurrency(cls) -> None:
        with cls.lock:
            cls.in_flight = cls.most_in_flight = 0

    def log_message(self, *_: object) -> None:
        pass

    def _json(self, code: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def _chunk(self, data: str) -> None:
        raw = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        words = len(body["messages"][0]["content"].split())
        usage = {"prompt_tokens": TEMPLATE_TOKENS + words, "completion_tokens": body["max_tokens"]}
        if not body.get("stream"):
            self._json(200, {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}],
                             "usage": usage})
            return
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            self._stream(body, usage)
        finally:
            with cls.lock:
                cls.in_flight -= 1

    def _stream(self, body: dict, usage: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
        time.sleep(FIRST_S)
        for i in range(body["max_tokens"]):
            if i:
                time.sleep(GAP_S)
            self._chunk(json.dumps({"choices": [{"delta": {"content": f" t{i}"}}]}))
            if body.get("temperature") == 9:  # the test's trigger for a mid-stream failure
                self._chunk(json.dumps({"error": {"message": "boom: engine died"}}))
                break
        else:
            self._chunk(json.dumps({"choices": [], "usage": usage}))
            self._chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubOpenAI)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_ttft_itl_e2e_match_the_servers_timing(stub_url: str, tmp_path: Path) -> None:
    n_out = 5
    run = run_locust(stub_url, tmp_path, "--input-tokens", "40", "--output-tokens", str(n_out),
                     users=2, run_time_s=60, max_requests=4)
    assert run.returncode == 0, run.output[-3000:]
    s = run.summary
    assert s["ok"] == 4 and s["failed"] == 0
    assert s["calibration"].startswith("usage-exact")
    assert s["prompt_tokens"]["min"] == s["prompt_tokens"]["max"] == 40
    m = s["metrics"]
    slack = 0.15  # s, for a busy 2-core machine
    assert FIRST_S * 1000 <= m["TTFT"]["min"] and m["TTFT"]["max"] <= (FIRST_S + slack) * 1000
    # A gap is seen between two chunk arrivals: a late read of the earlier chunk shortens it (49.2 ms for a 50 ms
    # gap was seen on a fresh clone), a late read of the later one lengthens it: both bounds carry the same jitter.
    read_jitter_ms = 20
    itl_max_ms = (GAP_S + slack / (n_out - 1)) * 1000 + read_jitter_ms
    assert GAP_S * 1000 - read_jitter_ms <= m["ITL"]["min"] and m["ITL"]["max"] <= itl_max_ms
    e2e = FIRST_S + (n_out - 1) * GAP_S
    assert e2e * 1000 <= m["E2E"]["min"] and m["E2E"]["max"] <= (e2e + slack) * 1000
    assert s["tokens_per_chunk"]["mean"] == 1.0
    assert s["output_tokens"] == 4 * n_out


def test_mid_stream_error_event_is_a_failure(stub_url: str, tmp_path: Path) -> None:
    run = run_locust(stub_url, tmp_path, "--input-tokens", "40", "--output-tokens", "5",
                     "--temperature", "9", users=1, run_time_s=60, max_requests=2)
    post = run.stats[("POST", "chat")]
    assert int(post["Request Count"]) == int(post["Failure Count"]) == 2
    assert "boom: engine died" in Path(f"{run.prefix}_failures.csv").read_text()
    assert run.returncode == 1  # Locust's own exit code for failures when no SLO is set


def test_unreachable_server_fails_setup_with_exit_2(tmp_path: Path) -> None:
    # a long -t: setup failure must end the run at once, not the time limit
    run = run_locust("http://127.0.0.1:9", tmp_path, users=1, run_time_s=60, max_requests=1, timeout_s=60)
    assert run.returncode == 2
    assert "load-test setup failed" in run.output and "127.0.0.1:9/v1/models" in run.output


def test_calibration_file_is_reused_only_for_the_same_setup(stub_url: str, tmp_path: Path) -> None:
    cal = tmp_path / "cal.json"
    args = ("--input-tokens", "30", "--output-tokens", "2", "--calibration-file", str(cal))
    first = run_locust(stub_url, tmp_path / "a", *args, run_time_s=60, max_requests=1)
    assert first.returncode == 0 and "prompt calibration took" in first.output
    assert json.loads(cal.read_text())["calibration"]["method"] == "usage-exact"
    second = run_locust(stub_url, tmp_path / "b", *args, run_time_s=60, max_requests=1)
    assert second.returncode == 0 and "prompt calibration reused" in second.output
    assert second.summary["prompt_tokens"]["min"] == 30
    # another workload (instruction) must not reuse it
    third = run_locust(stub_url, tmp_path / "c", *args, "--workload", "summarize", run_time_s=60, max_requests=1)
    assert third.returncode == 0 and "prompt calibration took" in third.output


def test_bench_paired_phase_times_both_servers_alike(stub_url: str) -> None:
    from bench.ladder import Workload
    from bench.paired import paired_ttft
    from loadtests.openai_load.prompts import WORD_POOL, Calibration

    cal = Calibration("usage-exact", 11.0, 1.0, WORD_POOL[:24])  # the stub: 7 + 4 instruction words
    urls = {"vllm": f"{stub_url}/v1", "aggregated": f"{stub_url}/v1"}
    r = paired_ttft(urls, cal, "stub", Workload(input_tokens=40, output_tokens=3), pairs=4)
    assert r.pairs == 4 and r.errors == {"vllm": 0, "aggregated": 0}
    for mode in urls:
        assert r.ttft_ms[mode]["count"] == 4
        assert FIRST_S * 1000 <= r.ttft_ms[mode]["min"] <= r.ttft_ms[mode]["max"] < (FIRST_S + 0.15) * 1000
        assert GAP_S * 1000 <= r.itl_ms[mode]["p50"] < (GAP_S + 0.05) * 1000
    assert abs(r.ttft_diff_ms["p50"]) < 50 and 0.8 < r.ttft_p50_ratio < 1.25


def _most_overlapping(records: list[dict]) -> int:
    """The most requests in flight at once, from the client's own start/end times."""
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize(("extra", "most_at_once"), [((), (1, 1)), (("--request-rate", "40"), (4, 20))],
                         ids=["closed-loop", "open-loop"])
def test_open_loop_keeps_sending_while_earlier_requests_are_in_flight(
    stub_url: str, tmp_path: Path, extra: tuple[str, ...], most_at_once: tuple[int, int]
) -> None:
    """Each stubbed request takes ~0.5 s. One closed-loop user never has two in flight; an open-loop
    user offered 40 requests/s does, and every request still completes and is measured."""
    _StubOpenAI.reset_concurrency()
    samples = tmp_path / "samples.jsonl"
    run = run_locust(stub_url, tmp_path, "--input-tokens", "40", "--output-tokens", "5", *extra,
                     "--samples-jsonl", str(samples), "--request-id-prefix", "lt", users=1, run_time_s=60,
                     max_requests=20)
    assert run.returncode == 0, run.output[-3000:]
    assert run.summary["ok"] == 20 and run.summary["failed"] == 0
    # one record per request, ids as sent, timings the stub's
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    low, high = most_at_once
    assert low <= _most_overlapping(records) <= high
    assert _StubOpenAI.most_in_flight >= low  # the server saw them at once too
    assert sorted(r["id"] for r in records) == sorted(f"lt-{i}" for i in range(1, 21))
    assert all(r["ok"] and r["ttft_ms"] >= FIRST_S * 1000 and r["output_tokens"] == 5 for r in records)
