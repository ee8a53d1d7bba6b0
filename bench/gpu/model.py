"""Model for the GPU bench when none is given: a config of a real model's shape with dummy weights.

vLLM's `load_format: dummy` fills the weights with seeded random values, so no checkpoint has to be
downloaded or shipped: the bench needs only `config.json` and a tokenizer. The tokenizer is the tiny
test model's (2048 tokens, trained locally, devstack/tiny_model.py), which sets the vocabulary;
everything else has the named model's dimensions, so prefill, KV size and decode cost are that
model's (an 8B Llama-3 shape with a 2k vocabulary has ~7.0 B parameters, 128 KiB of KV per token).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                      rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                       rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def dummy_model(shape: str, dest: Path, max_positions: int, tokenizer_dir: Path) -> Path:
    """Write `dest/` with the tiny tokenizer and a config of `shape`'s dimensions; returns `dest`."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy2(tokenizer_dir / name, dest / name)
    config = json.loads((tokenizer_dir / "config.json").read_text())
    config.update(SHAPES[shape], max_position_embeddings=max_positions)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest
