"""Workload profiles: prompt and output sizes, in tokens, for OpenAI-compatible load tests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Api = Literal["chat", "completions"]


@dataclass(frozen=True)
class Profile:
    """One workload shape. Token counts are targets: the prompt generator aims at `input_tokens`
    prompt tokens (chat template included), and requests ask for `output_tokens` new tokens."""

    name: str
    input_tokens: int
    output_tokens: int
    instruction: str
    description: str

    def __post_init__(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"profile {self.name!r}: input_tokens ({self.input_tokens}) and "
                f"output_tokens ({self.output_tokens}) must be >= 1"
            )

    def with_sizes(self, input_tokens: int | None = None, output_tokens: int | None = None) -> Profile:
        """The same profile with the sizes that are given (None or 0 keeps the profile's)."""
        return replace(
            self,
            input_tokens=input_tokens or self.input_tokens,
            output_tokens=output_tokens or self.output_tokens,
        )

    def clamp_to(self, max_model_len: int, margin: int = 8) -> Profile:
        """Shrink the input so that input + output fits the model's context (`margin` tokens spare)."""
        room = max_model_len - self.output_tokens - margin
        if room < 1:
            raise ValueError(
                f"profile {self.name!r}: output_tokens {self.output_tokens} does not fit "
                f"max_model_len {max_model_len}"
            )
        return replace(self, input_tokens=min(self.input_tokens, room))


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="chat",
            input_tokens=512,
            output_tokens=512,
            instruction="Answer the following message.",
            description="conversational turn, input:output about 1:1",
        ),
        Profile(
            name="summarize",
            input_tokens=2000,
            output_tokens=100,
            instruction="Summarize the following text.",
            description="summarization, input:output about 20:1 (prefill heavy)",
        ),
        Profile(
            name="long_context",
            input_tokens=16000,
            output_tokens=256,
            instruction="Answer a question about the following document.",
            description="long document; clamped to the server's max_model_len when it reports one",
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None
