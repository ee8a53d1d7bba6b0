"""Containment, not replay: a request whose own execution killed an engine is not retried or failed over, and
is refused once it has done so `strikes` times (serve_app/frontend/containment.py, deadlines.py, and the
prefill ladder in serve_app/engine/failover.py). Pure: fake streams and handles, injected clocks."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional

import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from serve_app.upstream import CompletionRequest, EngineDeadError, ErrorInfo, ErrorResponse
from serve_app.config import ContainmentSpec, FailoverSpec
from serve_app.frontend.containment import (
    Containment,
    EngineDeadBeforeDispatch,
    Quarantined,
    dead_before_dispatch,
    engine_died_running,
    fingerprint,
)
from serve_app.frontend.deadlines import Retryable, bounded_chunks
from serve_app.frontend.errors import KILLED_ENGINE_TYPE, EngineUnavailable, KilledEngine


def remote(cause: BaseException) -> RayTaskError:
    """What a DeploymentHandle call raises when the replica's method raised `cause`."""
    return RayTaskError("chat", "Traceback (most recent call last): ... pid=1234 ip=10.0.0.7", cause).as_instanceof_cause()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- which failures are the request's doing ----


def test_an_engine_that_died_running_the_request_is_told_apart_from_one_dead_before() -> None:
    assert engine_died_running(remote(EngineDeadError()))
    assert engine_died_running(EngineDeadError())
    assert not engine_died_running(remote(EngineDeadBeforeDispatch("dead already")))
    assert dead_before_dispatch(remote(EngineDeadBeforeDispatch("dead already")))
    assert not engine_died_running(ActorDiedError())  # Ray cannot tell before from during: retried as before
    assert not engine_died_running(remote(ValueError("bad request")))


# ---- fingerprints and strikes ----


def test_a_fingerprint_ignores_delivery_fields_and_key_order() -> None:
    a = {"model": "m", "prompt": "p" * 100, "echo": True, "logprobs": 1, "stream": True, "user": "u1"}
    b = {"logprobs": 1, "echo": True, "prompt": "p" * 100, "model": "m", "stream": False}
    assert fingerprint("completions", a) == fingerprint("completions", b)
    assert fingerprint("completions", a) != fingerprint("completions", {**a, "prompt": "q"})
    assert fingerprint("completions", a) != fingerprint("chat", a)


def test_strikes_then_refusal_then_forgiveness() -> None:
    clock, events = Clock(), []
    containment = Containment(ContainmentSpec(strikes=2, quarantine_s=600), clock=clock, counter=events.append)
    key = fingerprint("completions", {"prompt": "poison"})
    containment.check(key)  # never seen
    containment.killed_engine(key)
    containment.check(key)  # one strike: an innocent request on the same engine looks the same
    clock.now += 10
    containment.killed_engine(key)
    with pytest.raises(Quarantined) as refused:
        containment.check(key)
    assert refused.value.status_code == 400 and refused.value.code == "request_quarantined"
    assert events == ["killed_engine", "killed_engine", "refused"]
    assert containment.strikes(fingerprint("completions", {"prompt": "other"})) == 0
    clock.now += 601
    containment.check(key)  # the window ended
    assert containment.strikes(key) == 0


def test_strikes_expire_between_deaths() -> None:
    clock = Clock()
    containment = Containment(ContainmentSpec(strikes=2, quarantine_s=60), clock=clock, counter=lambda _: None)
    containment.killed_engine("k")
    clock.now += 61
    containment.killed_engine("k")
    containment.check("k")  # two deaths, but not within one window


def test_fingerprints_are_bounded() -> None:
    containment = Containment(ContainmentSpec(strikes=1, max_fingerprints=16), clock=Clock(), counter=lambda _: None)
    for i in range(100):
        containment.killed_engine(f"k{i}")
    assert containment.strikes("k0") == 0 and containment.strikes("k99") == 1
    with pytest.raises(Quarantined):
        containment.check("k99")


def test_disabled_containment_counts_but_never_refuses() -> None:
    events: list[str] = []
    containment = Containment(ContainmentSpec(enabled=False, strikes=1), clock=Clock(), counter=events.append)
    containment.killed_engine("k")
    containment.check("k")
    assert events == ["killed_engine"]


# ---- the frontend's stream wrapper: no retry of a death the request caused ----


async def failing(exc: BaseException, before: list[Any] = ()) -> AsyncIterator[Any]:
    for chunk in before:
        yield chunk
    raise exc


async def drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [chunk async for chunk in stream]


def run_bounded(stream: AsyncIterator[Any]) -> tuple[Optional[BaseException], list[Any], int]:
    killed = []

    async def go() -> list[Any]:
        return await drain(bounded_chunks(stream, first_s=5, between_s=5, what="chat request",
                                          on_killed=lambda: killed.append(1)))

    try:
        return None, asyncio.run(go()), len(killed)
    except Exception as exc:  # noqa: BLE001
        return exc, [], len(killed)


def test_a_death_the_request_caused_is_not_retryable_and_strikes_once() -> None:
    error, _, killed = run_bounded(failing(remote(EngineDeadError())))
    assert isinstance(error, KilledEngine) and not isinstance(error, Retryable)
    assert error.status_code == 503 and error.code == "engine_failed_on_request"
    assert killed == 1
    assert "pid" not in error.message and "10.0.0.7" not in error.message and "Traceback" not in error.message


def test_a_replica_gone_before_the_request_is_retryable_and_strikes_nothing() -> None:
    for exc in (remote(EngineDeadBeforeDispatch("already dead")), ActorDiedError()):
        error, _, killed = run_bounded(failing(exc))
        assert isinstance(error, Retryable), exc
        assert killed == 0


def test_an_in_band_engine_death_as_the_first_chunk_is_contained() -> None:
    chunk = ErrorResponse(error=ErrorInfo(message="EngineCore encountered an issue. See stack trace", type="x", code=500))
    error, _, killed = run_bounded(_yielding([chunk]))
    assert isinstance(error, KilledEngine) and killed == 1


def test_a_mid_stream_death_ends_the_stream_and_strikes() -> None:
    error, chunks, killed = run_bounded(failing(remote(EngineDeadError()), before=["data: {}\n\n"]))
    assert error is None and killed == 1
    assert chunks[0] == "data: {}\n\n" and isinstance(chunks[-1], ErrorResponse)


def test_decodes_report_of_a_prefill_engine_killed_by_the_request_is_contained() -> None:
    chunk = ErrorResponse(error=ErrorInfo(message="prefill engine failed", type=KILLED_ENGINE_TYPE, code=503))
    error, _, killed = run_bounded(_yielding([chunk]))
    assert isinstance(error, KilledEngine) and killed == 1


def test_other_engine_errors_are_503_without_their_text() -> None:
    chunk = ErrorResponse(error=ErrorInfo(message="CUDA error at 10.1.2.3 pid=77 /usr/lib/x.so", type="x", code=500))
    error, _, killed = run_bounded(_yielding([chunk]))
    assert isinstance(error, EngineUnavailable) and not isinstance(error, KilledEngine)
    assert "10.1.2.3" not in error.message and "pid" not in error.message and killed == 0


async def _yielding(chunks: list[Any]) -> AsyncIterator[Any]:
    for chunk in chunks:
        yield chunk


# ---- the prefill ladder on decode: no retry, no local fallback for a request that killed prefill ----


class FakeSelection:
    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id


class FakeContext:
    def __init__(self, replica_id: str) -> None:
        self._selection = FakeSelection(replica_id)

    async def __aenter__(self) -> FakeSelection:
        return self._selection

    async def __aexit__(self, *exc: Any) -> None:
        return None


class FakeResponse:
    def __init__(self, exc: BaseException) -> None:
        self._exc = exc
        self.cancelled = False

    def __aiter__(self) -> "FakeResponse":
        return self

    async def __anext__(self) -> Any:
        raise self._exc

    def cancel(self) -> None:
        self.cancelled = True


class FakePrefillMethod:
    """Replicas p0, p1, ... in turn; every call fails with `exc`."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.dispatched: list[str] = []
        self._next = 0

    def choose_replica(self, request: Any, raw: Any) -> FakeContext:
        replica = f"p{self._next}"
        self._next += 1
        return FakeContext(replica)

    def dispatch(self, selection: FakeSelection, request: Any, raw: Any) -> FakeResponse:
        self.dispatched.append(selection.replica_id)
        return FakeResponse(self.exc)


class FakeHandle:
    deployment_name = "prefill"

    def __init__(self, method: FakePrefillMethod) -> None:
        self.completions = method

    def options(self, **_: Any) -> "FakeHandle":
        return self


class FakeBackend:
    requires_peer_binding = False
    concurrent_handoff = False

    def prepare_prefill_request(self, *, request: Any, peer: Any) -> Any:
        return request


class FakeServer:
    def _get_connector_backend(self) -> FakeBackend:
        return FakeBackend()

    def _request_prefill_token_ids(self, request: Any) -> None:
        return None


class NoRoles:
    def unavailable(self, role: str, **_: Any) -> None:
        return None


def run_ladder(exc: BaseException, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[str], list[str]]:
    from serve_app.upstream import LLMServer

    from serve_app.engine import failover as failover_module

    local: list[str] = []

    async def local_completions(server: Any, request: Any, raw: Any) -> AsyncIterator[Any]:
        local.append("fallback")

        async def one() -> AsyncIterator[Any]:
            yield "data: local\n\n"

        return one()

    monkeypatch.setattr(LLMServer, "completions", local_completions)
    counted: list[str] = []
    method = FakePrefillMethod(exc)

    async def go() -> list[Any]:
        ladder = failover_module.PrefillFailover(FailoverSpec(), FakeHandle(method), model="m")  # type: ignore[arg-type]
        ladder.roles = NoRoles()  # type: ignore[assignment]
        ladder._counters.inc = lambda reason, served_by: counted.append(f"{reason}->{served_by}")  # type: ignore[method-assign]
        request = CompletionRequest(model="m", prompt="poison", max_tokens=4)
        return [chunk async for chunk in ladder.run(FakeServer(), request, None, lambda path: None)]

    chunks = asyncio.run(go())
    return chunks, method.dispatched + local, counted


def test_prefill_death_caused_by_the_request_is_not_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks, calls, counted = run_ladder(remote(EngineDeadError()), monkeypatch)
    assert calls == ["p0"]  # one prefill engine, no retry on p1, no local fallback on decode
    assert counted == ["killed_engine->contained"]
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorResponse)
    assert chunks[0].error.type == KILLED_ENGINE_TYPE and chunks[0].error.code == 503


def test_prefill_replica_that_was_already_dead_still_fails_over(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks, calls, counted = run_ladder(remote(EngineDeadBeforeDispatch("already dead")), monkeypatch)
    assert calls == ["p0", "p1", "fallback"]  # another replica, then decode itself: the ladder as before
    assert counted == ["replica_failed->fallback", "replica_failed->fallback"]
    assert chunks == ["data: local\n\n"]


@pytest.mark.parametrize("started", [False, True])
def test_a_validation_error_the_engine_raises_is_the_clients_400_before_the_first_chunk(started: bool) -> None:
    """vLLM raises its request errors (VLLMValidationError: a VLLMClientError, no longer a ValueError since 0.29,
    and still a ValueError before): before anything was sent that is the client's 400, not "the engine failed"."""
    from serve_app.frontend.deadlines import _engine_failure
    from serve_app.upstream import VLLMClientError

    class TooLong(VLLMClientError):
        pass

    for cause in (TooLong("This model's maximum context length is 512 tokens"), ValueError("bad prompt")):
        error = _engine_failure(remote(cause), "completions request", 60.0, started)
        if started:
            assert isinstance(error, EngineUnavailable)
        else:
            assert error.status_code == 400, error.message
            assert str(cause) in error.message
