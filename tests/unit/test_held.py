"""serve_app/frontend/held.py: the guard in Serve's proxy that answers a request held for an app with no running
ingress replica. Pure: a fake proxy (an ASGI app that waits for a replica or a client disconnect, as Serve's proxy
does), the controller's details as dicts, short grace and refresh times."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from serve_app.frontend.held import ControllerView, HeldRequestGuard, Target, target_for


def details(apps: dict[str, tuple[str, str, dict[str, list[str]]]]) -> dict[str, Any]:
    """{app: (route_prefix, ingress, {deployment: [replica states]})} as the controller's details dict."""
    return {"applications": {
        name: {
            "route_prefix": route,
            "deployment_topology": {"app_name": name, "ingress_deployment": ingress, "nodes": {}},
            "deployments": {d: {"status": "HEALTHY" if "RUNNING" in states else "UNHEALTHY",
                                "replicas": [{"state": s} for s in states]} for d, states in deployments.items()},
        } for name, (route, ingress, deployments) in apps.items()
    }}


DIRECT_DOWN = details({
    "direct": ("/", "Decode:tiny", {"Decode:tiny": ["STARTING"], "Prefill:tiny": ["RUNNING"]}),
    "agg": ("/agg", "Aggregated:tiny", {"Aggregated:tiny": ["RUNNING"]}),
})


# ---- which app and deployment a path reaches ----


def test_the_longest_route_prefix_wins_and_names_the_ingress_role() -> None:
    assert target_for(DIRECT_DOWN, "/v1/completions") == Target("direct", "Decode:tiny", 0, "UNHEALTHY")
    assert target_for(DIRECT_DOWN, "/agg/v1/completions") == Target("agg", "Aggregated:tiny", 1, "HEALTHY")
    # '/agg' is not a prefix of '/aggx' in Serve's sense: that path belongs to the app at '/'
    assert target_for(DIRECT_DOWN, "/aggx/v1/completions").app == "direct"
    assert target_for(DIRECT_DOWN, "/v1/completions").role == "decode"
    assert Target("a", "BoundedOpenAiIngress", 0, "x").role == "frontend"
    assert Target("a", "SomeoneElses", 0, "x").role == "SomeoneElses"


def test_what_cannot_be_resolved_is_left_to_serve() -> None:
    assert target_for({}, "/v1/models") is None
    assert target_for(details({"a": ("/a", "X", {"X": []})}), "/b") is None
    no_topology = {"applications": {"a": {"route_prefix": "/", "deployments": {"X": {"replicas": []}, "Y": {}}}}}
    assert target_for(no_topology, "/") is None  # two deployments, ingress unknown
    one = {"applications": {"a": {"route_prefix": "/", "deployments": {"X": {"replicas": [{"state": "RUNNING"}]}}}}}
    assert target_for(one, "/v1").running == 1
    # a replica Serve still routes to while its node drains counts as running
    draining = details({"a": ("/", "X", {"X": ["PENDING_MIGRATION"]})})
    assert target_for(draining, "/").running == 1


# ---- the guard around a fake proxy ----


class FakeProxy:
    """Serve's proxy as the guard sees it: reads the body, then holds the request until `replica` is set (and
    answers 200 after `work_s`) or the client disconnects (then it cancels and sends nothing)."""

    def __init__(self, *, work_s: float = 0.0, answer_at_once: bool = False) -> None:
        self.replica = asyncio.Event()
        self.work_s = work_s
        self.answer_at_once = answer_at_once
        self.disconnected = False
        self.sent_after_disconnect = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.request"
        if self.answer_at_once:
            await self._answer(send)
            return
        watch = asyncio.ensure_future(receive())
        ready = asyncio.ensure_future(self.replica.wait())
        done, _ = await asyncio.wait({watch, ready}, return_when=asyncio.FIRST_COMPLETED)
        if watch in done and watch.result()["type"] == "http.disconnect":
            ready.cancel()
            self.disconnected = True
            await send({"type": "http.response.start", "status": 499, "headers": []})  # must not reach the client
            self.sent_after_disconnect = True
            return
        watch.cancel()
        await asyncio.sleep(self.work_s)
        await self._answer(send)

    @staticmethod
    async def _answer(send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})


class Controller:
    """The controller's details, changeable by the test; counts reads; can fail or hang."""

    def __init__(self, value: dict[str, Any], *, fail: bool = False, hang_s: float = 0.0) -> None:
        self.value, self.fail, self.hang_s, self.reads = value, fail, hang_s, 0

    def __call__(self) -> dict[str, Any]:
        self.reads += 1
        if self.hang_s:
            import time

            time.sleep(self.hang_s)
        if self.fail:
            raise ConnectionError("controller unreachable")
        return self.value


def guard(proxy: FakeProxy, controller: Controller, *, in_replica: bool = False, grace_s: float = 0.05,
          read_timeout_s: float = 1.0) -> HeldRequestGuard:
    view = ControllerView(refresh_s=0.05, read_timeout_s=read_timeout_s, read=controller)
    return HeldRequestGuard(proxy, grace_s=grace_s, view=view, in_replica=lambda: in_replica)


async def request(app: Any, path: str = "/v1/completions") -> tuple[int, dict[str, str], dict[str, Any], float]:
    """One POST through `app`; the client stays connected until the response ends."""
    sent: list[dict] = []
    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"x-request-id", b"req-1")]}
    first = True
    never = asyncio.Event()

    async def receive() -> dict:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b'{"prompt": "hi"}', "more_body": False}
        await never.wait()  # a connected client sends nothing more
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(app(scope, receive, send), 5)  # a guard that never answers fails, not hangs
    elapsed = loop.time() - started
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert sum(m["type"] == "http.response.start" for m in sent) == 1, sent
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body), elapsed


def test_a_request_held_while_the_ingress_has_no_running_replica_gets_a_503_naming_the_role() -> None:
    async def go() -> None:
        proxy, controller = FakeProxy(), Controller(DIRECT_DOWN)
        status, headers, body, elapsed = await request(guard(proxy, controller))
        assert status == 503 and body["error"]["code"] == "decode_unavailable"
        assert body["error"]["type"] == "server_error" and "decode role has no running replica" in body["error"]["message"]
        assert int(headers["retry-after"]) >= 1 and headers["content-type"] == "application/json"
        assert elapsed < 1.0
        # the proxy's hold ended as on a client disconnect, and what it sent after that never reached the client
        assert proxy.disconnected and proxy.sent_after_disconnect

    asyncio.run(go())


def test_a_request_answered_within_the_grace_is_never_looked_at() -> None:
    async def go() -> None:
        controller = Controller(DIRECT_DOWN)
        status, _, _, _ = await request(guard(FakeProxy(answer_at_once=True), controller))
        assert status == 200 and controller.reads == 0

    asyncio.run(go())


def test_a_long_answer_from_a_running_replica_is_left_alone() -> None:
    async def go() -> None:
        proxy = FakeProxy(work_s=0.5)  # a non-streamed answer: no response start for a while
        proxy.replica.set()
        controller = Controller(details({"agg": ("/agg", "Aggregated:tiny", {"Aggregated:tiny": ["RUNNING"]})}))
        status, _, body, elapsed = await request(guard(proxy, controller), "/agg/v1/completions")
        assert status == 200 and body == {"ok": True} and elapsed >= 0.5
        assert not proxy.disconnected
        assert 1 <= controller.reads <= 20  # looked at, at most every refresh_s

    asyncio.run(go())


def test_a_request_waiting_for_a_replica_that_comes_up_is_served() -> None:
    async def go() -> None:
        proxy = FakeProxy()
        controller = Controller(details({"agg": ("/agg", "Aggregated:tiny", {"Aggregated:tiny": ["RUNNING"]})}))
        # running per the controller, the proxy still routing: the replica answers after a while
        asyncio.get_running_loop().call_later(0.3, proxy.replica.set)
        status, _, _, _ = await request(guard(proxy, controller), "/agg/v1/completions")
        assert status == 200 and not proxy.disconnected

    asyncio.run(go())


def test_the_only_replica_dying_while_a_request_waits_gets_it_a_503_at_the_next_read() -> None:
    async def go() -> None:
        proxy = FakeProxy()
        up = details({"agg": ("/agg", "Aggregated:tiny", {"Aggregated:tiny": ["RUNNING"]})})
        controller = Controller(up)

        def dies() -> None:
            controller.value = details({"agg": ("/agg", "Aggregated:tiny", {"Aggregated:tiny": ["STOPPING"]})})

        asyncio.get_running_loop().call_later(0.3, dies)
        status, _, body, elapsed = await request(guard(proxy, controller), "/agg/v1/completions")
        assert status == 503 and body["error"]["code"] == "aggregated_unavailable"
        assert 0.3 <= elapsed < 1.0 and proxy.disconnected

    asyncio.run(go())


def test_held_requests_share_the_controller_reads() -> None:
    async def go() -> None:
        controller = Controller(DIRECT_DOWN)
        g = guard(FakeProxy(), controller)
        results = await asyncio.gather(*(request(g) for _ in range(50)))
        assert {r[0] for r in results} == {503}
        assert controller.reads <= 3, controller.reads

    asyncio.run(go())


@pytest.mark.parametrize("failure", ["fail", "hang"])
def test_a_failed_or_slow_read_leaves_the_request_to_serve(failure: str, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        proxy = FakeProxy()
        controller = Controller(DIRECT_DOWN, fail=failure == "fail", hang_s=0.3 if failure == "hang" else 0.0)
        asyncio.get_running_loop().call_later(0.6, proxy.replica.set)
        status, _, _, _ = await request(guard(proxy, controller, read_timeout_s=0.1))
        assert status == 200 and not proxy.disconnected

    asyncio.run(go())
    assert "reading Serve's controller failed" in caplog.text


def test_inside_a_replica_and_on_serves_own_paths_it_does_nothing() -> None:
    async def go(path: str, in_replica: bool) -> int:
        proxy = FakeProxy()
        controller = Controller(DIRECT_DOWN)
        asyncio.get_running_loop().call_later(0.3, proxy.replica.set)
        status, _, _, _ = await request(guard(proxy, controller, in_replica=in_replica), path)
        assert controller.reads == 0 and not proxy.disconnected
        return status

    assert asyncio.run(go("/v1/completions", True)) == 200
    assert asyncio.run(go("/-/healthz", False)) == 200


def test_a_websocket_or_lifespan_scope_passes_through() -> None:
    seen: list[str] = []

    async def inner(scope: dict, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    controller = Controller(DIRECT_DOWN)
    g = HeldRequestGuard(inner, view=ControllerView(read=controller), in_replica=lambda: False)
    asyncio.run(g({"type": "lifespan"}, None, None))
    asyncio.run(g({"type": "websocket", "path": "/"}, None, None))
    assert seen == ["lifespan", "websocket"] and controller.reads == 0


def test_when_the_server_cancels_the_request_the_proxys_handling_is_cancelled_too() -> None:
    async def go() -> None:
        cancelled = asyncio.Event()

        async def proxy(scope: dict, receive: Any, send: Any) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        running = Controller(details({"agg": ("/agg", "Aggregated:tiny", {"Aggregated:tiny": ["RUNNING"]})}))
        g = HeldRequestGuard(proxy, grace_s=0.05, view=ControllerView(refresh_s=0.05, read=running),
                             in_replica=lambda: False)
        call = asyncio.ensure_future(g({"type": "http", "path": "/agg/v1/completions", "headers": []}, None, None))
        await asyncio.sleep(0.3)
        call.cancel()
        await asyncio.wait_for(cancelled.wait(), 2)

    asyncio.run(go())
