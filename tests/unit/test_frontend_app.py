"""The whole frontend in-process: make_app + BoundedOpenAiIngress over a fake engine (no Ray cluster, no vLLM
engine), driven through ASGI. What the guards decide alone is tested beside them; this checks that the
request path wires them as it says: containment at the ingress (no retry of a death the request caused,
refusal after the strikes), retry of a replica that was gone before, non-streamed deadlines scaled by
max_tokens, per-key cache salts, the client's key kept away from the engines, and the edge guard."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Optional

import httpx
import pytest
from ray.exceptions import RayTaskError

from serve_app import roles
from serve_app.upstream import CompletionResponse, EngineDeadError, ModelCard
from serve_app.config import AppConfig
from serve_app.engine.direct import LocalServerHandle
from serve_app.frontend.app import ENDPOINTS, make_app
from serve_app.frontend.containment import EngineDeadBeforeDispatch
from serve_app.frontend.ingress import REMOTE, BoundedOpenAiIngress

MODEL = "tiny"
KEYS = ("key-one", "key-two")


class FakeEngine:
    """The serving replica's chat()/completions(): `behave(call_number, request, raw)` returns the chunks (an
    async iterator) or raises, as the replica method would."""

    def __init__(self, behave: Callable[[int, Any, Any], AsyncIterator[Any]]) -> None:
        self.behave = behave
        self.calls: list[tuple[Any, Any]] = []

    async def completions(self, request: Any, raw: Any = None) -> AsyncIterator[Any]:
        self.calls.append((request, raw))
        return self.behave(len(self.calls), request, raw)

    chat = completions

    async def check_health(self) -> None:
        return None


async def answer(request: Any, delay_s: float = 0.0) -> AsyncIterator[Any]:
    await asyncio.sleep(delay_s)
    if request.stream:
        yield ['data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"a"}]}\n\n']
        return
    yield CompletionResponse(id="c", object="text_completion", created=0, model=MODEL,
                             choices=[{"index": 0, "text": "a", "finish_reason": "length"}],
                             usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})


async def dies(exc: BaseException) -> AsyncIterator[Any]:
    raise exc
    yield  # pragma: no cover


def remote(cause: BaseException) -> RayTaskError:
    return RayTaskError("completions", "Traceback ... pid=1 ip=10.0.0.1", cause).as_instanceof_cause()


@pytest.fixture(autouse=True)
def no_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The role watch reads Serve's status; there is none here (and no role is watched)."""

    def unavailable() -> Any:
        raise RuntimeError("no Serve in unit tests")

    monkeypatch.setattr(roles, "_serve_status", unavailable)
    monkeypatch.setattr(roles, "_own_app_name", lambda: "test")
    monkeypatch.setenv("RLD_UNIT_KEYS", ",".join(KEYS))


def client(engine: FakeEngine, **config: Any) -> httpx.AsyncClient:
    args: dict[str, Any] = {"mode": "aggregated", "model": {"id": MODEL, "source": "/m"}, "decode": {},
                            "auth": {"api_keys_env": "RLD_UNIT_KEYS"}}
    for path, value in config.items():
        node = args
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    app_config = AppConfig.model_validate(args)
    card = ModelCard(id=MODEL, object="model", owned_by="test", permission=[],
                     metadata={"model_id": MODEL, "input_modality": "text", "max_request_context_length": 2048})
    ingress = BoundedOpenAiIngress({MODEL: LocalServerHandle(engine)}, {MODEL: card}, lora_paths={},
                                   app_config=app_config, upstream=REMOTE)
    app = make_app(app_config)
    for name, route in ENDPOINTS.items():
        route(app)(getattr(ingress, name))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                             headers={"Authorization": f"Bearer {KEYS[0]}"})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def post(engine: FakeEngine, bodies: list[dict[str, Any]], headers: Optional[dict[str, str]] = None,
         **config: Any) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with client(engine, **config) as c:
            return [await c.post("/v1/completions", json=b, headers=headers) for b in bodies]

    return run(go())


BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 4}


def test_an_engine_that_died_running_the_request_is_not_retried_and_strikes_then_refuses() -> None:
    engine = FakeEngine(lambda n, request, raw: dies(remote(EngineDeadError())))
    first, second, third = post(engine, [BODY, BODY, BODY])
    for response in (first, second):
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "engine_failed_on_request"
        assert "10.0.0.1" not in response.text and "pid" not in response.text
    assert third.status_code == 400 and third.json()["error"]["code"] == "request_quarantined"
    assert len(engine.calls) == 2  # once per request: no retry, and the quarantined one never reached it


def test_a_replica_whose_engine_was_dead_before_is_retried() -> None:
    def behave(n: int, request: Any, raw: Any) -> AsyncIterator[Any]:
        return dies(remote(EngineDeadBeforeDispatch("dead already"))) if n == 1 else answer(request)

    engine = FakeEngine(behave)
    (response,) = post(engine, [BODY])
    assert response.status_code == 200, response.text
    assert len(engine.calls) == 2


def test_other_requests_are_not_refused_by_a_quarantine() -> None:
    engine = FakeEngine(lambda n, request, raw: dies(remote(EngineDeadError())) if n <= 2 else answer(request))
    responses = post(engine, [BODY, BODY, {**BODY, "prompt": "something else"}])
    assert [r.status_code for r in responses] == [503, 503, 200]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_answered_request_lets_the_replica_end_its_response(stream: bool) -> None:
    """The replica records a request (ray_rld_request_seconds) when its response ends, after its last chunk.
    A non-streamed answer is one chunk: the ingress used to leave the response open and cancel it when it
    was collected, so the replica's bookkeeping after that chunk was cut (CI's run of d649c44 missed the
    local-path request in tests/serve_app). Both shapes must run to the end."""
    ends: list[str] = []

    async def then_bookkeeping(request: Any) -> AsyncIterator[Any]:
        try:
            async for chunk in answer(request):
                yield chunk
            await asyncio.sleep(0.05)  # the replica's work after its last chunk
            ends.append("ended")
        except (GeneratorExit, asyncio.CancelledError):
            ends.append("cut")
            raise

    engine = FakeEngine(lambda n, request, raw: then_bookkeeping(request))

    async def go() -> httpx.Response:
        async with client(engine) as c:
            response = await c.post("/v1/completions", json={**BODY, "stream": stream})
        for _ in range(20):  # collection and its cancel, had they happened
            await asyncio.sleep(0.02)
        return response

    response = run(go())
    assert response.status_code == 200, response.text
    assert ends == ["ended"]


def test_a_long_non_streamed_request_is_not_cut_at_the_first_token_deadline() -> None:
    """Its one chunk comes when generation ends: 0.6 s here, past first_token_s (0.2 s) but within
    0.2 + 100 tokens x 0.01 s. On main this was a 503 'engine sent nothing'."""
    engine = FakeEngine(lambda n, request, raw: answer(request, delay_s=0.6))
    config = {"timeouts.first_token_s": 0.2, "timeouts.non_stream_per_token_s": 0.01}
    (slow,) = post(engine, [{**BODY, "max_tokens": 100}], **config)
    assert slow.status_code == 200, slow.text
    (stream,) = post(engine, [{**BODY, "max_tokens": 100, "stream": True}], **config)
    assert stream.status_code == 503 and stream.json()["error"]["code"] == "engine_unavailable"  # streams keep first_token_s


def test_the_engines_never_see_the_clients_key_and_each_key_gets_its_own_cache() -> None:
    engine = FakeEngine(lambda n, request, raw: answer(request))

    async def go() -> None:
        async with client(engine) as c:
            for key in KEYS:
                response = await c.post("/v1/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
                assert response.status_code == 200, response.text

    run(go())
    salts = [request.cache_salt for request, _ in engine.calls]
    assert salts[0] and salts[1] and salts[0] != salts[1]
    assert all(key not in salt for key in KEYS for salt in salts)
    for _, raw in engine.calls:
        assert "authorization" not in {k.lower() for k in raw.headers}


def test_hostile_bodies_are_refused_before_the_engine() -> None:
    engine = FakeEngine(lambda n, request, raw: answer(request))
    bodies = [
        {**BODY, **{f"k{i}": 0 for i in range(4000)}},
        {**BODY, "bad_words": ["w"] * 200_000},
        {**BODY, "stop": ["s"] * 100_000},
        {**BODY, "prompt_logprobs": 1},
        {**BODY, "echo": True, "logprobs": 1},
        {**BODY, "prompt": ["p"] * 65},
    ]
    responses = post(engine, bodies)
    assert [r.status_code for r in responses] == [400] * len(bodies)
    assert [r.json()["error"]["param"] for r in responses] == [None, "bad_words", "stop", "prompt_logprobs", "echo",
                                                               "prompt"]
    assert engine.calls == []


def test_a_bad_request_id_is_a_400_through_the_whole_app() -> None:
    engine = FakeEngine(lambda n, request, raw: answer(request))
    (response,) = post(engine, [BODY], headers={"x-request-id": b"\xff\xfe"})  # type: ignore[dict-item]
    assert response.status_code == 400 and response.json()["error"]["param"] == "x-request-id"
    assert engine.calls == []


def test_anonymous_health_is_the_status_only() -> None:
    engine = FakeEngine(lambda n, request, raw: answer(request))

    async def go() -> tuple[Any, Any]:
        async with client(engine) as c:
            anonymous = (await c.get("/health", headers={"Authorization": ""})).json()
            keyed = (await c.get("/health")).json()
            return anonymous, keyed

    anonymous, keyed = run(go())
    assert anonymous == {"status": "ok"}
    assert keyed["status"] == "ok" and keyed["models"] == [MODEL]


def test_traces_need_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from serve_app.frontend import app as app_module

    seen: list[bool] = []
    original = app_module.HopClockMiddleware.__init__

    def spy(self: Any, app: Any, client_trace: bool = False) -> None:
        seen.append(client_trace)
        original(self, app, client_trace)

    monkeypatch.setattr(app_module.HopClockMiddleware, "__init__", spy)
    engine = FakeEngine(lambda n, request, raw: answer(request))
    post(engine, [BODY])
    post(engine, [BODY], **{"frontend.client_trace": True})
    assert seen == [False, True]


def test_json_of_a_refusal_is_openai_shaped() -> None:
    engine = FakeEngine(lambda n, request, raw: answer(request))
    (response,) = post(engine, [{**BODY, "tools": []}])
    body = json.loads(response.content)
    assert set(body["error"]) == {"message", "type", "param", "code"}
