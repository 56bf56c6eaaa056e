"""How a bound agent builds, extends and continues state on a local Hugging Face model.

`Agent` is backend-agnostic: it keeps the lifecycle (history vs retained state, pending
continuations, the inbox) and asks a backend object for model work. This module is the
HF backend; the vLLM backend implements the same methods over an engine.
"""

from __future__ import annotations

from typing import Any

import torch

from ._cache import cache_length, extend, prefill
from .hf import _check_generation, complete_state, sender_from_hf
from .snapshot import restore_state
from .state import SenderState, embedding_weight


class HFBackend:
    name = "hf"
    engine = None

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @property
    def weight(self) -> torch.Tensor:
        return embedding_weight(self.model)

    def require_idle(self) -> None:
        """HF models have no engine queue; native generation is under the user's loop."""

    def from_history(self, ids: torch.Tensor, previous: SenderState | None) -> SenderState:
        """State for rendered history IDs, reusing `previous` when its IDs are a prefix."""
        if previous is not None and previous.token_ids is not None and previous.latent_steps == 0:
            old = previous.token_ids
            if old.shape[0] <= ids.shape[1] and torch.equal(old, ids[0, : old.shape[0]].to(old.device)):
                if old.shape[0] == ids.shape[1]:
                    return previous
                return complete_state(self.model, self.tokenizer, ids, previous.past_key_values)
        return complete_state(self.model, self.tokenizer, ids, None)

    def explicit(self, prompt: Any, past_key_values: Any, generation: Any, request_id: Any) -> SenderState:
        if request_id is not None:
            raise ValueError("request_id: only vLLM agents take a capture request ID")
        return sender_from_hf(self.model, self.tokenizer, prompt, past_key_values=past_key_values, generation=generation)

    def extend(self, state: SenderState, new_ids: torch.Tensor) -> SenderState:
        """Old rows + embeddings of new IDs, cache extended on a private view; latent tail reset."""
        weight = self.weight
        with torch.no_grad():
            new_rows = weight[new_ids[0].to(weight.device)]
        old_ids = state.token_ids if state.token_ids is not None else torch.full(
            (state.positions,), -1, dtype=torch.int64, device=weight.device
        )
        cache = extend(self.model, state.past_key_values, new_rows)
        result = SenderState(
            model=self.model,
            past_key_values=cache,
            input_embeds=torch.cat([state.input_embeds, new_rows], dim=0),
            tokenizer=self.tokenizer,
            token_ids=torch.cat([old_ids.to(weight.device), new_ids[0].to(weight.device)]),
            latent_steps=0,
            inherited_positions=state.inherited_positions,
        )
        result.validate()
        return result

    def generation_inputs(self, rows: torch.Tensor, output: int) -> dict[str, Any]:
        return {
            "inputs_embeds": rows.unsqueeze(0),
            "attention_mask": torch.ones(1, rows.shape[0], dtype=torch.long, device=rows.device),
            "max_new_tokens": output,
        }

    def prefix_rows(self, inputs: dict[str, Any], positions: int) -> torch.Tensor:
        """The exact rows generation started from; refuse a dictionary whose rows were replaced."""
        rows = inputs.get("inputs_embeds") if isinstance(inputs, dict) else None
        if not isinstance(rows, torch.Tensor) or rows.dim() != 3 or rows.shape[0] != 1 or rows.shape[1] != positions:
            raise ValueError(
                f"inputs: expected inputs_embeds [1, {positions}, hidden] as pop()/inputs() returned them; "
                "generate from the dictionary without replacing its rows"
            )
        return rows[0]

    def continuation(
        self, inputs: dict[str, Any], known_ids: torch.Tensor, inherited: int, generation: Any
    ) -> SenderState:
        """The state after `generate(**inputs)`: the exact prefix rows, then the generated tokens.

        HF returns only the new tokens for embedding inputs, and a cache one position short
        of prefix + tokens (the last token was never forwarded); that suffix is completed on
        a private view of the cache, so the caller's generate output is left untouched.
        """
        sequences, cache = _check_generation(generation)
        prefix = self.prefix_rows(inputs, int(known_ids.shape[0]))
        weight = self.weight
        generated = sequences[0].to(weight.device)
        if generated.dtype != torch.int64 or bool(((generated < 0) | (generated >= weight.shape[0])).any()):
            raise ValueError(
                f"generation: sequences must be int64 token IDs in [0, {weight.shape[0]}); pass the output of "
                "model.generate(**inputs, return_dict_in_generate=True)"
            )
        cached = cache_length(cache)
        if cached > prefix.shape[0] + generated.shape[0]:
            raise ValueError(
                f"generation: its cache holds {cached} positions, more than the {prefix.shape[0]} inputs plus "
                f"{generated.shape[0]} generated tokens; pass the output of model.generate(**inputs)"
            )
        if 0 < cached < prefix.shape[0]:
            raise ValueError(
                f"generation: its cache holds {cached} positions, fewer than the {prefix.shape[0]} input rows; "
                "pass the output of model.generate(**inputs, return_dict_in_generate=True)"
            )
        with torch.no_grad():
            rows = torch.cat([prefix, weight[generated]], dim=0)
        ids = torch.cat([known_ids.to(weight.device), generated])
        if cache is None or cached == 0:
            full = prefill(self.model, rows)
        elif cached < rows.shape[0]:
            full = extend(self.model, cache, rows[cached:])
        else:
            full = cache
        state = SenderState(
            model=self.model,
            past_key_values=full,
            input_embeds=rows,
            tokenizer=self.tokenizer,
            token_ids=ids,
            latent_steps=0,
            inherited_positions=inherited,
        )
        state.validate()
        return state

    def restore(self, rows: torch.Tensor, ids: torch.Tensor | None, latent_steps: int, inherited: int) -> SenderState:
        return restore_state(self.model, self.tokenizer, rows, ids, latent_steps, inherited)
