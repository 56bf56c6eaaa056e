"""Hugging Face senders: a SenderState from what an HF agent loop already has.

`sender_from_hf` accepts the forms an agent loop naturally holds (chat messages, rendered
text, exact IDs, a generate output, a complete or prefix cache) and never mutates the
caller's cache. The prompt helpers here (chat rendering, prompt IDs) are shared with the
receiving side (`rclc.receiver`) and bound agents.
"""

from __future__ import annotations

from typing import Any

import torch

from ._cache import cache_layers, cache_length, extend, generation_cache
from .errors import ContextLimitError, IncompatibleStateError, RclcError
from ._shared_prefill import prefill_tokens
from .literal import encode_chat
from .models import check_model, context_limit_of
from .state import SenderState, build_state, checkpoint_vocabulary, embedding_weight, request_ids

_MATCHED_CONFIG = (
    "model_type",
    "hidden_size",
    "vocab_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def is_messages(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and not isinstance(prompt, str)


def render_messages(tokenizer: Any, messages: Any, *, generation_prompt: bool) -> torch.Tensor:
    """Chat messages -> `[1, n]` IDs through the tokenizer's own template (thinking disabled).

    Message contents are tokenized as literal text (`rclc.literal`): control-token text in a
    message stays text, only the template's own delimiters are control tokens.
    """
    encoded = encode_chat(tokenizer, list(messages) if messages else [], generation_prompt=generation_prompt,
                          enable_thinking=False)
    return torch.tensor([encoded.ids], dtype=torch.int64)


def prompt_ids(model: Any, tokenizer: Any, prompt: Any) -> torch.Tensor:
    """Messages (no generation prompt), rendered text (no special tokens) or `[1, n]` IDs -> IDs."""
    weight = embedding_weight(model)
    if is_messages(prompt):
        ids = render_messages(tokenizer, prompt, generation_prompt=False)
        return request_ids(ids, tokenizer, weight)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RclcError("prompt: text needs a tokenizer; this agent has none, so pass token IDs [1, n]")
        if not prompt:
            raise RclcError("prompt: empty text; pass the rendered prompt")
        return request_ids(tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"], tokenizer, weight)
    if isinstance(prompt, torch.Tensor):
        try:
            return request_ids(prompt, tokenizer, weight)
        except ValueError as error:
            raise type(error)(str(error).replace("request:", "prompt:", 1)) from None
    raise RclcError(f"prompt: expected chat messages, rendered text or int64 IDs [1, n], got {type(prompt).__name__}")


def hf_generation_inputs(rows: torch.Tensor, output: int) -> dict[str, Any]:
    """`model.generate` keyword arguments for `[T, hidden]` input rows and `output` new tokens at most."""
    return {
        "inputs_embeds": rows.unsqueeze(0),
        "attention_mask": torch.ones(1, rows.shape[0], dtype=torch.long, device=rows.device),
        "max_new_tokens": output,
    }


def generation_parts(generation: Any) -> tuple[torch.Tensor, Any]:
    name = type(generation).__name__
    sequences = getattr(generation, "sequences", None)
    if sequences is None or not isinstance(sequences, torch.Tensor):
        raise RclcError(
            "generation: expected the output of model.generate(..., return_dict_in_generate=True), "
            f"got {name}"
        )
    if "Beam" in name or getattr(generation, "beam_indices", None) is not None:
        raise RclcError("generation: beam-search outputs are not supported; use greedy decoding or sampling")
    if "EncoderDecoder" in name:
        raise RclcError("generation: encoder-decoder outputs are not supported; use a decoder-only model")
    if sequences.dim() != 2 or sequences.shape[0] != 1:
        raise RclcError(f"generation: expected one unpadded sequence, got sequences shaped {tuple(sequences.shape)}")
    return sequences, generation_cache(generation)


def complete_state(model: Any, tokenizer: Any, ids: torch.Tensor, cache: Any) -> SenderState:
    """Rows for `ids`, and a cache of exactly those rows built from `cache`'s prefix (never mutated)."""
    total = ids.shape[1]
    limit = context_limit_of(model)
    if total > limit:
        raise ContextLimitError(f"prompt: {total} positions exceed the model's context limit of {limit}")
    weight = embedding_weight(model)
    with torch.no_grad():
        rows = weight[ids[0].to(weight.device)]
    cached = cache_length(cache)
    if cached > total:
        raise IncompatibleStateError(
            f"past_key_values: the cache holds {cached} positions but the prompt has only {total}; "
            "pass the exact IDs the cache was built from"
        )
    if cache is not None and 0 < cached < total:
        layers = cache_layers(cache)
        if len(layers) != model.config.num_hidden_layers or layers[0][0].shape[0] != 1:
            raise RclcError("past_key_values: expected an unpadded batch-1 cache with one entry per layer")
        cache = extend(model, cache, rows[cached:])
    elif cached == 0:  # shared prefixes computed once, prompts arriving together in one forward
        cache = prefill_tokens(model, ids[0].to(weight.device))
    return build_state(model, tokenizer, rows, ids[0].clone(), cache=cache)


def sender_from_hf(
    model: Any,
    tokenizer: Any = None,
    prompt: Any = None,
    *,
    past_key_values: Any = None,
    generation: Any = None,
) -> SenderState:
    """A validated SenderState from messages, rendered text, exact IDs or a generate output.

    A complete cache is reused as is, a prefix cache is extended on a private copy, no
    cache means one prefill. The caller's cache object is never modified.
    """
    check_model(model)
    if generation is not None:
        if prompt is not None or past_key_values is not None:
            raise RclcError("generation: pass it alone; it already holds the prompt IDs and the cache")
        sequences, cache = generation_parts(generation)
        if cache is not None and cache_length(cache) > sequences.shape[1]:
            raise RclcError(
                "generation: its sequences do not include the whole prompt (an inputs_embeds generation?); "
                "build a SenderState from the rows instead, or use agent.update(inputs=..., generation=...)"
            )
        ids = request_ids(sequences, tokenizer, embedding_weight(model))
        return complete_state(model, tokenizer, ids, cache)
    if prompt is None:
        raise RclcError("prompt: pass chat messages, rendered text, token IDs [1, n] or generation=")
    ids = prompt_ids(model, tokenizer, prompt)
    return complete_state(model, tokenizer, ids, past_key_values)


def check_compatible(receiver_model: Any, receiver_tokenizer: Any, sender: SenderState) -> None:
    """Refuse a sender whose checkpoint, architecture or vocabulary differs from the receiver's."""
    check_model(receiver_model)
    mine, theirs = receiver_model.config, sender.model.config
    for name in _MATCHED_CONFIG:
        if getattr(mine, name, None) != getattr(theirs, name, None):
            raise IncompatibleStateError(
                f"receiver: its model's {name}={getattr(mine, name, None)!r} differs from the sender's "
                f"{getattr(theirs, name, None)!r}; sender and receiver must share one checkpoint"
            )
    for name in ("_name_or_path", "_commit_hash"):
        a, b = getattr(mine, name, None), getattr(theirs, name, None)
        if a and b and a != b:
            raise IncompatibleStateError(
                f"receiver: checkpoint {name} {a!r} differs from the sender's {b!r}; use the same checkpoint"
            )
    other = sender.tokenizer
    if receiver_tokenizer is not None and other is not None and receiver_tokenizer is not other:
        rows = int(embedding_weight(receiver_model).shape[0])
        if checkpoint_vocabulary(receiver_tokenizer, rows) != checkpoint_vocabulary(other, rows):
            raise IncompatibleStateError(
                "receiver: its tokenizer vocabulary differs from the sender's; use the same tokenizer"
            )
