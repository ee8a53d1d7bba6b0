"""serve_app.engine.servers.out_of_vocab: token-id prompts are checked against the model's vocabulary before the
engine sees them (vLLM 0.29 let the id one past the last through, and the engine died reading its embedding table
out of bounds: the resilience fuzz's `[65, 260, 181, 2048, 138]` on the 2048-token model)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serve_app.engine.servers import client_error, out_of_vocab
from serve_app.upstream import ChatCompletionRequest, CompletionRequest


def server(vocab: int | None) -> SimpleNamespace:
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab) if vocab is not None else None
    return SimpleNamespace(engine=SimpleNamespace(_engine_client=SimpleNamespace(model_config=model_config)))


def completion(prompt) -> CompletionRequest:
    return CompletionRequest(model="tiny", prompt=prompt, max_tokens=2)


def test_ids_past_the_vocabulary_are_refused_naming_the_range() -> None:
    why = out_of_vocab(server(2048), completion([65, 260, 181, 2048, 138]))
    assert why is not None and "2048" in why and "0 to 2047" in why
    assert out_of_vocab(server(2048), completion([[1, 2], [3, 99999]])) is not None  # batched prompts too


def test_ids_within_the_vocabulary_text_and_chat_pass() -> None:
    assert out_of_vocab(server(2048), completion([0, 2047, 5])) is None
    assert out_of_vocab(server(2048), completion("hello 2048")) is None
    assert out_of_vocab(server(2048), completion(["a", "b"])) is None
    chat = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert out_of_vocab(server(2048), chat) is None


def test_without_an_engine_vllms_own_check_stands() -> None:
    assert out_of_vocab(server(None), completion([99999])) is None
    assert out_of_vocab(SimpleNamespace(), completion([99999])) is None


def test_the_refusal_is_one_400_chunk_naming_the_param() -> None:
    async def first():
        return [chunk async for chunk in client_error("Token id 2048 is out of vocabulary", "prompt")]

    (chunk,) = asyncio.run(first())
    assert chunk.error.code == 400 and chunk.error.param == "prompt" and "2048" in chunk.error.message
