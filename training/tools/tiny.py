"""A tiny randomly initialised Llama with a real tokenizer, for tests and benchmarks on CPU.

The wide default init (0.5) makes its next-token distributions peaked (entropy far below
log(vocab)), so sampled replies differ and a few GRPO steps visibly change them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_model(
    folder: Path,
    tokenizer_dir: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    init_range: float = 0.5,
    seed: int = 0,
) -> Path:
    """Write a Hugging Face model folder: a `layers` x `hidden` Llama with the tokenizer (and
    chat template) of `tokenizer_dir`. Token ids 1, 2 are bos and eos, as in SmolLM2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        initializer_range=init_range,
    )
    folder = Path(folder)
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, folder / name)
    (folder / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    )
    return folder
