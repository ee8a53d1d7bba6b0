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


def test_mixed_workload_is_a_weighted_blend_of_plain_ones() -> None:
    parts = pd.workload_parts("mixed", pd.WORKLOADS, pd.MIXES)
    assert [(p.name, p.sizes, p.share) for p in parts] == [("1k-1k", (1024, 1024), 0.75), ("4k-256", (4096, 256), 0.25)]
    assert pd.workload_parts("4k-256", pd.WORKLOADS, pd.MIXES) == [pd.Part("4k-256", (4096, 256), 1.0)]
    for mixes, table in ((pd.MIXES, pd.WORKLOADS), (pd.CPU_MIXES, pd.CPU_WORKLOADS)):
        for name in mixes:
            assert name not in table and abs(sum(p.share for p in pd.workload_parts(name, table, mixes)) - 1) < 1e-12


def test_step_clients_split_the_rate_and_never_reuse_a_plain_steps_prompts() -> None:
    plain = pd.step_clients(0, "1k-1k", pd.workload_parts("1k-1k", pd.WORKLOADS, pd.MIXES), 8.0, 1, 4)
    assert [c.seed for c in plain] == [pd.step_seed(0, "1k-1k", 8.0, j) for j in range(4)]  # as before mixes
    assert [c.suffix for c in plain] == ["0-0", "0-1", "0-2", "0-3"] and all(c.rate_rps == 2.0 for c in plain)
    mixed = pd.step_clients(0, "mixed", pd.workload_parts("mixed", pd.WORKLOADS, pd.MIXES), 8.0, 2, 4)
    assert len(mixed) == 16 and abs(sum(c.rate_rps for c in mixed) - 8.0) < 1e-12
    assert sum(c.rate_rps for c in mixed if c.part == "1k-1k") == 6.0
    assert {c.sizes for c in mixed if c.part == "4k-256"} == {(4096, 256)}
    assert len({c.suffix for c in mixed}) == 16 and {c.server for c in mixed} == {0, 1}
    plain_seeds = {pd.step_seed(0, w, 8.0, j) for w in pd.WORKLOADS for j in range(4)}
    assert not plain_seeds & {c.seed for c in mixed}
    assert len({(c.part, c.seed) for c in mixed}) == 8  # the servers' clients j share seeds, as plain steps' do


def test_measure_parts_measures_each_part_over_the_steps_window() -> None:
    def rec(i: int, part: str, start: float, tpot: float):
        return {"id": f"r-{i}", "ok": True, "start": start, "end": start + 5, "ttft_ms": 100.0, "itl_ms": tpot,
                "gaps": None, "part": part}

    records = [rec(i, "1k-1k", 100.0 + i, 20.0) for i in range(10)] + [rec(10 + i, "4k-256", 102.0 + 2 * i, 60.0)
                                                                        for i in range(4)]
    parts = pd.workload_parts("mixed", pd.WORKLOADS, pd.MIXES)
    step = pd.measure(records, workload="mixed", mode="vllm", rate=2.0, gpus=1, duration=10, slo_ttft_ms=2000,
                      slo_tpot_ms=50, traces={})
    got = pd.measure_parts(records, step, 10, 2000, 50, parts)
    assert got["1k-1k"]["ok"] == 10 and got["1k-1k"]["tpot_p50_ms"] == 20.0 and got["1k-1k"]["goodput_rps"] == round(10 / 9, 3)
    assert got["4k-256"]["ok"] == 4 and got["4k-256"]["goodput_rps"] == 0.0  # misses the TPOT SLO
    assert got["4k-256"]["achieved_rps"] == round(4 / 8, 3)  # from the step's first arrival (100 s), not its own (102 s)
    assert pd.measure_parts(records, step, 10, 2000, 50, parts[:1]) is None


def test_mixed_summary_compares_each_part_with_vllm(tmp_path) -> None:
    a = pd.parse_args(["--modes", "vllm,aggregated", "--workloads", "1k-1k,mixed", "--rates", "8", "--out", str(tmp_path)])
    assert list(a.workload_parts) == ["1k-1k", "mixed"] and list(a.workload_sizes) == ["1k-1k"]

    def step(mode: str, workload: str, tpot: float, parts=None) -> pd.Step:
        return pd.Step(workload, mode, 8.0, 1, 480, 480, 8.0, 8.0, 100.0, 200.0, tpot, tpot, 0.0, parts=parts)

    part = {"share": 0.75, "requests": 360, "ok": 360, "achieved_rps": 6.0, "goodput_rps": 6.0, "ttft_p50_ms": 90.0,
            "ttft_p95_ms": 150.0, "tpot_p50_ms": 10.0, "tpot_p95_ms": 12.0}
    steps = [step("vllm", "1k-1k", 10.0), step("vllm", "mixed", 12.0, {"1k-1k": part}),
             step("aggregated", "1k-1k", 10.2), step("aggregated", "mixed", 12.0, {"1k-1k": {**part, "tpot_p50_ms": 11.0}})]
    summary = pd.summarize(steps, a, "test", 1)
    assert summary["workloads"]["mixed"]["parts"]["4k-256"] == {"input_tokens": 4096, "output_tokens": 256, "share": 0.25}
    assert summary["ttft_p50_ms"]["vllm"] == {"1024": 100.0}
    row = next(r for r in summary["goodput"] if r["mode"] == "aggregated" and r["workload"] == "mixed")
    assert row["meets_bar"] and row["parts"]["1k-1k"]["tpot_p50_x_vllm"] == 1.1
    assert "1k-1k (75%) 90 / 11.0, goodput 6.00, x1.10" in pd.table(summary)
