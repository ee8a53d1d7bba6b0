"""Prompts that hit a target prompt-token count, calibrated against the server's own tokenizer.

A prompt is `instruction` followed by random words from a pool (" w1 w2 ..."), wrapped in the
chat template (chat API) or sent as-is (completions API). Random words make every prompt unique,
so the server's prefix cache does not shorten prefills.

Calibration, done once per load-generator process, picks one of three methods:

1. `tokenize-exact` — the server has vLLM's `POST /tokenize`. Tokenize every pool word (with its
   leading space) and keep the words that are exactly one token; measure the fixed overhead
   (instruction + chat template + special tokens) by tokenizing the prompt with an empty body;
   then check that a sample prompt of n such words is exactly overhead + n tokens. With BPE
   tokenizers that split on spaces (GPT-2/Llama-3 style) that holds, and every prompt then has
   exactly the target count.
2. `tokenize-linear` — /tokenize exists but step 1's check fails (e.g. a tokenizer whose words
   merge across spaces, or fewer than 16 single-token words): tokens per word is measured on a
   long sample and prompts hit the target on average (typically within a few percent).
3. `usage-linear` — no /tokenize (e.g. hosted APIs, other servers): two `max_tokens: 1`
   requests of different lengths give `usage.prompt_tokens`, and a straight line through them
   gives tokens per word and the overhead. Same accuracy as 2.

Every request's real prompt size is still recorded (usage.prompt_tokens, as the `TTFT` entry's
content size), so the achieved size is visible whatever the method.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .profiles import Api

Method = Literal["tokenize-exact", "tokenize-linear", "usage-linear"]

# Plain lowercase words. Includes the words the project's tiny test model was trained on, so its
# tokenizer has single tokens for some of them.
WORD_POOL: tuple[str, ...] = tuple(
    """the a model token prefill decode cache request server ray vllm hello world user assistant
    system quick brown fox jumps over lazy dog one two three four five and of to in is it that
    for on with as was at by be this have from or had not but what all were when we there can an
    your which their said if do will each about how up out them then she many some so these would
    other into has more her two like him see time could no make than first been its who now people
    my made over did down only way find use may water long little very after words called just where
    most know get through back much go good new write our me man too any day same right look think
    also around another came come work three word must because does part even place well such here
    take why things help put years different away again off went old number great tell men say small
    every found still between name should home big give air line set own under read last never us left
    end along while might next sound below saw something thought both few those always looked show large
    often together asked house don world going want school important until form food keep children feet
    land side without boy once animals life enough took sometimes four head above kind began almost live
    page got earth need far hand high year mother light parts country father let night following picture
    being study second eyes soon times story boys since white days ever paper hard near sentence better
    best across during today others however sure means knew try told young miles sun ways thing whole
    hear example heard several change answer room sea against top turned learn point city play toward
    five using""".split()
)

MIN_EXACT_WORDS = 16


class TokenizerProbe(Protocol):
    """The server calls calibration needs. Implementations raise on transport errors."""

    def tokenize(self, fragment: dict[str, Any], add_special_tokens: bool | None = None) -> dict[str, Any] | None:
        """POST /tokenize with the chat `messages` or the `prompt` of `fragment` (None: the
        server's default for special tokens, as in a real request); the response JSON, or None
        when the server has no /tokenize endpoint."""
        ...

    def prompt_tokens(self, fragment: dict[str, Any]) -> int:
        """Send `fragment` as a real request with max_tokens 1; its usage.prompt_tokens."""
        ...


def render(api: Api, instruction: str, body: str) -> dict[str, Any]:
    """The request fields that carry the prompt."""
    text = instruction + body
    if api == "chat":
        return {"messages": [{"role": "user", "content": text}]}
    return {"prompt": text}


@dataclass(frozen=True)
class Calibration:
    method: Method
    overhead: float
    tokens_per_word: float
    words: tuple[str, ...]
    max_model_len: int | None = None

    def words_for(self, target_tokens: int) -> int:
        n = round((target_tokens - self.overhead) / self.tokens_per_word)
        if n < 1:
            raise ValueError(
                f"target of {target_tokens} prompt tokens is below the fixed overhead "
                f"({self.overhead:.0f} tokens of instruction and template); raise --input-tokens"
            )
        return n

    def describe(self) -> str:
        return (
            f"{self.method}: overhead {self.overhead:.1f} tokens, {self.tokens_per_word:.3f} tokens/word, "
            f"{len(self.words)} pool words"
            + (f", max_model_len {self.max_model_len}" if self.max_model_len else "")
        )


def _body(words: list[str]) -> str:
    return "".join(" " + w for w in words)


def _sample(rng: random.Random, pool: tuple[str, ...], n: int) -> list[str]:
    return [rng.choice(pool) for _ in range(n)]


def calibrate(probe: TokenizerProbe, api: Api, instruction: str, seed: int = 0) -> Calibration:
    rng = random.Random(seed)
    empty = probe.tokenize(render(api, instruction, ""))
    if empty is None:
        return _calibrate_by_usage(probe, api, instruction, rng)
    overhead = int(empty["count"])
    max_len = empty.get("max_model_len")
    max_len = int(max_len) if max_len else None

    single = tuple(
        w for w in WORD_POOL
        if int(probe.tokenize({"prompt": " " + w}, add_special_tokens=False)["count"]) == 1  # type: ignore[index]
    )
    n = 200
    if len(single) >= MIN_EXACT_WORDS:
        sample = _sample(rng, single, n)
        got = int(probe.tokenize(render(api, instruction, _body(sample)))["count"])  # type: ignore[index]
        if got == overhead + n:
            return Calibration("tokenize-exact", float(overhead), 1.0, single, max_len)
    sample = _sample(rng, WORD_POOL, n)
    got = int(probe.tokenize(render(api, instruction, _body(sample)))["count"])  # type: ignore[index]
    return Calibration("tokenize-linear", float(overhead), (got - overhead) / n, WORD_POOL, max_len)


def _calibrate_by_usage(probe: TokenizerProbe, api: Api, instruction: str, rng: random.Random) -> Calibration:
    n1, n2 = 16, 256
    p1 = probe.prompt_tokens(render(api, instruction, _body(_sample(rng, WORD_POOL, n1))))
    p2 = probe.prompt_tokens(render(api, instruction, _body(_sample(rng, WORD_POOL, n2))))
    per_word = (p2 - p1) / (n2 - n1)
    if per_word <= 0:
        raise RuntimeError(
            f"calibration from usage.prompt_tokens failed: {n1} words gave {p1} tokens and "
            f"{n2} words gave {p2}; does the server report usage?"
        )
    return Calibration("usage-linear", p1 - per_word * n1, per_word, WORD_POOL, None)


class PromptFactory:
    """Makes unique prompts of a target size from a calibration."""

    def __init__(self, calibration: Calibration, api: Api, instruction: str) -> None:
        self.calibration = calibration
        self.api = api
        self.instruction = instruction

    def make(self, target_tokens: int, rng: random.Random) -> dict[str, Any]:
        n = self.calibration.words_for(target_tokens)
        return render(self.api, self.instruction, _body(_sample(rng, self.calibration.words, n)))
