"""Tiny random models for tests: a real tokenizer and real HF models, built in memory in seconds.

For your own tests of code that uses rclc (and for ours): `tiny_model("qwen3")` returns an
eval-mode `(model, tokenizer)` of a supported family with random weights, a ChatML
template and nothing downloaded. Outputs are meaningless, but every code path (caches,
attention capture, selection, snapshots, generation) runs exactly as on a real checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from .errors import RclcError
from .models import SUPPORTED_FAMILIES

__all__ = ["TINY_CORPUS", "tiny_model", "tiny_tokenizer"]

TINY_CORPUS = (
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. "
    "The Birch project is owned by Bob and launched on 9 June 2019 in Lima. "
    "Who owns Cedar? When did Birch launch? Find the owner and launch date. "
    "system user assistant tool result answer question document summary 0123456789"
)
"""The text the tiny tokenizer is trained on: test prompts built from these words tokenize compactly."""

_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 384) -> Any:
    """A small byte-level BPE tokenizer with a ChatML template, trained in-process (no files, no hub)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([TINY_CORPUS] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = _CHATML
    return tokenizer


def tiny_model(
    family: str = "qwen3",
    *,
    seed: int = 0,
    layers: int = 2,
    max_positions: int = 2048,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    tokenizer: Any = None,
    head_dim: int = 16,
    hidden_size: int = 64,
) -> tuple[Any, Any]:
    """A random-weight `(model, tokenizer)` of a supported family, small enough for unit tests.

    `head_dim` defaults to 16 (fastest); vLLM's CPU attention kernels need 32..256 in steps
    of 32 (or 80, 112), so vLLM tests build their tiny models with `head_dim=64`; vLLM's
    Qwen2 ignores `head_dim` and uses `hidden_size / 4 heads`, so those also pass `hidden_size`.
    The same `seed` always gives the same weights; the global RNG is left as it was.
    """
    if family not in SUPPORTED_FAMILIES:
        raise RclcError(f"family: {family!r} is not one of {SUPPORTED_FAMILIES}")
    tokenizer = tokenizer if tokenizer is not None else tiny_tokenizer()
    extra: dict[str, Any] = {}
    if family == "mistral":
        extra["sliding_window"] = None
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **extra,
    )
    config._name_or_path = f"rclc/tiny-{family}-seed{seed}"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
        )
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer
