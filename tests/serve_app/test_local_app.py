"""End to end against the real local stack (Ray + vLLM CPU + NIXL on loopback), via the official openai client."""

from __future__ import annotations

import json
import random
import time
import uuid

import httpx
import openai
import pytest
from openai import OpenAI
from .serve_helpers import Series, engine_core_of, label_values, scrape, settled, total, wait_until

from serve_app.telemetry import hops
from devstack.serve_config import MAX_MODEL_LEN, MODEL_ID, REMOTE_PREFILL_MIN_TOKENS
from devstack.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WORDS = "the quick brown fox jumps over lazy dog model token cache request server hello world".split()


def long_prompt(words: int = 500) -> str:
    """A fresh prompt (no prefix-cache hit anywhere) of roughly `words` tokens, well over the threshold."""
    rng = random.Random(uuid.uuid4().int)
    return " ".join(rng.choice(WORDS) for _ in range(words))


class DecodeEngine:
    """The P/D decode replica's metrics on the decode node, told apart from the aggregated engine there."""

    def __init__(self, stack: LocalStack) -> None:
        self.url = stack.cluster.metrics_url("decode")
        series = scrape(self.url)
        workers = label_values(
            series, "ray_rld_requests_total", "WorkerId", role="decode", mode="disaggregated"
        )
        assert len(workers) == 1, f"expected one disaggregated decode replica, found workers {workers}"
        self.worker = workers.pop()

    def snapshot(self) -> Series:
        return scrape(self.url)

    def settled(self) -> Series:
        return settled(self.url)

    def value(self, series: Series, name: str, **labels: str) -> float:
        return total(series, name, WorkerId=self.worker, **labels)


@pytest.fixture(scope="module")
def decode_engine(stack: LocalStack) -> DecodeEngine:
    return DecodeEngine(stack)


def test_models_endpoint_lists_the_model(disagg: OpenAI, agg: OpenAI) -> None:
    assert [m.id for m in disagg.models.list().data] == [MODEL_ID]
    assert [m.id for m in agg.models.list().data] == [MODEL_ID]


def test_health_endpoint_reports_engines_healthy(http: httpx.Client) -> None:
    for prefix, roles in (("", {"prefill": "ok", "decode": "ok"}), ("/agg", {"decode": "ok"})):
        response = http.get(f"{prefix}/health")
        assert response.status_code == 200, response.text
        assert response.json() == {"status": "ok", "models": [MODEL_ID], "roles": roles}


@pytest.mark.parametrize("prompt_words", [3, 300], ids=["local-path", "remote-path"])
def test_chat_and_completions_stream_and_not(disagg: OpenAI, prompt_words: int) -> None:
    prompt = long_prompt(prompt_words)
    chat = disagg.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0
    )
    # The tiny model's weights are random: its 8 tokens may all be special ones that detokenize to "",
    # so the test checks the tokens were generated, not that they spell something.
    assert isinstance(chat.choices[0].message.content, str) and chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 8

    # ignore_eos: the random weights may pick EOS within 8 tokens (the 3-word completion prompt did on vLLM 0.29)
    completion = disagg.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert isinstance(completion.choices[0].text, str) and completion.usage.completion_tokens == 8

    chunks = list(
        disagg.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=8, temperature=0, stream=True
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content  # greedy: streaming changes nothing
    assert chunks[-1].choices[0].finish_reason == "length"

    pieces = list(disagg.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=8, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in pieces) == completion.choices[0].text


def test_remote_prefill_moves_the_kv_instead_of_recomputing(
    disagg: OpenAI, decode_engine: DecodeEngine
) -> None:
    before = decode_engine.settled()
    stream = disagg.completions.create(
        model=MODEL_ID,
        prompt=long_prompt(600),
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage][-1]
    prompt_tokens = usage.prompt_tokens
    assert prompt_tokens > REMOTE_PREFILL_MIN_TOKENS

    def handoffs(series: Series) -> float:
        return decode_engine.value(series, "ray_rld_kv_handoff_seconds_count", path="remote")

    wait_until("the request's metrics to be exported", lambda: handoffs(decode_engine.snapshot()) > handoffs(before))
    after = decode_engine.settled()

    def delta(name: str, **labels: str) -> float:
        return decode_engine.value(after, name, **labels) - decode_engine.value(before, name, **labels)

    transferred = delta("ray_vllm_prompt_tokens_by_source_total", source="external_kv_transfer")
    recomputed = delta("ray_vllm_prompt_tokens_by_source_total", source="local_compute")
    print(
        f"KV evidence: prompt_tokens={prompt_tokens} decode external_kv_transfer=+{transferred:.0f} "
        f"local_compute=+{recomputed:.0f} nixl_bytes=+{delta('ray_vllm_nixl_bytes_transferred_sum'):.0f} "
        f"nixl_xfers=+{delta('ray_vllm_nixl_xfer_time_seconds_count'):.0f} "
        f"handed_off(rld)=+{delta('ray_rld_prompt_tokens_total', path='remote'):.0f}"
    )
    # Decode got (almost) the whole prompt from prefill's KV and computed (almost) none of it itself.
    assert transferred >= 0.95 * prompt_tokens, (transferred, prompt_tokens)
    assert recomputed <= 0.05 * prompt_tokens, (recomputed, prompt_tokens)
    assert delta("ray_vllm_nixl_xfer_time_seconds_count") >= 1
    assert delta("ray_vllm_nixl_bytes_transferred_sum") > 0
    # Our own accounting agrees: prefill handed off the prompt, one remote request, timings recorded.
    assert delta("ray_rld_prompt_tokens_total", path="remote") == prompt_tokens
    assert delta("ray_rld_requests_total", path="remote") == 1
    assert delta("ray_rld_prefill_seconds_count", path="remote") == 1
    assert delta("ray_rld_kv_handoff_seconds_count", path="remote") == 1
    assert delta("ray_rld_time_to_first_token_seconds_count", path="remote") == 1


def test_short_prompts_are_prefilled_locally_on_decode(
    stack: LocalStack, disagg: OpenAI, decode_engine: DecodeEngine
) -> None:
    prefill_url = stack.cluster.metrics_url("prefill")
    before, prefill_before = decode_engine.settled(), settled(prefill_url)
    reply = disagg.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0
    )
    assert reply.usage.prompt_tokens < REMOTE_PREFILL_MIN_TOKENS

    def local_requests(series: Series) -> float:
        return decode_engine.value(series, "ray_rld_request_seconds_count", path="local")

    wait_until("the local-path request to be exported", lambda: local_requests(decode_engine.snapshot()) > local_requests(before))
    after, prefill_after = decode_engine.settled(), settled(prefill_url)

    def delta(name: str, **labels: str) -> float:
        return decode_engine.value(after, name, **labels) - decode_engine.value(before, name, **labels)

    assert delta("ray_rld_requests_total", path="local") == 1
    assert delta("ray_rld_requests_total", path="remote") == 0
    assert delta("ray_rld_prompt_tokens_total", path="local") == reply.usage.prompt_tokens
    assert delta("ray_vllm_prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    prefill_requests = "ray_rld_requests_total"
    assert total(prefill_after, prefill_requests, role="prefill") == total(prefill_before, prefill_requests, role="prefill")


@pytest.mark.parametrize("prompt_words", [4, 400], ids=["local-path", "remote-path"])
def test_greedy_output_is_the_same_disaggregated_and_aggregated(disagg: OpenAI, agg: OpenAI, prompt_words: int) -> None:
    prompt = long_prompt(prompt_words)
    outputs = [
        client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
        for client in (disagg, agg)
    ]
    assert outputs[0] == outputs[1]
    chats = [
        client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=24, temperature=0
        ).choices[0].message.content
        for client in (disagg, agg)
    ]
    assert chats[0] == chats[1]


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"] and error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("prefix", ["", "/agg"], ids=["disagg", "agg"])
def test_bad_requests_get_openai_errors_and_the_app_keeps_serving(http: httpx.Client, prefix: str) -> None:
    url = f"{prefix}/v1/completions"
    error = assert_openai_error(http.post(url, json={"model": "no-such-model", "prompt": "hi"}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"

    error = assert_openai_error(
        http.post(url, content=b'{"model": "tiny", "prompt": ', headers={"Content-Type": "application/json"}), 400
    )
    assert error["code"] == "invalid_json"

    error = assert_openai_error(http.post(url, json={"model": MODEL_ID, "prompt": "hi", "max_tokens": -3}), 400)
    assert "max_tokens" in error["message"]

    too_long = " ".join(["fox"] * (MAX_MODEL_LEN + 500))
    error = assert_openai_error(http.post(url, json={"model": MODEL_ID, "prompt": too_long, "max_tokens": 4}), 400)
    assert error["code"] == "context_length_exceeded"

    chat_error = http.post(
        f"{prefix}/v1/chat/completions",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": too_long}], "max_tokens": 4, "stream": True},
    )
    assert_openai_error(chat_error, 400)

    ok = http.post(url, json={"model": MODEL_ID, "prompt": long_prompt(100), "max_tokens": 4})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]


def test_openai_client_raises_its_typed_errors(disagg: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        disagg.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        disagg.completions.create(model=MODEL_ID, prompt="hi", max_tokens=-1)


@pytest.mark.parametrize(("app", "path"), [("", "remote"), ("/agg", "local")], ids=["disaggregated", "aggregated"])
def test_a_streamed_request_leaves_a_per_hop_trace_and_hop_metrics(
    stack: LocalStack, http: httpx.Client, app: str, path: str
) -> None:
    request_id = f"hop-trace-{uuid.uuid4()}"
    body = {"model": MODEL_ID, "prompt": long_prompt(300), "max_tokens": 4, "stream": True, "temperature": 0}
    with http.stream("POST", f"{app}/v1/completions", json=body,
                     headers={"x-request-id": request_id, "x-rld-trace": "1"}) as r:
        assert r.status_code == 200
        lines = list(r.iter_lines())
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and all("ReplicaStamps" not in e for e in events)
    # asked for, the record came in the stream too, after the first chunk, as an SSE comment
    in_stream = [json.loads(line[len(": rld-trace "):]) for line in lines if line.startswith(": rld-trace ")]
    assert len(in_stream) == 1 and in_stream[0]["request_id"] == request_id and in_stream[0]["path"] == path

    logs = stack.cluster.temp_dir / "session_latest" / "logs"
    wait_until("the frontend's trace line", lambda: request_id in hops.read_traces(logs), timeout_s=30, every_s=1)
    trace = hops.read_traces(logs)[request_id]
    assert trace["path"] == path and trace["model"] == MODEL_ID
    if path == "remote":  # the tokens prefill handed off
        assert trace["prompt_tokens"] > 250
    stamps = trace["t_ms"]
    expected = ["ingress_received", "ingress_dispatched", "replica_received"]
    expected += ["prefill_sent", "prefill_returned"] if path == "remote" else []
    expected += ["engine_called", "engine_first_chunk", "replica_first_out", "ingress_first_in", "ingress_first_out"]
    assert list(stamps) == expected, "stamps missing or out of order"
    segments = trace["segments_ms"]
    assert sum(segments[s] for s in hops.PATH_SEGMENTS[path]) == pytest.approx(segments["ingress_total"], abs=0.05)

    urls = [stack.cluster.metrics_url(n.name) for n in stack.cluster.nodes]  # the frontend runs on any of them
    wait_until(
        "ray_rld_hop_seconds for the engine segment",
        lambda: any(total(scrape(u), "ray_rld_hop_seconds_count", hop="engine", path=path) > 0 for u in urls),
        timeout_s=60,
    )


def test_zz_dead_engine_answers_503_instead_of_hanging(stack: LocalStack, http: httpx.Client) -> None:
    """Runs last (it breaks the aggregated app): kill its engine process, the client must get a quick error."""
    engine_core_of(stack, "ServeReplica:agg:Aggregated:tiny").kill()
    started = time.monotonic()
    response = http.post("/agg/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 4})
    elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    # engine_unavailable when the replica already saw its engine dead; engine_failed_on_request when the request
    # reached the engine before its death was noticed (the kill and the request race; both are a quick 503)
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] in {"engine_unavailable", "engine_failed_on_request"}, error
    assert elapsed < 150, f"took {elapsed:.0f} s"  # bounded by timeouts.first_token_s (120 s) at worst
    print(f"dead engine: HTTP {response.status_code} after {elapsed:.1f} s: {error['message'][:200]}")
    health = http.get("/agg/health")
    assert health.status_code == 503, health.text
    # The disaggregated app is unaffected.
    assert http.post("/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 2}).status_code == 200
