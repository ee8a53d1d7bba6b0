"""`LocalServerHandle`: the serving replica's own methods behind DeploymentHandle's interface, as
`BoundedOpenAiIngress` uses it (no Ray needed: plain asyncio)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from serve_app.engine.direct import LocalServerHandle
from serve_app.frontend.deadlines import bounded_chunks


class Server:
    """Shaped like LLMServer: chat() is a coroutine returning an async generator; check_health() unary."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.produced = 0

    async def chat(self, request: Any, raw: Any = None) -> AsyncIterator[str]:
        async def stream() -> AsyncIterator[str]:
            try:
                for i in range(request):
                    self.produced += 1
                    yield f"chunk-{i}"
                    await asyncio.sleep(0)
            finally:
                self.closed.append("chat")  # vLLM aborts the request here

        return stream()

    async def check_health(self) -> str:
        return "healthy"

    async def stalls(self, request: Any, raw: Any = None) -> AsyncIterator[str]:
        async def stream() -> AsyncIterator[str]:
            try:
                await asyncio.sleep(3600)
                yield "never"
            finally:
                self.closed.append("stalls")

        return stream()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_options_are_ignored_and_calls_reach_the_replica_itself() -> None:
    server = Server()
    handle = LocalServerHandle(server).options(stream=True).options(session_id="s", multiplexed_model_id="m")

    async def go() -> tuple[list[str], str]:
        chunks = [c async for c in handle.chat.remote(3, None)]
        return chunks, await handle.check_health.remote()

    assert run(go()) == (["chunk-0", "chunk-1", "chunk-2"], "healthy")
    assert server.closed == ["chat"]


def test_private_names_are_not_forwarded() -> None:
    with pytest.raises(AttributeError):
        LocalServerHandle(Server())._engine  # noqa: B018


def test_ending_a_stream_early_closes_the_engine_stream() -> None:
    server = Server()

    async def go() -> list[str]:
        got = []
        async for chunk in bounded_chunks(LocalServerHandle(server).chat.remote(100, None), first_s=5, between_s=5,
                                          what="test"):
            got.append(chunk)
            if len(got) == 2:
                break
        await asyncio.sleep(0)
        return got

    assert run(go()) == ["chunk-0", "chunk-1"]
    assert server.closed == ["chat"] and server.produced < 100


def test_a_silent_engine_hits_the_first_chunk_deadline_and_is_closed() -> None:
    from serve_app.frontend.errors import OpenAIError

    server = Server()

    async def go() -> None:
        async for _ in bounded_chunks(LocalServerHandle(server).stalls.remote(None, None), first_s=0.2, between_s=5,
                                      what="test"):
            pass

    with pytest.raises(OpenAIError) as raised:
        run(go())
    assert raised.value.status_code == 503 and "sent nothing" in raised.value.message
    assert server.closed == ["stalls"]


def test_cancel_before_iterating_never_runs_the_call() -> None:
    server = Server()

    async def go() -> None:
        response = LocalServerHandle(server).chat.remote(3, None)
        response.cancel()
        await asyncio.sleep(0)

    run(go())
    assert server.produced == 0
