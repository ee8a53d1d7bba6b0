"""The locustfile against a real server (our app, aggregated, by default; see conftest.py).

Each run is headless, a few seconds long and capped in requests, on 127.0.0.1 only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from .lt_helpers import LocustRun, Server, run_locust

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

INPUT_TOKENS = 64
OUTPUT_TOKENS = 16


def _f(row: dict[str, str], col: str) -> float:
    return float(row[col])


PCTS = ("50%", "66%", "75%", "80%", "90%", "95%", "98%", "99%", "100%")


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_headless_run_records_sane_custom_metrics(llm_server: Server, tmp_path: Path, api: str) -> None:
    run = run_locust(llm_server.base_url, tmp_path, "--api", api, "--input-tokens", str(INPUT_TOKENS),
                     "--output-tokens", str(OUTPUT_TOKENS), users=2, run_time_s=90, max_requests=10,
                     api_key=llm_server.api_key)
    assert run.returncode == 0, run.output[-3000:]
    stats = run.stats
    post, ttft, itl, e2e, tps = (stats.get((t, api)) for t in ("POST", "TTFT", "ITL", "E2E", "TOKENS_PER_S"))
    for name, row in (("POST", post), ("TTFT", ttft), ("ITL", itl), ("E2E", e2e), ("TOKENS_PER_S", tps)):
        assert row is not None, f"no {name} {api} row in {run.prefix}_stats.csv: {sorted(stats)}"
    n = int(post["Request Count"])
    assert n >= 4, f"only {n} requests in 10 s"
    assert int(post["Failure Count"]) == 0, run.output[-2000:]
    # one TTFT/ITL/E2E/TOKENS_PER_S sample per successful request
    for row in (ttft, itl, e2e, tps):
        assert int(row["Request Count"]) == n and int(row["Failure Count"]) == 0

    # TTFT <= E2E for every request, so for every order statistic too
    assert 0 < _f(ttft, "Min Response Time") <= _f(e2e, "Min Response Time")
    assert _f(ttft, "Average Response Time") < _f(e2e, "Average Response Time")
    for p in PCTS:
        assert _f(ttft, p) <= _f(e2e, p), f"TTFT {p} > E2E {p}"
    # ITL: positive, and (n-1) gaps fit in the time after the first token
    assert _f(itl, "Average Response Time") > 0 and _f(itl, "Max Response Time") > 0
    assert _f(itl, "Average Response Time") * (OUTPUT_TOKENS - 1) <= (
        _f(e2e, "Average Response Time") - _f(ttft, "Average Response Time") + 1.0)

    # token counts: every request produced exactly max_tokens (ignore_eos) ...
    for row in (post, e2e, itl, tps):
        assert _f(row, "Average Content Size") == OUTPUT_TOKENS
    # ... and its prompt had exactly the target size (exact calibration: /tokenize or usage)
    s = run.summary
    assert s["calibration"].split(":")[0] in ("tokenize-exact", "usage-exact"), s["calibration"]
    assert _f(ttft, "Average Content Size") == INPUT_TOKENS
    assert s["prompt_tokens"]["min"] == s["prompt_tokens"]["max"] == INPUT_TOKENS
    assert s["output_tokens"] == s["ok"] * OUTPUT_TOKENS and s["ok"] == n and s["failed"] == 0

    # tokens/s of the slowest request = OUTPUT_TOKENS / its E2E
    slowest = OUTPUT_TOKENS / (_f(e2e, "Max Response Time") / 1000)
    assert _f(tps, "Min Response Time") == pytest.approx(slowest, rel=1e-6)

    # exact percentiles in the summary agree with Locust's rounded ones
    assert s["metrics"]["TTFT"]["count"] == n
    assert s["metrics"]["TTFT"]["max"] == pytest.approx(_f(ttft, "Max Response Time"), rel=1e-9)

    html = run.html
    for kind in ("TTFT", "ITL", "E2E", "TOKENS_PER_S"):
        assert kind in html, f"{kind} missing from the HTML report"


def _slo_run(server: Server, tmp_path: Path, *slo: str) -> LocustRun:
    return run_locust(server.base_url, tmp_path, "--input-tokens", "48", "--output-tokens", "8", *slo,
                      users=1, run_time_s=90, max_requests=4, api_key=server.api_key)


def test_slo_that_must_pass_exits_0(llm_server: Server, tmp_path: Path) -> None:
    run = _slo_run(llm_server, tmp_path, "--slo-ttft-p95-ms", "60000", "--slo-itl-p95-ms", "10000",
                   "--slo-e2e-p95-ms", "120000", "--slo-error-rate", "0")
    assert run.returncode == 0, run.output[-3000:]
    assert "SLO PASSED" in run.output
    s = run.summary
    assert s["slo_passed"] is True
    assert {c["name"] for c in s["slo"]} == {"requests >=", "ttft_p95_ms <=", "itl_p95_ms <=",
                                             "e2e_p95_ms <=", "error_rate <="}
    assert all(c["passed"] for c in s["slo"])


def test_latency_slo_that_must_fail_exits_3(llm_server: Server, tmp_path: Path) -> None:
    run = _slo_run(llm_server, tmp_path, "--slo-ttft-p95-ms", "0.01", "--slo-error-rate", "0")
    assert run.returncode == 3, run.output[-3000:]
    assert "SLO FAILED" in run.output and "[FAIL] ttft_p95_ms" in run.output
    assert "[PASS] error_rate" in run.output  # only the latency check failed
    failed = [c for c in run.summary["slo"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["ttft_p95_ms <="]
    assert failed[0]["value"] > 0.01


def test_error_rate_slo_fails_on_real_errors(llm_server: Server, tmp_path: Path) -> None:
    # temperature -1 is rejected by the server (HTTP 400) on every request
    run = _slo_run(llm_server, tmp_path, "--temperature", "-1", "--slo-error-rate", "0.5")
    assert run.returncode == 3, run.output[-3000:]
    post = run.stats[("POST", "chat")]
    assert int(post["Failure Count"]) == int(post["Request Count"]) > 0
    assert ("TTFT", "chat") not in run.stats  # no custom metric for failed requests
    assert run.summary["error_rate"] == 1.0
    assert "400" in Path(f"{run.prefix}_failures.csv").read_text()
