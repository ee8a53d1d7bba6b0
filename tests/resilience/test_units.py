"""The safety pieces on their own (no cluster): config blocks, API keys, admission queue."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from serve_app.frontend.admission import Admission, Overloaded
from serve_app.frontend.auth import ApiKeys, bearer_token, parse_keys
from serve_app.config import AppConfig, AuthSpec
from serve_app.llm_configs import kv_transfer_config


def app_args(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": {"id": "m", "source": "/models/m"},
        "accelerator": "cpu",
        "kv_transfer": {"buffer_device": "cpu"},
        "prefill": {},
        "decode": {},
    }
    args.update(overrides)
    return args


def test_safety_blocks_default_to_open_config_and_off_overflow() -> None:
    app = AppConfig.model_validate(app_args())
    assert not app.auth.enabled and not app.overflow.enabled
    assert app.admission_limits() == (500, 500)  # half of ingress.max_ongoing_requests each
    assert app.failover.local_fallback and app.failover.retry_other_prefill
    assert kv_transfer_config(app, "decode")["kv_load_failure_policy"] == "recompute"


@pytest.mark.parametrize(
    "admission,overflow,expected",
    [
        ({}, {}, (500, 500)),
        ({"max_queued": 0}, {}, (1000, 0)),  # no queue: all of the room runs
        ({"max_queued": 100}, {}, (900, 100)),
        ({"max_in_flight": 10}, {}, (10, 990)),
        ({"max_queued": 0}, {"enabled": True, "base_url": "http://127.0.0.1:1/v1", "max_in_flight": 64}, (936, 0)),
    ],
)
def test_unset_admission_limits_take_the_rest_of_the_frontends_room(
    admission: dict[str, Any], overflow: dict[str, Any], expected: tuple[int, int]
) -> None:
    app = AppConfig.model_validate(app_args(admission=admission, overflow=overflow))
    assert app.admission_limits() == expected


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"overflow": {"enabled": True}}, "overflow.base_url"),
        ({"overflow": {"enabled": True, "base_url": "ftp://x"}}, "base_url"),
        ({"overflow": {"enabled": True, "base_url": "http://x/v1", "api_key_file": "/k", "api_key_env": "K"}}, "not both"),
        ({"admission": {"max_in_flight": 900, "max_queued": 200}}, "frontend.max_ongoing_requests"),
        ({"auth": {"api_keys": ["inline"]}}, "api_keys"),
        ({"limits": {"max_n": 0}}, "max_n"),
    ],
)
def test_invalid_safety_config_is_rejected_with_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as error:
        AppConfig.model_validate(app_args(**overrides))
    assert message in str(error.value)


def test_keys_parse_from_lines_commas_and_comments() -> None:
    assert parse_keys("# rotated 2026-11\nkey-a\n\n key-b ,key-c\nkey-a\n") == ("key-a", "key-b", "key-c")
    assert bearer_token([(b"authorization", b"Bearer  abc ")]) == "abc"
    assert bearer_token([(b"Authorization", b"bearer abc")]) == "abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([]) is None


def test_key_file_rotation_without_restart_and_fail_closed(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "keys"
    path.write_text("old\nkept\n")
    keys = ApiKeys(AuthSpec(api_keys_file=str(path)), clock=lambda: now[0])
    assert keys.valid("old") and keys.valid("kept") and not keys.valid("new") and not keys.valid("")

    staging = tmp_path / "keys.new"
    staging.write_text("kept\nnew\n")
    os.replace(staging, path)  # how a Secret volume update looks: a new inode
    assert keys.valid("old")  # not re-read within the recheck interval
    now[0] += 1.5
    assert keys.valid("new") and keys.valid("kept") and not keys.valid("old")

    path.unlink()
    now[0] += 1.5
    assert not keys.valid("kept")  # unreadable: nothing is valid until it is back


def test_env_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLD_TEST_KEYS", "a,b")
    keys = ApiKeys(AuthSpec(api_keys_env="RLD_TEST_KEYS"))
    assert keys.valid("a") and keys.valid("b") and not keys.valid("a,b")
    assert not ApiKeys(AuthSpec(api_keys_env="RLD_TEST_NOT_SET")).valid("a")


class _NoMetrics:
    def update(self, *_: Any) -> None: ...

    def reject(self, *_: Any) -> None: ...


def _admission(in_flight: int, queued: int, wait_s: float = 5) -> Admission:
    admission = Admission(in_flight, queued, max_queue_wait_s=wait_s, retry_after_s=7)
    admission._gauges = _NoMetrics()  # type: ignore[assignment]  # ray metrics need a Ray worker
    return admission


def test_admission_runs_queues_in_order_then_rejects() -> None:
    async def scenario() -> list[str]:
        admission = _admission(2, 2)
        events: list[str] = []
        first = await admission.acquire()
        second = await admission.acquire()
        assert admission.would_queue()

        async def waiter(name: str) -> None:
            release = await admission.acquire()
            events.append(name)
            release()

        tasks = [asyncio.create_task(waiter(n)) for n in ("q1", "q2")]
        await asyncio.sleep(0)
        assert admission.queued == 2
        with pytest.raises(Overloaded) as full:
            await admission.acquire()
        assert full.value.status_code == 429 and full.value.headers() == {"Retry-After": "7"}
        first()
        first()  # a release is idempotent
        second()
        await asyncio.gather(*tasks)
        assert admission.in_flight == 0 and admission.queued == 0
        return events

    assert asyncio.run(scenario()) == ["q1", "q2"]


def test_admission_queue_wait_is_bounded_and_cancellation_frees_the_place() -> None:
    async def scenario() -> None:
        admission = _admission(1, 2, wait_s=0.2)
        release = await admission.acquire()
        with pytest.raises(Overloaded):
            await admission.acquire()  # waited 0.2 s
        assert admission.queued == 0
        task = asyncio.create_task(admission.acquire())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert admission.queued == 0
        release()
        assert admission.in_flight == 0

    asyncio.run(scenario())



def test_a_role_is_down_only_after_two_reads_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Down takes two reads in a row; a request is turned away only after a read that started after it
    arrived (the app's first seconds: the loadtests' warm-up request once got a 503 from a stale read)."""
    from types import SimpleNamespace

    from serve_app import roles

    running = {"n": 0}

    def fake_status() -> Any:
        deployment = SimpleNamespace(replica_states={"RUNNING": running["n"]}, status="UPDATING", message="starting")
        return SimpleNamespace(applications={"app": SimpleNamespace(deployments={"Decode:m": deployment})})

    monkeypatch.setattr(roles, "_serve_status", fake_status)

    async def scenario() -> None:
        watch = roles.RoleWatch({"decode": "Decode:m"}, poll_s=3600, app_name="app")
        watch._publish = lambda *_: None  # type: ignore[method-assign]  # ray metrics need a Ray worker
        await watch.poll()
        assert watch.unavailable("decode") is None  # one read: not enough to turn requests away
        await watch.poll()
        down = watch.unavailable("decode")
        assert down is not None and "Decode:m" in down.describe()
        # A request sent before the last read sees it; one sent after does not, until the next read.
        assert watch.unavailable("decode", since=down.checked_at) is not None
        assert watch.unavailable("decode", since=down.checked_at + 1) is None
        # The replica comes up after the last read: a request that would be turned away reads again first.
        running["n"] = 1
        assert watch.unavailable("decode") is not None  # the cached read is stale
        assert await watch.confirmed_unavailable("decode") is None
        assert watch.unavailable("decode") is None and watch.unavailable("decode", since=0.0) is None
        running["n"] = 0
        await watch.poll()
        assert await watch.confirmed_unavailable("decode") is None  # one read down again: not yet
        await watch.poll()
        assert await watch.confirmed_unavailable("decode") is not None

    asyncio.run(scenario())
