"""The frontend's guards and edges, each alone: admission weighted by sequences, the guard chain, the edge
guard (request ids, /-/routes), auth's client marking and per-key cache salt, what errors may say, and the
non-streamed deadline. Pure: fakes, injected clocks, raw ASGI calls."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Optional

import pytest
from starlette.responses import PlainTextResponse

from serve_app.config import AuthSpec, ContainmentSpec, OverflowSpec, TimeoutSpec
from serve_app.frontend.admission import Admission, Overloaded
from serve_app.frontend.edge import EdgeGuard, valid_request_id
from serve_app.frontend.held import HeldRequestGuard
from serve_app.frontend.auth import CACHE_SALT_STATE_KEY, CLIENT_KEY_STATE_KEY, ApiKeyAuth, cache_salt
from serve_app.frontend.containment import Containment, Quarantined
from serve_app.frontend.deadlines import non_stream_deadline_s
from serve_app.frontend.errors import RoleUnavailable, client_text
from serve_app.frontend.guards import (
    Admit,
    AdmissionGate,
    ContainmentGate,
    RoleGate,
    SaturationGate,
    run_guards,
)
from serve_app.frontend.overflow import Overflow

REPO = Path(__file__).resolve().parents[2]


def admit(weight: int = 1, fingerprint: str = "f") -> Admit:
    return Admit(kind="chat", data={}, model_id="m", request_id="r", fingerprint=fingerprint, max_tokens=8,
                 weight=weight)


# ---- admission weighs sequences ----


def test_a_request_holds_one_slot_per_sequence() -> None:
    async def go() -> None:
        admission = Admission(8, 4, max_queue_wait_s=5, retry_after_s=1)
        release = await admission.acquire(6)
        assert admission.in_flight == 6
        assert admission.would_queue(3) and not admission.would_queue(2)
        small = await admission.acquire(2)
        assert admission.in_flight == 8
        release()
        small()
        assert admission.in_flight == 0

    asyncio.run(go())


def test_a_request_heavier_than_every_slot_runs_alone_instead_of_never() -> None:
    async def go() -> None:
        admission = Admission(8, 4, max_queue_wait_s=5, retry_after_s=1)
        release = await admission.acquire(64 * 8)
        assert admission.in_flight == 8
        release()

    asyncio.run(go())


def test_waiters_are_served_in_order_and_a_heavy_head_is_not_overtaken() -> None:
    async def go() -> list[str]:
        admission = Admission(4, 4, max_queue_wait_s=5, retry_after_s=1)
        order: list[str] = []
        first = await admission.acquire(3)

        async def wait(name: str, weight: int) -> None:
            release = await admission.acquire(weight)
            order.append(name)
            await asyncio.sleep(0.01)
            release()

        heavy = asyncio.ensure_future(wait("heavy", 4))
        await asyncio.sleep(0)
        light = asyncio.ensure_future(wait("light", 1))  # would fit now (3 + 1 <= 4), but heavy is first
        await asyncio.sleep(0.01)
        assert order == []
        first()
        await asyncio.gather(heavy, light)
        assert admission.in_flight == 0 and admission.queued == 0
        return order

    assert asyncio.run(go()) == ["heavy", "light"]


def test_a_full_queue_is_429() -> None:
    async def go() -> None:
        admission = Admission(1, 0, max_queue_wait_s=5, retry_after_s=3)
        await admission.acquire()
        with pytest.raises(Overloaded) as refused:
            await admission.acquire()
        assert refused.value.status_code == 429 and refused.value.headers() == {"Retry-After": "3"}

    asyncio.run(go())


# ---- the chain ----


class Recorder:
    def __init__(self, name: str, log: list[str], answer: Any = None, raises: Optional[BaseException] = None) -> None:
        self.name, self.log, self.answer, self.raises = name, log, answer, raises

    async def admit(self, request: Admit) -> Any:
        self.log.append(self.name)
        request.releases.append(lambda: self.log.append(f"release {self.name}"))
        if self.raises is not None:
            raise self.raises
        return self.answer


def test_the_chain_runs_in_order_and_stops_at_the_first_answer() -> None:
    log: list[str] = []
    response = PlainTextResponse("served elsewhere")
    guards = [Recorder("a", log), Recorder("b", log, answer=response), Recorder("c", log)]
    assert asyncio.run(run_guards(guards, admit())) is response
    assert log == ["a", "b"]


def test_a_refusal_releases_what_earlier_guards_hold() -> None:
    log: list[str] = []
    guards = [Recorder("a", log), Recorder("b", log, raises=Quarantined(5))]
    with pytest.raises(Quarantined):
        asyncio.run(run_guards(guards, admit()))
    assert log == ["a", "b", "release b", "release a"]


def test_containment_gate_refuses_a_quarantined_request_only() -> None:
    containment = Containment(ContainmentSpec(strikes=1), counter=lambda _: None)
    containment.killed_engine("poison")
    gate = ContainmentGate(containment)
    assert asyncio.run(gate.admit(admit(fingerprint="fine"))) is None
    with pytest.raises(Quarantined):
        asyncio.run(gate.admit(admit(fingerprint="poison")))


def test_role_gate_refuses_with_a_503_that_hides_serves_message() -> None:
    detail = "replica failed: Traceback ... File \"/home/ray/x.py\" pid=42 ip=10.0.0.9"

    async def blocking() -> RoleUnavailable:
        return RoleUnavailable("decode", detail, retry_after_s=10)

    gate = RoleGate(blocking, Overflow(OverflowSpec(), TimeoutSpec()))
    with pytest.raises(RoleUnavailable) as refused:
        asyncio.run(gate.admit(admit()))
    error = refused.value
    assert error.status_code == 503 and error.code == "decode_unavailable"
    assert "Traceback" not in error.message and "10.0.0.9" not in error.message and "pid" not in error.message
    assert error.detail == detail  # for the log


def test_saturation_gate_does_nothing_without_overflow() -> None:
    admission = Admission(1, 1, max_queue_wait_s=1, retry_after_s=1)
    gate = SaturationGate(admission, Overflow(OverflowSpec(), TimeoutSpec()))
    assert asyncio.run(gate.admit(admit(weight=5))) is None


def test_admission_gate_holds_the_weight_until_released() -> None:
    async def go() -> None:
        admission = Admission(8, 0, max_queue_wait_s=1, retry_after_s=1)
        request = admit(weight=5)
        assert await AdmissionGate(admission).admit(request) is None
        assert admission.in_flight == 5
        request.release_all()
        assert admission.in_flight == 0

    asyncio.run(go())


# ---- ASGI edges ----


async def call(app: Any, path: str = "/v1/models", headers: Optional[list[tuple[bytes, bytes]]] = None) -> tuple[int, dict, dict]:
    sent: list[dict] = []
    scope = {"type": "http", "method": "GET", "path": path, "headers": headers or [], "state": {}}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body) if body.startswith(b"{") else {}, scope


class Inner:
    def __init__(self) -> None:
        self.scopes: list[dict] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.mark.parametrize("value", [b"\xff\xfe", b"a b", b"x" * 300, b"id\r\nx-evil: 1", "é".encode()])
def test_a_bad_request_id_is_a_400_before_anything_decodes_it(value: bytes) -> None:
    inner = Inner()
    status, body, _ = asyncio.run(call(EdgeGuard(inner), headers=[(b"x-request-id", value)]))
    assert status == 400 and body["error"]["param"] == "x-request-id"
    assert inner.scopes == []


def test_a_good_request_id_passes() -> None:
    inner = Inner()
    status, _, _ = asyncio.run(call(EdgeGuard(inner), headers=[(b"x-request-id", b"req-123_abc.DEF")]))
    assert status == 200 and len(inner.scopes) == 1
    assert valid_request_id(b"0b7c6f7e-9f5e-4bd0-9ad2-6a3c8e1b2f10")


def test_serves_route_list_is_closed() -> None:
    inner = Inner()
    status, _, _ = asyncio.run(call(EdgeGuard(inner), path="/-/routes"))
    assert status == 404 and inner.scopes == []


def test_auth_marks_keyed_callers_on_open_paths_and_salts_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLD_TEST_KEYS", "key-one,key-two")
    inner = Inner()
    auth = ApiKeyAuth(inner, AuthSpec(api_keys_env="RLD_TEST_KEYS"))
    status, _, _ = asyncio.run(call(auth, path="/health"))
    assert status == 200 and CLIENT_KEY_STATE_KEY not in inner.scopes[-1]["state"]  # anonymous
    status, _, _ = asyncio.run(call(auth, path="/health", headers=[(b"authorization", b"Bearer key-one")]))
    assert inner.scopes[-1]["state"][CLIENT_KEY_STATE_KEY] is True
    salts = []
    for key in (b"key-one", b"key-two"):
        asyncio.run(call(auth, headers=[(b"authorization", b"Bearer " + key)]))
        salts.append(inner.scopes[-1]["state"][CACHE_SALT_STATE_KEY])
    assert salts[0] != salts[1] and salts[0] == cache_salt("key-one") and "key-one" not in salts[0]
    status, _, _ = asyncio.run(call(auth, headers=[(b"authorization", b"Bearer nope")]))
    assert status == 401


def test_one_key_shares_the_cache_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLD_TEST_KEYS", "only-key")
    for setting, salted in ((None, False), (True, True)):
        inner = Inner()
        auth = ApiKeyAuth(inner, AuthSpec(api_keys_env="RLD_TEST_KEYS", cache_salt_per_key=setting))
        asyncio.run(call(auth, headers=[(b"authorization", b"Bearer only-key")]))
        assert (CACHE_SALT_STATE_KEY in inner.scopes[-1]["state"]) is salted


# ---- what an error may say ----


@pytest.mark.parametrize(
    "text",
    [
        "Traceback (most recent call last):\n  File \"/x.py\"",
        "ray::ServeReplica:llm:decode.handle_request() (pid=1234, ip=10.0.3.4)",
        "failed at /usr/lib/python3/site-packages/vllm/x.py",
        "actor_id=ab12 died",
    ],
)
def test_internal_text_never_reaches_a_client(text: str) -> None:
    assert client_text(text) is None


def test_a_plain_validation_message_does() -> None:
    assert client_text("This model's maximum context length is 2048 tokens.\nmore") == (
        "This model's maximum context length is 2048 tokens."
    )


# ---- non-streamed deadlines ----


def test_a_non_streamed_deadline_grows_with_max_tokens() -> None:
    timeouts = TimeoutSpec(first_token_s=30)
    short = non_stream_deadline_s(timeouts.first_token_s, timeouts.non_stream_per_token_s, 16)
    long = non_stream_deadline_s(timeouts.first_token_s, timeouts.non_stream_per_token_s, 4096)
    assert short == pytest.approx(34) and long == pytest.approx(30 + 1024)


def test_serves_own_http_servers_get_the_edge_guard() -> None:
    """The frontend (and every engine role, for direct streaming) names the callback Serve calls for its HTTP
    server's middlewares, and the callback gives what Serve accepts."""
    from serve_app.upstream import import_attr
    from serve_app.upstream import validate_http_proxy_callback_return

    from serve_app.config import AppConfig
    from serve_app.llm_configs import EDGE_CALLBACK, EDGE_CALLBACK_ENV, frontend_deployment_config, runtime_env

    app = AppConfig.model_validate({"model": {"id": "m", "source": "/m"}, "prefill": {}, "decode": {}})
    frontend_env = frontend_deployment_config(app)["ray_actor_options"]["runtime_env"]["env_vars"]
    assert frontend_env[EDGE_CALLBACK_ENV] == EDGE_CALLBACK
    assert runtime_env(app, "decode", app.decode)["env_vars"][EDGE_CALLBACK_ENV] == EDGE_CALLBACK
    middlewares = validate_http_proxy_callback_return(import_attr(EDGE_CALLBACK.replace(":", "."))())
    assert [m.cls for m in middlewares] == [EdgeGuard, HeldRequestGuard]
    # every Ray process of the local stack and of the chart's pods names the same callback (Serve's proxy included)
    from devstack.cluster import LocalRayCluster
    from serve_app.config import DEFAULT_ROLE_LABEL_KEY

    assert LocalRayCluster(role_label_key=DEFAULT_ROLE_LABEL_KEY).env()[EDGE_CALLBACK_ENV] == EDGE_CALLBACK
    assert EDGE_CALLBACK in (REPO / "charts/ray-llm-disagg/templates/_pod.tpl").read_text()
