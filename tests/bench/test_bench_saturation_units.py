"""The saturation ladder's pieces that run without a GPU: per-step statistics, client CPU, profile summaries."""

from __future__ import annotations

import math

from bench.gpu import pd
from bench.gpu.procprof import client_cpu_stats, label, summarize_collapsed
from loadtests.openai_load.sse import bin_value_ms, consume_sse, gap_bin, hist_percentile


def test_gap_bins_are_fine_below_100_ms_and_coarse_above() -> None:
    assert gap_bin(0.0) == 0 and gap_bin(0.49) == 0 and gap_bin(0.5) == 1
    assert gap_bin(35.2) == 70 and abs(bin_value_ms(70) - 35.25) < 1e-9
    assert gap_bin(100) == 200 and gap_bin(104.9) == 200 and gap_bin(105) == 201
    assert gap_bin(10_000) == gap_bin(99_999) == 580  # one bin for everything past ~2 s
    for ms in (0.2, 3.3, 47.0, 99.9, 150.0, 1999.0):
        assert abs(bin_value_ms(gap_bin(ms)) - ms) <= (0.25 if ms < 100 else 2.5)


def test_hist_percentile() -> None:
    assert math.isnan(hist_percentile({}, 50))
    hist = {gap_bin(0.1): 90, gap_bin(50): 10}  # 90 gaps of ~0 (coalesced chunks), 10 of 50 ms
    assert hist_percentile(hist, 50) == bin_value_ms(gap_bin(0.1))
    assert hist_percentile(hist, 95) == bin_value_ms(gap_bin(50))


def test_consume_sse_bins_the_gaps_between_text_chunks() -> None:
    times = iter([0.0, 0.010, 0.010, 0.5, 0.6])  # clock() per data line: 3 text chunks, then usage
    lines = [b'data: {"choices":[{"text":"a"}]}\n', b'data: {"choices":[{"text":"b"}]}\n',
             b'data: {"choices":[{"text":"c"}]}\n',
             b'data: {"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":5}}\n', b"data: [DONE]\n"]
    r = consume_sse(lines, "completions", 0.0, clock=lambda: next(times))
    assert r.text_chunks == 3 and r.output_tokens == 3
    assert r.gap_hist == {gap_bin(10.0): 1, gap_bin(0.0): 1}  # 0 -> 10 ms, then 10 -> 10 ms (coalesced)


def test_max_in_flight_counts_overlapping_requests() -> None:
    records = [{"start": 0, "end": 10}, {"start": 1, "end": 2}, {"start": 2, "end": 3}, {"start": 5, "end": 6}]
    assert pd.max_in_flight(records) == 2  # a request ending when another starts does not overlap it
    assert pd.max_in_flight([]) == 0


def test_median_ci95_brackets_the_median() -> None:
    values = [float(v) for v in range(100)]
    lo, hi = pd.median_ci95(values)
    assert lo <= 49.5 <= hi and hi - lo < 30
    assert pd.median_ci95([1.0] * 5) is None


def test_step_seeds_differ_per_client_and_step_but_not_per_mode() -> None:
    seeds = {pd.step_seed(0, w, r, c) for w in ("1k-1k", "4k-256") for r in (8.0, 16.0) for c in range(4)}
    assert len(seeds) == 16
    assert pd.step_seed(0, "1k-1k", 8.0, 1) == pd.step_seed(0, "1k-1k", 8.0, 1)


def test_measure_counts_client_refusals_and_pools_gaps() -> None:
    def rec(i: int, ok: bool = True, **kw):
        return {"id": f"r-{i}", "ok": ok, "start": 100.0 + i, "end": 110.0 + i, "ttft_ms": 100.0 if ok else None,
                "itl_ms": 20.0 if ok else None, "gaps": {str(gap_bin(20.0)): 9} if ok else None, **kw}

    records = [rec(i) for i in range(8)] + [
        {"id": None, "ok": False, "start": 103.0, "end": 103.0, "ttft_ms": None, "itl_ms": None, "client_saturated": True},
        rec(100)]  # started after the 10 s window: not counted
    step = pd.measure(records, workload="1k-1k", mode="vllm", rate=1.0, gpus=1, duration=10, slo_ttft_ms=2000,
                      slo_tpot_ms=50, traces={})
    assert step.requests == 9 and step.ok == 8 and step.client_refused == 1
    assert abs(step.goodput_rps - 8 / 7) < 1e-9  # per second of the arrival window covered (100 .. 107 s)
    assert abs(step.error_rate - 1 / 9) < 1e-9
    assert step.itl_p50_ms == bin_value_ms(gap_bin(20.0))
    assert step.max_in_flight == 8  # a refused request was never in flight; the late one overlaps none


def test_versus_vllm_applies_the_issue_bar() -> None:
    base = {"tpot_p50_ms": 30.0, "goodput_rps": 20.0, "ttft_p50_ms": 100.0}
    ok = pd.versus_vllm({"tpot_p50_ms": 31.0, "goodput_rps": 19.5, "ttft_p50_ms": 110.0}, base)
    assert ok["meets_bar"] and ok["tpot_p50_x_vllm"] == 1.033
    slow = pd.versus_vllm({"tpot_p50_ms": 32.0, "goodput_rps": 20.0, "ttft_p50_ms": 110.0}, base)
    assert not slow["meets_bar"]
    starved = pd.versus_vllm({"tpot_p50_ms": 30.0, "goodput_rps": 18.0, "ttft_p50_ms": 100.0}, base)
    assert not starved["meets_bar"]
    assert pd.versus_vllm({"tpot_p50_ms": 1.0, "goodput_rps": 1.0, "ttft_p50_ms": 1.0}, None) == {}
    none_good = pd.versus_vllm({"tpot_p50_ms": 30.0, "goodput_rps": 0.0, "ttft_p50_ms": 100.0},
                               {**base, "goodput_rps": 0.0})
    assert none_good["goodput_x_vllm"] is None and none_good["meets_bar"] and "bar_note" in none_good


def test_process_labels() -> None:
    assert label("ray::ServeReplica:llm:LLMServer:m8b") == "replica:LLMServer"
    assert label("ray::ServeReplica:llm:OpenAiIngress") == "replica:OpenAiIngress"
    assert label("VLLM::EngineCore_DP0") == "engine_core"
    assert label("/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model m") == "api_server"
    assert label("/tmp/x/haproxy -f /tmp/cfg") == "haproxy"
    assert label("python3 some_other.py") is None


def test_summarize_collapsed() -> None:
    text = "\n".join([
        "main (a.py:1);handle (serve_app/frontend/ingress.py:10);dumps (json/encoder.py:5) 6",
        "main (a.py:1);process_outputs (vllm/v1/engine/output_processor.py:20) 3",
        "main (a.py:2) 1",
        "garbage line",
    ])
    s = summarize_collapsed(text)
    assert s["samples"] == 10
    assert s["self"][0] == ["dumps (json/encoder.py:5)", 0.6]
    assert dict(s["components"]) == {"json": 0.6, "vllm output processor": 0.3, "other": 0.1}
    inclusive = dict((f, v) for f, v in s["inclusive"])
    assert inclusive["main (a.py)"] == 1.0 and inclusive["handle (frontend/ingress.py)"] == 0.6


def test_client_cpu_stats() -> None:
    # two clients sampled each second for 10 s: one at 0.5 core, one at 1.0 core from t=5 on
    samples = [(float(t), [0.5 * t, max(0.0, t - 5.0)]) for t in range(11)]
    stats = client_cpu_stats(samples, window_s=5.0)
    assert stats["mean_cores_per_client"] == 0.5  # (0.5 + 0.5) / 2
    assert stats["max_cores_per_client"] == 1.0
    assert client_cpu_stats(samples[:1], 5.0)["max_cores_per_client"] is None
