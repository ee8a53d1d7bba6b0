"""GET /health of the frontend (BoundedOpenAiIngress.health): anonymous callers learn only the status; nobody
learns Serve's messages or a health check's exception text; checks run at most once a second. Pure: the
ingress object without Ray (fake role watch and handles)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

from serve_app.config import AppConfig
from serve_app.frontend.auth import CLIENT_KEY_STATE_KEY
from serve_app.frontend.ingress import BoundedOpenAiIngress
from serve_app.roles import RoleState

LEAKY = "Traceback (most recent call last):\n  File \"/home/ray/x.py\", line 3\nRayTaskError pid=4242 ip=10.1.2.3"


class FakeRoles:
    def __init__(self, down: Optional[str] = None) -> None:
        self.down = down

    def _state(self, role: str) -> RoleState:
        running = 0 if role == self.down else 1
        return RoleState(deployment=f"{role}:tiny", running=running, status="UNHEALTHY", message=LEAKY,
                         checked_at=0.0, confirmed=True)

    def snapshot(self) -> dict[str, RoleState]:
        return {role: self._state(role) for role in ("prefill", "decode")}

    async def confirmed_unavailable(self, role: str) -> Optional[RoleState]:
        state = self._state(role)
        return None if state.available else state


class Remote:
    def __init__(self, fails: bool, calls: list[int]) -> None:
        self.fails, self.calls = fails, calls

    async def remote(self) -> None:
        self.calls.append(1)
        if self.fails:
            raise RuntimeError(LEAKY)


class FakeHandle:
    def __init__(self, fails: bool, calls: list[int]) -> None:
        self.check_health = Remote(fails, calls)


class FakeRequest:
    def __init__(self, keyed: bool) -> None:
        self.scope = {"state": {CLIENT_KEY_STATE_KEY: True} if keyed else {}}


def ingress(*, auth: bool = True, down: Optional[str] = None, fails: bool = False) -> tuple[Any, list[int]]:
    args: dict[str, Any] = {"model": {"id": "tiny", "source": "/m"}, "prefill": {}, "decode": {}}
    if auth:
        args["auth"] = {"api_keys_env": "X"}
    config = AppConfig.model_validate(args)
    calls: list[int] = []
    obj = BoundedOpenAiIngress.__new__(BoundedOpenAiIngress)
    obj._config, obj._failover = config, config.failover
    obj._roles = FakeRoles(down)
    obj._default_serve_handles = {"tiny": FakeHandle(fails, calls)}
    obj._health, obj._health_lock = None, asyncio.Lock()
    return obj, calls


def health(obj: Any, keyed: bool) -> tuple[int, dict[str, Any]]:
    response = asyncio.run(obj.health(FakeRequest(keyed)))
    return response.status_code, json.loads(response.body)


def test_anonymous_callers_get_the_status_only() -> None:
    obj, _ = ingress()
    assert health(obj, keyed=False) == (200, {"status": "ok"})
    status, body = health(obj, keyed=True)
    assert status == 200 and body == {"status": "ok", "models": ["tiny"], "roles": {"prefill": "ok", "decode": "ok"}}


def test_without_auth_everyone_may_see_the_roles() -> None:
    obj, _ = ingress(auth=False)
    assert health(obj, keyed=False)[1]["roles"] == {"prefill": "ok", "decode": "ok"}


def test_a_down_role_or_failed_check_says_so_without_its_text() -> None:
    for obj, _ in (ingress(down="decode"), ingress(fails=True)):
        status, anonymous = health(obj, keyed=False)
        assert status == 503 and anonymous == {"status": "unavailable"}
        status, keyed = health(obj, keyed=True)
        text = json.dumps(keyed)
        assert status == 503 and keyed["roles"]["decode"] == "unavailable"
        for leak in ("Traceback", "pid", "10.1.2.3", "/home/ray", "RayTaskError"):
            assert leak not in text, text


def test_prefill_down_with_local_fallback_is_degraded() -> None:
    obj, _ = ingress(down="prefill")
    assert health(obj, keyed=False) == (200, {"status": "degraded"})


def test_checks_run_at_most_once_a_second() -> None:
    obj, calls = ingress()
    for _ in range(50):
        health(obj, keyed=False)
    assert len(calls) == 1
