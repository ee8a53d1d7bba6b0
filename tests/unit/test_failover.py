"""Decode's wait for its KV after a remote prefill answered (serve_app/engine/failover.py,
`PrefillFailover._first_decode_chunk`): a request whose KV peer vanished is prefilled locally (or gets a 503 naming
the prefill role) within a bounded time, never a hang until the ingress's 300 s first-token deadline. Pure: fake
handles and streams; the decode engine's stream is a generator that never yields, as decode's KV pull from a
prefill pod that was deleted mid-transfer did on the real node (tests/e2e/test_recovery.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, AsyncIterator, Optional

import pytest

from serve_app.config import FailoverSpec
from serve_app.engine import failover as failover_module
from serve_app.roles import RoleState
from serve_app.upstream import CompletionRequest, ErrorResponse, LLMServer

KV_PARAMS = {"remote_engine_id": "prefill-engine-0", "remote_host": "10.244.0.9", "remote_block_ids": [[1, 2]]}


class Selection:
    replica_id = "Prefill#p0"


class Context:
    async def __aenter__(self) -> Selection:
        return Selection()

    async def __aexit__(self, *exc: Any) -> None:
        return None


class PrefillAnswer:
    """Prefill's one-token answer with the KV's whereabouts, as Ray's PDPrefillServer returns it."""

    def __init__(self) -> None:
        self._chunks = [SimpleNamespace(kv_transfer_params=KV_PARAMS)]

    def __aiter__(self) -> "PrefillAnswer":
        return self

    async def __anext__(self) -> Any:
        if not self._chunks:
            raise StopAsyncIteration
        return self._chunks.pop()

    def cancel(self) -> None:
        pass


class PrefillMethod:
    def __init__(self) -> None:
        self.dispatched = 0

    def choose_replica(self, request: Any, raw: Any) -> Context:
        return Context()

    def dispatch(self, selection: Selection, request: Any, raw: Any) -> PrefillAnswer:
        self.dispatched += 1
        return PrefillAnswer()


class Handle:
    deployment_name = "Prefill:tiny"

    def __init__(self) -> None:
        self.completions = PrefillMethod()

    def options(self, **_: Any) -> "Handle":
        return self


class Backend:
    requires_peer_binding = False
    concurrent_handoff = False

    def prepare_prefill_request(self, *, request: Any, peer: Any) -> Any:
        return request.model_copy(deep=True)

    def prepare_decode_request(self, *, request: Any, peer: Any, prefill_response: Any) -> Any:
        decode = request.model_copy(deep=True)
        decode.kv_transfer_params = prefill_response.kv_transfer_params
        return decode


class Server:
    def _get_connector_backend(self) -> Backend:
        return Backend()

    def _request_prefill_token_ids(self, request: Any) -> None:
        return None

    def _decode_reuse_ids(self, chunk: Any) -> None:
        return None


class Roles:
    """The prefill role as RoleWatch reports it: down from `down_at` (monotonic) on."""

    def __init__(self, down_at: Optional[float] = None) -> None:
        self.down_at = down_at

    def unavailable(self, role: str, *, since: Optional[float] = None) -> Optional[RoleState]:
        now = time.monotonic()
        if self.down_at is None or now < self.down_at or (since is not None and now < since):
            return None
        return RoleState("Prefill:tiny", 0, "UNHEALTHY", "replica died", now, confirmed=True)


class Decode:
    """The decode engine as LLMServer.completions runs it: with kv_transfer_params it waits for the KV pull
    (`pull_s`, None: forever, the peer is gone), then streams; without them it prefills locally."""

    def __init__(self, pull_s: Optional[float]) -> None:
        self.pull_s = pull_s
        self.calls: list[str] = []
        self.aborted: list[str] = []

    async def completions(self, server: Any, request: Any, raw: Any) -> AsyncIterator[Any]:
        kind = "remote-kv" if request.kv_transfer_params else "local"
        self.calls.append(kind)

        async def stream() -> AsyncIterator[Any]:
            try:
                if kind == "remote-kv":
                    if self.pull_s is None:
                        await asyncio.Event().wait()  # the read from a vanished peer never completes
                    await asyncio.sleep(self.pull_s)
                yield f"data: {kind} token 1\n\n"
                yield f"data: {kind} token 2\n\n"
            except (asyncio.CancelledError, GeneratorExit):
                self.aborted.append(kind)  # vLLM aborts the request and frees its blocks
                raise

        return stream()


def run(spec: FailoverSpec, decode: Decode, roles: Roles, *, stream: bool, monkeypatch: pytest.MonkeyPatch,
        warming_s: Optional[float] = None, handle: Optional[Handle] = None):
    """One request through the ladder; `warming_s`: decode's NIXL pre-warm still runs for that long."""
    monkeypatch.setattr(LLMServer, "completions", decode.completions)
    counted: list[str] = []
    paths: list[str] = []

    async def go() -> list[Any]:
        ladder = failover_module.PrefillFailover(spec, handle or Handle(), model="tiny")  # type: ignore[arg-type]
        ladder.roles = roles  # type: ignore[assignment]
        if warming_s is not None:
            warming = ladder.kv_warming = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(warming_s, lambda: warming.done() or warming.set_result(None))
            if warming_s == 0:
                warming.set_result(None)
        ladder._counters.inc = lambda reason, served_by: counted.append(f"{reason}->{served_by}")  # type: ignore[method-assign]
        request = CompletionRequest(model="tiny", prompt="hello " * 50, max_tokens=2, stream=stream)
        return [c async for c in ladder.run(Server(), request, None, paths.append)]

    t0 = time.monotonic()
    chunks = asyncio.run(asyncio.wait_for(go(), timeout=20))
    return chunks, counted, paths, time.monotonic() - t0


def test_a_healthy_hand_off_streams_decodes_tokens_and_counts_no_failover(monkeypatch: pytest.MonkeyPatch) -> None:
    decode = Decode(pull_s=0.05)
    chunks, counted, paths, _ = run(FailoverSpec(kv_transfer_timeout_s=5), decode, Roles(), stream=True,
                                    monkeypatch=monkeypatch)
    assert chunks == ["data: remote-kv token 1\n\n", "data: remote-kv token 2\n\n"]
    assert (decode.calls, decode.aborted, counted, paths) == (["remote-kv"], [], [], ["remote"])


def test_a_kv_peer_that_went_away_is_left_at_once_and_the_request_prefilled_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefill pod is deleted right after it answered: decode's pull never completes; Serve's status soon
    shows no running prefill replica, and decode gives up the pull then, long before kv_transfer_timeout_s."""
    decode = Decode(pull_s=None)
    chunks, counted, paths, took = run(FailoverSpec(kv_transfer_timeout_s=30, status_poll_s=0.1), decode,
                                       Roles(down_at=time.monotonic() + 0.3), stream=True, monkeypatch=monkeypatch)
    assert chunks == ["data: local token 1\n\n", "data: local token 2\n\n"]
    assert decode.calls == ["remote-kv", "local"] and decode.aborted == ["remote-kv"]  # the stuck pull was aborted
    assert counted == ["kv_peer_lost->fallback"] and paths == ["fallback"]
    assert took < 5, f"left the vanished peer only after {took:.1f}s"


def test_a_stalled_pull_ends_at_the_kv_transfer_deadline_even_while_the_role_looks_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another prefill replica keeps the role up (or Serve has not noticed yet): the deadline still bounds it."""
    decode = Decode(pull_s=None)
    chunks, counted, paths, took = run(FailoverSpec(kv_transfer_timeout_s=0.5, status_poll_s=0.1), decode, Roles(),
                                       stream=True, monkeypatch=monkeypatch)
    assert chunks[0] == "data: local token 1\n\n" and counted == ["kv_timeout->fallback"]
    assert decode.aborted == ["remote-kv"] and 0.5 <= took < 5


def test_without_local_fallback_a_lost_kv_peer_is_a_503_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    decode = Decode(pull_s=None)
    chunks, counted, _, took = run(FailoverSpec(local_fallback=False, status_poll_s=0.1), decode,
                                   Roles(down_at=time.monotonic() + 0.3), stream=True, monkeypatch=monkeypatch)
    assert len(chunks) == 1 and isinstance(chunks[0], ErrorResponse), chunks
    assert chunks[0].error.code == 503 and chunks[0].error.type == "prefill_unavailable"
    message = chunks[0].error.message
    assert "went away before decode loaded it" in message and "Retry after" in message, message
    assert "Prefill#p0" not in message  # the replica is named in decode's log, not to the client
    assert counted == ["kv_peer_lost->error"] and decode.calls == ["remote-kv"] and took < 5


def test_a_slow_non_streamed_generation_is_not_cut_by_the_kv_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-streamed answer is one chunk at the end of generation: past the window only the ingress's
    non-stream deadline bounds it (a long healthy generation is not an engine failure)."""
    decode = Decode(pull_s=0.8)
    chunks, counted, paths, _ = run(FailoverSpec(kv_transfer_timeout_s=0.3, status_poll_s=0.1), decode, Roles(),
                                    stream=False, monkeypatch=monkeypatch)
    assert chunks[0] == "data: remote-kv token 1\n\n" and counted == [] and paths == ["remote"]
    assert decode.aborted == []


@pytest.mark.parametrize("warming_s, path, prefilled", [(30, "fallback", 0), (0, "remote", 1)])
def test_while_the_nixl_pre_warm_runs_decode_prefills_locally(
    warming_s: float, path: str, prefilled: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new decode replica serves before its pre-warm handshake with prefill is done (it runs in the background);
    a KV pull started meanwhile stalled for good on the real node, so those requests are prefilled locally. Once
    the pre-warm is done, the remote path is back."""
    decode, handle = Decode(pull_s=0.05), Handle()
    chunks, counted, paths, took = run(FailoverSpec(kv_transfer_timeout_s=5), decode, Roles(), stream=True,
                                       monkeypatch=monkeypatch, warming_s=warming_s, handle=handle)
    assert paths == [path] and handle.completions.dispatched == prefilled
    if path == "fallback":
        assert chunks[0] == "data: local token 1\n\n" and counted == ["kv_handshake_pending->fallback"]
        assert decode.calls == ["local"] and took < 5  # not waiting for the pre-warm
    else:
        assert counted == [] and decode.calls == ["remote-kv"]
