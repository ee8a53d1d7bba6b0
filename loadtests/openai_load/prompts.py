"""Prompts that hit a target prompt-token count, calibrated against the server's own tokenizer.

A prompt is `instruction` followed by random words from a pool (" w1 w2 ..."), wrapped in the
chat template (chat API) or sent as-is (completions API). Random words make every prompt unique,
so the server's prefix cache does not shorten prefills.

Calibration, done once per load-generator process, picks the first method that works:

1. `tokenize-exact` — the server has a working vLLM-style `POST /tokenize`. Tokenize every pool
   word (with its leading space) and keep the words that are exactly one token; measure the fixed
   overhead (instruction + chat template + special tokens) by tokenizing the prompt with an empty
   body; then check that a sample prompt of n such words is exactly overhead + n tokens. With
   tokenizers that do not merge across spaces (byte-level BPE, SentencePiece) that holds, and
   every prompt then has exactly the target count.
2. `tokenize-linear` — /tokenize works but step 1's check fails (too few single-token words, or
   a tokenizer that merges across spaces): tokens per word is measured on a 200-word sample and
   prompts hit the target on average (typically within a few percent).
3. `usage-exact` — no usable /tokenize (hosted APIs; Ray Serve LLM 2.58 exposes /tokenize but it
   fails for chat and, with vLLM 0.26, for completions too): the same single-token-word idea,
   measured with `usage.prompt_tokens` of `max_tokens: 1` requests: the empty prompt gives the
   overhead, a body of one word repeated 8 times tells whether that word is one token (about 25
   requests in all), and a 200-word sample must again add exactly 200 tokens.
4. `usage-linear` — if that check fails: two probe requests of 16 and 256 random words, and a line
   through their prompt_tokens. Same accuracy as 2.

Every request's real prompt size is still recorded (usage.prompt_tokens, as the `TTFT` entry's
content size), so the achieved size is visible whatever the method.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .profiles import Api

log = logging.getLogger("openai_load")

Method = Literal["tokenize-exact", "tokenize-linear", "usage-exact", "usage-linear"]

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
USAGE_EXACT_WORDS = 24  # single-token words to collect with usage probes (one request each)
USAGE_PROBE_LIMIT = 64  # pool words tried at most


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

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "overhead": self.overhead, "tokens_per_word": self.tokens_per_word,
                "words": list(self.words), "max_model_len": self.max_model_len}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Calibration:
        return cls(d["method"], float(d["overhead"]), float(d["tokens_per_word"]), tuple(d["words"]),
                   d.get("max_model_len"))

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
    """Pick the best method the server supports (see the module docstring)."""
    rng = random.Random(seed)
    try:
        cal = _calibrate_by_tokenize(probe, api, instruction, rng)
    except ProbeUnavailable as e:
        log.info("prompt calibration: /tokenize not usable (%s); using usage.prompt_tokens", e)
        cal = None
    return cal or _calibrate_by_usage(probe, api, instruction, rng)


class ProbeUnavailable(Exception):
    """The server has no working /tokenize for this model."""


def _tokens(probe: TokenizerProbe, fragment: dict[str, Any], add_special_tokens: bool | None = None) -> int:
    got = probe.tokenize(fragment, add_special_tokens=add_special_tokens)
    if got is None:
        raise ProbeUnavailable("no /tokenize endpoint")
    return int(got["count"])


def _calibrate_by_tokenize(probe: TokenizerProbe, api: Api, instruction: str,
                           rng: random.Random) -> Calibration | None:
    empty = probe.tokenize(render(api, instruction, ""))
    if empty is None:
        raise ProbeUnavailable("no /tokenize endpoint")
    overhead = int(empty["count"])
    max_len = int(empty["max_model_len"]) if empty.get("max_model_len") else None
    single = tuple(w for w in WORD_POOL if _tokens(probe, {"prompt": " " + w}, add_special_tokens=False) == 1)
    n = 200
    if len(single) >= MIN_EXACT_WORDS:
        if _tokens(probe, render(api, instruction, _body(_sample(rng, single, n)))) == overhead + n:
            return Calibration("tokenize-exact", float(overhead), 1.0, single, max_len)
    got = _tokens(probe, render(api, instruction, _body(_sample(rng, WORD_POOL, n))))
    return Calibration("tokenize-linear", float(overhead), (got - overhead) / n, WORD_POOL, max_len)


def _calibrate_by_usage(probe: TokenizerProbe, api: Api, instruction: str, rng: random.Random) -> Calibration:
    """From usage.prompt_tokens of `max_tokens: 1` requests.

    `usage-exact`: a body of one word repeated REPEAT times adds exactly REPEAT tokens when the
    word (with its leading space) is one token; collect USAGE_EXACT_WORDS such words (about that
    many requests), then check a random 200-word sample of them. Otherwise `usage-linear`.
    """
    overhead = probe.prompt_tokens(render(api, instruction, ""))
    repeat, single = 8, []
    for w in WORD_POOL[:USAGE_PROBE_LIMIT]:
        if probe.prompt_tokens(render(api, instruction, _body([w] * repeat))) == overhead + repeat:
            single.append(w)
            if len(single) >= USAGE_EXACT_WORDS:
                break
    n = 200
    if len(single) >= MIN_EXACT_WORDS:
        words = tuple(single)
        if probe.prompt_tokens(render(api, instruction, _body(_sample(rng, words, n)))) == overhead + n:
            return Calibration("usage-exact", float(overhead), 1.0, words, None)
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
