"""`frontend.direct_streaming` (the default graph) end to end: the serving replica is the HTTP ingress and every
guard of the separate frontend still holds there (real Ray + HAProxy + vLLM CPU engines + NIXL on loopback)."""

from __future__ import annotations

import json
import random
import time
import uuid

import httpx
import pytest
import ray
from openai import OpenAI
from ray import serve

from serve_app.telemetry import hops
from devstack.serve_config import MAX_MODEL_LEN, MODEL_ID, REMOTE_PREFILL_MIN_TOKENS
from devstack.stack import LocalStack

from ..resilience.hostile_cases import hostile_requests_get_a_fast_4xx_while_a_stream_keeps_flowing
from ..serve_app.serve_helpers import authorized_client, engine_core_of, scrape, total, wait_until
from .conftest import API_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WORDS = "the quick brown fox jumps over lazy dog model token cache request server hello world".split()


def prompt(words: int) -> str:
    rng = random.Random(uuid.uuid4().int)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def client(stack: LocalStack, app: str) -> OpenAI:
    return OpenAI(base_url=stack.base_url(app), api_key=API_KEY, timeout=180, max_retries=0)


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    assert "Traceback" not in response.text
    return error


def test_the_serving_deployments_are_the_whole_app(stack: LocalStack) -> None:
    """No frontend deployment: decode (or the aggregated engine) is the ingress, nothing else is deployed."""
    ray.init(address=stack.cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        apps = serve.status().applications
        deployments = {name: set(apps[name].deployments) for name in ("direct", "agg")}
    finally:
        ray.shutdown()
    assert deployments == {"direct": {f"Prefill:{MODEL_ID}", f"Decode:{MODEL_ID}"}, "agg": {f"Aggregated:{MODEL_ID}"}}


def test_models_and_health(stack: LocalStack, http: httpx.Client) -> None:
    for app in ("direct", "agg"):
        assert [m.id for m in client(stack, app).models.list().data] == [MODEL_ID]
        assert client(stack, app).models.retrieve(MODEL_ID).id == MODEL_ID
    for prefix, roles in (("", {"prefill": "ok", "decode": "ok"}), ("/agg", {"decode": "ok"})):
        response = http.get(f"{prefix}/health")
        assert response.status_code == 200, response.text
        assert response.json() == {"status": "ok", "models": [MODEL_ID], "roles": roles}


@pytest.mark.parametrize(
    ("prefix", "words", "path"),
    [("", 300, "remote"), ("", 3, "local"), ("/agg", 300, "local")],
    ids=["disagg-remote-prefill", "disagg-local-prefill", "aggregated"],
)
def test_a_stream_is_served_and_traced(stack: LocalStack, http: httpx.Client, prefix: str, words: int, path: str) -> None:
    request_id = f"direct-{uuid.uuid4()}"
    body = {"model": MODEL_ID, "prompt": prompt(words), "max_tokens": 4, "stream": True, "temperature": 0}
    with http.stream("POST", f"{prefix}/v1/completions", json=body,
                     headers={"x-request-id": request_id, "x-rld-trace": "1"}) as r:
        assert r.status_code == 200 and r.headers["x-rld-backend"] == "cluster"
        lines = list(r.iter_lines())
    events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 2 and all("ReplicaStamps" not in e for e in events)
    records = [json.loads(line[len(": rld-trace "):]) for line in lines if line.startswith(": rld-trace ")]
    assert len(records) == 1 and records[0]["request_id"] == request_id and records[0]["path"] == path
    stamps = list(records[0]["t_ms"])
    assert ("prefill_sent" in stamps and "prefill_returned" in stamps) == (path == "remote"), stamps
    assert stamps[0] == "ingress_received" and stamps[-1] == "ingress_first_out"
    if path == "remote":
        assert records[0]["prompt_tokens"] >= REMOTE_PREFILL_MIN_TOKENS

    logs = stack.cluster.temp_dir / "session_latest" / "logs"  # and logged, for benchmarks to collect
    wait_until("the trace line", lambda: request_id in hops.read_traces(logs), timeout_s=30, every_s=1)
    assert hops.read_traces(logs)[request_id]["path"] == path

    reply = client(stack, "direct" if prefix == "" else "agg").completions.create(
        model=MODEL_ID, prompt=prompt(words), max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4


@pytest.mark.parametrize("words", [4, 400], ids=["local-prefill", "remote-prefill"])
def test_greedy_output_is_the_same_disaggregated_and_aggregated(stack: LocalStack, words: int) -> None:
    text = prompt(words)
    outputs = [client(stack, app).completions.create(model=MODEL_ID, prompt=text, max_tokens=16, temperature=0)
               .choices[0].text for app in ("direct", "agg")]
    assert outputs[0] == outputs[1]
    chats = [client(stack, app).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": text}], max_tokens=16, temperature=0,
    ).choices[0].message.content for app in ("direct", "agg")]
    assert chats[0] == chats[1]


@pytest.mark.parametrize("prefix", ["", "/agg"], ids=["disagg", "agg"])
def test_every_guard_of_the_frontend_holds(stack: LocalStack, http: httpx.Client, prefix: str) -> None:
    url = f"{prefix}/v1/completions"
    body = {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2}
    anonymous = httpx.post(f"http://127.0.0.1:{stack.ports.http}{url}", json=body, timeout=60)
    assert openai_error(anonymous, 401)["code"] == "invalid_api_key"
    wrong = httpx.post(f"http://127.0.0.1:{stack.ports.http}{url}", json=body, timeout=60,
                       headers={"Authorization": "Bearer not-a-key"})
    assert openai_error(wrong, 401)["code"] == "invalid_api_key"

    assert openai_error(http.post(url, content=b'{"model": ', headers={"Content-Type": "application/json"}),
                        400)["code"] == "invalid_json"
    assert openai_error(http.post(url, json={**body, "max_tokens": -3}), 400)["param"] == "max_tokens"
    assert openai_error(http.post(url, json={**body, "model": "no-such-model"}), 404)["code"] == "model_not_found"
    too_long = " ".join(["fox"] * (MAX_MODEL_LEN + 500))
    assert openai_error(http.post(url, json={**body, "prompt": too_long}), 400)["code"] == "context_length_exceeded"
    openai_error(http.post(url, content=b"x" * (4 * 1024 * 1024 + 1), headers={"Content-Type": "application/json"}), 413)
    # vLLM's own routes are not served: only the OpenAI endpoints of the separate frontend
    for path in ("/docs", "/openapi.json", "/metrics", "/version", "/v1/load_lora_adapter"):
        openai_error(http.get(f"{prefix}{path}"), 404)
    for path in ("/tokenize", "/detokenize", "/v1/embeddings", "/v1/responses", "/pooling"):
        openai_error(http.post(f"{prefix}{path}", json=body), 404)

    ok = http.post(url, json={**body, "prompt": prompt(50)})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_hostile_requests_get_a_fast_4xx_while_the_decode_replicas_stream_keeps_flowing(http: httpx.Client) -> None:
    """Issue 18's hostile requests against the default graph: here the decode replica validates them on the same
    event loop that streams its tokens, so a guard that blocked it would stall every stream of the replica."""
    hostile_requests_get_a_fast_4xx_while_a_stream_keeps_flowing(http)


def engine_busy(stack: LocalStack) -> float:
    series = scrape(stack.cluster.metrics_url("decode"))
    return total(series, "ray_vllm_num_requests_running") + total(series, "ray_vllm_num_requests_waiting")


def test_admission_bounds_each_serving_replica_and_a_disconnect_frees_it(stack: LocalStack, http: httpx.Client) -> None:
    """agg admits 1 running + 0 queued: a second request while one streams gets 429 at once; once the
    first client goes away, the engine aborts its request and the slot is free again."""
    small = {"model": MODEL_ID, "prompt": "hello", "max_tokens": 2}

    def admitted() -> bool:
        return http.post("/agg/v1/completions", json=small).status_code == 200

    # The slot is free once a small request is admitted (the engine metrics lag by seconds: no proof of it).
    wait_until("agg to admit a request (an earlier test's request to end)", admitted, timeout_s=120)
    # The first request must still be running when the second arrives, also on a loaded machine: the tiny
    # model decodes 1500 tokens in a few seconds, so it fills the context with 8 sequences (8 sequences hold
    # the one slot there is: a request's weight is capped at max_in_flight).
    body = {"model": MODEL_ID, "prompt": prompt(20), "max_tokens": MAX_MODEL_LEN - 64, "n": 8, "stream": True,
            "ignore_eos": True}
    with authorized_client(stack, API_KEY) as first:
        with first.stream("POST", "/agg/v1/completions", json=body) as stream:
            assert stream.status_code == 200
            # Keep the iterator: dropping it closes the connection at once, which cancels the first request as
            # soon as HAProxy passes the close on, before or after the second request arrives (that, not
            # admission, was the "200 for the second request" of earlier runs).
            lines = stream.iter_lines()
            next(lines)  # it is running
            t0 = time.monotonic()
            rejected = http.post("/agg/v1/completions", json={**body, "stream": False, "n": 1, "max_tokens": 2})
            elapsed = time.monotonic() - t0
            assert rejected.status_code == 429, (
                f"HTTP {rejected.status_code} after {elapsed:.2f} s while the first request should hold the slot "
                f"(engine requests running now: {engine_busy(stack)}): {rejected.text[:300]}")
            error = openai_error(rejected, 429)
            assert int(rejected.headers["retry-after"]) >= 1 and elapsed < 10, (error, elapsed)
            print(f"admission: second request 429 in {elapsed:.2f} s: {error['message'][:160]}")
            lines.close()
        # leaving the `with` closed the connection mid-stream
    # the abandoned request ends (the engine aborts it) and frees its slot:
    wait_until("the abandoned request's slot to be free again", admitted, timeout_s=60)
    wait_until("the engine to abort the abandoned request", lambda: engine_busy(stack) == 0, timeout_s=60)


def test_zz_dead_engine_answers_503_instead_of_hanging(stack: LocalStack, http: httpx.Client) -> None:
    """Runs last (it breaks the aggregated app): the replica that serves HTTP outlives its engine process
    and answers a quick OpenAI-shaped 503; the disaggregated app is unaffected."""
    engine_core_of(stack, "ServeReplica:agg:Aggregated").kill()
    started = time.monotonic()
    response = http.post("/agg/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 4})
    elapsed = time.monotonic() - started
    # engine_unavailable when the replica already saw its engine dead; engine_failed_on_request when the request
    # reached the engine before its death was noticed (the kill and the request race; both are a quick 503)
    assert openai_error(response, 503)["code"] in {"engine_unavailable", "engine_failed_on_request"}
    assert elapsed < 150, f"took {elapsed:.0f} s"
    print(f"dead engine (direct streaming): HTTP 503 after {elapsed:.1f} s")
    assert http.post("/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 2}).status_code == 200


def test_zzz_while_the_serving_replica_restarts_a_request_gets_a_503_naming_the_role(
        stack: LocalStack, http: httpx.Client) -> None:
    """After test_zz: Serve replaces the aggregated replica whose engine died, and until the new one runs (its
    engine loads for a minute or more) the app has no replica serving HTTP. HAProxy then sends requests to the
    node's Serve proxy, whose router would hold them until the new replica runs (Ray 2.60 bounds that wait by
    nothing): the app's edge middleware there (serve_app/frontend/held.py) answers 503 `aggregated_unavailable`
    instead. Every request meanwhile is answered at once, none waits for the restart."""
    seen: list[tuple[int, str, float]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        started = time.monotonic()
        response = http.post("/agg/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 2},
                             timeout=60)
        elapsed = time.monotonic() - started
        code = openai_error(response, 503)["code"] if response.status_code != 200 else "ok"
        seen.append((response.status_code, code, elapsed))
        assert elapsed < 15, f"a request waited {elapsed:.0f} s while the replica restarted: {seen}"
        if code == "aggregated_unavailable":
            assert int(response.headers["retry-after"]) >= 1
            break
        time.sleep(1)
    codes = [c for _, c, _ in seen]
    print(f"replica restart: {len(seen)} requests, answers {sorted(set(codes))}, slowest {max(e for *_, e in seen):.2f} s")
    assert codes[-1] == "aggregated_unavailable", f"never saw Serve's proxy answer for the restarting app: {seen}"
    # the disaggregated app beside it is unaffected
    assert http.post("/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 2}).status_code == 200


def test_zzzz_a_stream_cut_by_its_decode_replica_dying_ends_in_an_error_then_decode_is_named_down(
        stack: LocalStack, http: httpx.Client) -> None:
    """Runs last (it kills the disaggregated app's only decode replica, the replica serving HTTP with direct
    streaming). A stream that replica was sending must not end as if complete: the client sees the connection
    fail (HAProxy cannot finish a chunked body whose server vanished) or an error event, never a clean [DONE],
    so it knows to retry. Then, while Serve replaces the replica, a request gets 503 `decode_unavailable` at
    once from Serve's proxy (serve_app/frontend/held.py) instead of waiting for the new replica."""
    replica = next(p for p in stack.cluster.processes() if "ServeReplica:direct:Decode" in " ".join(p.cmdline()))
    body = {"model": MODEL_ID, "prompt": prompt(4), "max_tokens": 1500, "stream": True, "temperature": 0,
            "ignore_eos": True}
    events: list[str] = []
    ended = "complete"
    try:
        with http.stream("POST", "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 5:
                        replica.kill()  # SIGKILL: no drain, no goodbye
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        ended = type(e).__name__
    errored = any('"error"' in e for e in events)
    print(f"decode replica killed mid-stream: {len(events)} events, ended by {ended}, error event: {errored}")
    assert len(events) < 1500, "the stream finished before the kill reached it"
    assert ended != "complete" or errored, f"the cut stream looked complete to the client: {events[-3:]}"

    # Until HAProxy has marked the dead replica down, a request may still be sent to it on a server connection HAProxy
    # reuses, and then end in HAProxy's own error (its 502 rewritten by Ray to a plain-text 500, or the connection
    # closed): at most the first two, each at once. After that Serve's proxy answers for the app.
    seen: list[tuple[int, str, float]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            response = http.post("/v1/completions", json={"model": MODEL_ID, "prompt": "hello", "max_tokens": 2},
                                 timeout=60)
            status = response.status_code
            code = "haproxy_500" if (status, response.text) == (500, "Internal Server Error") else (
                "ok" if status == 200 else openai_error(response, 503)["code"])
        except httpx.TransportError as e:
            status, code = 0, type(e).__name__
        elapsed = time.monotonic() - started
        seen.append((status, code, elapsed))
        assert elapsed < 15, f"a request waited {elapsed:.0f} s for the replaced decode replica: {seen}"
        if code == "decode_unavailable":
            break
        time.sleep(0.5)
    print(f"decode replica restart: {len(seen)} requests, answers {[c for _, c, _ in seen]}, "
          f"slowest {max(e for *_, e in seen):.2f} s")
    assert seen[-1][1] == "decode_unavailable", seen
    assert len(seen) <= 3 and all(c in {"haproxy_500", "RemoteProtocolError", "ReadError"} for _, c, _ in seen[:-1]), seen
