"""A 3.4 M-parameter random Llama with a locally trained byte-level BPE tokenizer and a chat template.

No hub access is needed (or allowed): weights are random, so outputs are gibberish, but greedy decoding
is deterministic, which is all the tests need. Why it looks the way it does: docs/local-stack.md.
Built once into ${RLD_CACHE}/models/tiny-llama-<recipe version>/ and reused; concurrent builders
serialise on a lock file and the folder appears atomically (built aside, then renamed).

Run as `python -m devstack.tiny_model` to print the model path (building it if missing).
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

RECIPE_VERSION = "v1"  # bump when the recipe below changes, so caches rebuild
MAX_MODEL_LEN = 2048
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

WORDS = (
    "the a model token prefill decode cache request server ray vllm hello world user assistant system quick "
    "brown fox jumps over lazy dog one two three four five and of to in is"
).split()
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def cache_dir() -> Path:
    return Path(os.environ.get("RLD_CACHE", Path.home() / ".cache" / "ray-llm-disagg"))


def model_dir() -> Path:
    return cache_dir() / "models" / f"tiny-llama-{RECIPE_VERSION}"


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)


def _build(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    random.seed(0)
    torch.manual_seed(0)
    corpus = [
        " ".join(random.choice(WORDS) for _ in range(random.randint(5, 40))) + random.choice([".", "?", "!", ""])
        for _ in range(20000)
    ]
    corpus += [f"{i} + {i * 7 % 97} = {i + i * 7 % 97}" for i in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainer=trainers.BpeTrainer(
            vocab_size=2048,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|pad|>",
        model_max_length=MAX_MODEL_LEN,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)
    cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=bos,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


def ensure_tiny_model() -> Path:
    """Path of the tiny model, building it on first use (about 5-15 s)."""
    target = model_dir()
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(target):
            return target
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _build(staging)
            if target.exists():
                shutil.rmtree(target)  # an incomplete earlier build
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        print(f"built tiny model in {time.monotonic() - started:.1f} s: {target}", file=sys.stderr)
    return target


def main() -> None:
    """Print the model path and nothing else on stdout: callers capture it. Whatever the build prints,
    from Python or from native code (tokenizers, torch), goes to stderr at the file-descriptor level."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        path = ensure_tiny_model()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(path, flush=True)


if __name__ == "__main__":
    main()
