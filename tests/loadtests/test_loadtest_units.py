"""Fast checks of the load-test building blocks, the in-cluster manifest and the bench table."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from .lt_helpers import REPO

sys.path.insert(0, str(REPO))  # the repo's `loadtests` and `bench` packages

from bench.ladder import LevelResult  # noqa: E402
from bench.report import table, ttft_ratio_at  # noqa: E402
from loadtests.k8s import render  # noqa: E402
from loadtests.openai_load import slo  # noqa: E402
from loadtests.openai_load.profiles import get_profile  # noqa: E402
from loadtests.openai_load.samples import percentile  # noqa: E402
from loadtests.openai_load.server import Endpoints  # noqa: E402
from loadtests.openai_load.sse import consume_sse  # noqa: E402


def _clock(times: list[float]):  # type: ignore[no-untyped-def]
    it = iter(times)
    return lambda: next(it)


CHAT_STREAM = [
    b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n', b"\n",
    b": keep-alive comment\n",
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n', b"\n",
    b'data: {"choices":[{"delta":{"content":"bc"},"finish_reason":"length"}]}\n', b"\n",
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":4}}\n', b"\n",
    b"data: [DONE]\n",
]


def test_sse_timing_uses_text_chunks_and_usage() -> None:
    # one clock read per data event (role, a, bc, usage) and one at the end
    r = consume_sse(CHAT_STREAM, "chat", start=10.0, clock=_clock([10.05, 10.2, 10.5, 10.51, 10.6]))
    assert r.problem() is None
    assert r.ttft_s == pytest.approx(0.2)  # the role-only chunk is not a token
    assert r.output_tokens == 4 and r.usage_prompt_tokens == 12 and r.text_chunks == 2
    assert r.itl_s == pytest.approx((0.5 - 0.2) / 3)
    assert r.e2e_s == pytest.approx(0.6)
    assert r.finish_reason == "length"
    assert r.output_tokens_per_s == pytest.approx(4 / 0.6)


def test_sse_problems() -> None:
    no_done = consume_sse(CHAT_STREAM[:4], "chat", 0.0, clock=_clock([1, 2, 3]))
    assert no_done.problem() == "stream ended without data: [DONE]"
    err = consume_sse([b'data: {"error":{"message":"engine died"}}\n'], "chat", 0.0, clock=_clock([1]))
    assert err.problem() == "server error in stream: engine died"
    empty = consume_sse([b"data: [DONE]\n"], "completions", 0.0, clock=_clock([1]))
    assert empty.problem() == "stream carried no generated text"
    bad = consume_sse([b"data: {not json\n"], "chat", 0.0, clock=_clock([1]))
    assert bad.problem() is not None and bad.problem().startswith("malformed SSE data")
    # completions stream, no usage: tokens are counted as text chunks
    comp = consume_sse([b'data: {"choices":[{"text":"x"}]}\n', b'data: {"choices":[{"text":"y"}]}\n',
                        b"data: [DONE]\n"], "completions", 0.0, clock=_clock([1, 3, 4]))
    assert comp.problem() is None and comp.output_tokens == 2 and comp.itl_s == 2


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_slo_verdicts() -> None:
    th = slo.Thresholds(ttft_p95_ms=500, itl_p95_ms=50, error_rate=0.01)
    ok = slo.Observed(requests=100, error_rate=0.0, ttft_p95_ms=400, itl_p95_ms=20, e2e_p95_ms=3000)
    assert slo.exit_code(slo.evaluate(th, ok)) == slo.EXIT_PASS
    slow = slo.Observed(requests=100, error_rate=0.02, ttft_p95_ms=400, itl_p95_ms=60, e2e_p95_ms=3000)
    failed = [c.name for c in slo.evaluate(th, slow) if not c.passed]
    assert failed == ["itl_p95_ms <=", "error_rate <="]
    assert slo.exit_code(slo.evaluate(th, slow)) == slo.EXIT_SLO_FAILED == 3
    # no samples at all is a failure, not a pass
    none = slo.Observed(requests=0, error_rate=math.nan, ttft_p95_ms=math.nan, itl_p95_ms=math.nan,
                        e2e_p95_ms=math.nan)
    assert all(not c.passed for c in slo.evaluate(th, none))
    assert not slo.Thresholds().enabled and th.enabled
    with pytest.raises(ValueError, match="fraction"):
        slo.Thresholds(error_rate=5)


@pytest.mark.parametrize("host, root, prefix", [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000", "/v1"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000", "/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000", ""),
    ("https://gw.example/llm/v1/", "https://gw.example/llm", ""),
])
def test_endpoints_from_host(host: str, root: str, prefix: str) -> None:
    ep = Endpoints.from_host(host)
    assert (ep.root, ep.api_prefix) == (root, prefix)
    assert ep.path("chat").endswith("/chat/completions") and ep.v1 == root + "/v1"


def test_endpoints_reject_bad_hosts() -> None:
    for bad in ("", "127.0.0.1:8000", "ftp://x"):
        with pytest.raises(ValueError):
            Endpoints.from_host(bad)


def test_profiles_ratios_and_clamp() -> None:
    chat, summ = get_profile("chat"), get_profile("summarize")
    assert chat.input_tokens == chat.output_tokens
    assert summ.input_tokens / summ.output_tokens == 20
    long = get_profile("long_context").clamp_to(2048)
    assert long.input_tokens + long.output_tokens <= 2048
    assert chat.with_sizes(64, 0).input_tokens == 64 and chat.with_sizes(64, 0).output_tokens == 512
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("nope")


# ----------------------------------------------------------------------------------------------
# in-cluster manifest


def _rendered(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "loadtests.k8s.render", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_k8s_mounted_files_run_as_they_do_in_a_checkout(tmp_path: Path) -> None:
    """The ConfigMap's files, laid out as the pod mounts them, load in Locust with nothing else on the
    path (one package name, `loadtests.openai_load`, in the pod and here)."""
    cm, job = _rendered("--release", "llm")
    mount = tmp_path / "mnt"
    for item in job["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]:
        (mount / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (mount / item["path"]).write_text(cm["data"][item["key"]])
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    locustfile = args[args.index("-f") + 1].replace(render.MOUNT, str(mount))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-m", "locust", "-f", locustfile, "--list"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "OpenAIUser" in run.stdout


def test_k8s_manifest_carries_the_locustfile_and_targets_the_serve_service() -> None:
    cm, job = _rendered("--release", "llm", "--namespace", "serving", "--users", "16", "--run-time", "10m",
                        "--slo-ttft-p95-ms", "2000", "--slo-error-rate", "0.01", "--api-key-secret", "llm-key",
                        "--", "--processes", "2")
    assert (cm["kind"], job["kind"]) == ("ConfigMap", "Job")
    # every source file, byte for byte, mounted at its relative path
    items = job["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    paths = {i["path"] for i in items}
    assert paths == {"loadtests/__init__.py", "loadtests/locustfile.py",
                     *(f"loadtests/openai_load/{p.name}" for p in (REPO / "loadtests/openai_load").glob("*.py"))}
    for i in items:
        assert cm["data"][i["key"]] == (REPO / i["path"]).read_text()
    c = job["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    assert args[args.index("-H") + 1] == "http://llm-serve-svc:8000"
    assert args[args.index("-u") + 1] == "16" and args[args.index("-t") + 1] == "10m"
    assert "--headless" in args and args[-2:] == ["--processes", "2"]
    assert args[args.index("--slo-error-rate") + 1] == "0.01"
    env = {e["name"]: e for e in c["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "llm-key", "key": "api-key"}
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 600 + 600
    assert job["metadata"]["namespace"] == cm["metadata"]["namespace"] == "serving"


def test_k8s_manifest_is_valid_for_kubernetes() -> None:
    cache = Path(os.environ.get("RLD_CACHE", Path.home() / ".cache" / "ray-llm-disagg"))
    tool = cache / "bin" / "kubeconform"
    schemas = sorted(cache.glob("schemas/k8s-v*"))
    assert tool.exists() and schemas, "kubeconform and its schemas come from hack/toolchain.sh"
    manifest = subprocess.run([sys.executable, "-m", "loadtests.k8s.render"], cwd=REPO, capture_output=True,
                              text=True, check=True, timeout=60).stdout
    p = subprocess.run([str(tool), "-strict", "-summary", "-schema-location",
                        f"{schemas[-1]}/{{{{.ResourceKind}}}}{{{{.KindSuffix}}}}.json", "-"],
                       input=manifest, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Valid: 2, Invalid: 0, Errors: 0" in p.stdout


def test_k8s_render_rejects_bad_input() -> None:
    p = subprocess.run([sys.executable, "-m", "loadtests.k8s.render", "--run-time", "ten minutes"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--run-time" in p.stderr


# ----------------------------------------------------------------------------------------------
# bench table


def _level(mode: str, c: int, ttft: float, tps: float) -> LevelResult:
    m = {k: {"p50": v, "p95": v * 2} for k, v in (("TTFT", ttft), ("ITL", 5.0), ("E2E", 500.0))}
    summary = {"metrics": m, "requests_per_s": 2.0, "output_tokens_per_s": tps, "error_rate": 0.0,
               "requests": 10, "tokens_per_chunk": {"mean": 1.0}}
    return LevelResult(mode, c, summary, Path("x.html"), Path("x"), 0, (0.0, 0.0, 0.0))


def test_bench_table_ratios_to_direct_vllm() -> None:
    rs = [_level("vllm", 1, 40.0, 100.0), _level("aggregated", 1, 50.0, 90.0), _level("vllm", 2, 80.0, 180.0)]
    md = table(rs).splitlines()
    assert md[0].startswith("| mode | users | TTFT p50 ms")
    agg = next(line for line in md if line.startswith("| aggregated | 1 "))
    assert "50.0 (1.25x)" in agg and "90 (0.90x)" in agg
    vllm = next(line for line in md if line.startswith("| vllm | 1 "))
    assert "(" not in vllm  # the baseline has no ratios
    assert ttft_ratio_at(rs, "aggregated", 1) == 1.25
    assert math.isnan(ttft_ratio_at(rs, "aggregated", 2))
