"""The Hugging Face backend: an agent's model work on a local HF model, in this process.

Native generation goes through the model's batching engine (`hf_batching.py`): concurrent
generations on one model decode together in batched forwards, each reporting its tokens
from its own worker thread as they come, each ending after the current step once its
`stop` event is set or its awaiting caller is cancelled. A generation alone in the engine
runs exactly the forwards `model.generate` would run and picks the same greedy tokens.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from .._cache import cache_from_layers, cache_keyword, cache_layers, cache_length, crop_cache, extend
from .._worker import WorkCancelled, check_stop, current_stop
from ..errors import IncompatibleStateError, RclcError
from ..generation import Sampling
from ..hf_senders import generation_parts, complete_state, hf_generation_inputs, sender_from_hf
from ..models import check_model, context_window
from ..snapshot import restore_state
from ..state import SenderState, appended_rows, build_state
from .contract import Backend, NativeGeneration, TokenCallback
from .hf_batching import engine_for
from .grammar_mask import GrammarMask
from .hf_sequences import Sequence
from .streamed_text import StreamedText
from .token_choice import TokenChooser, end_tokens, generation_config


@dataclass(frozen=True)
class BatchedGeneration:
    """What the engine generated, shaped as `model.generate(..., return_dict_in_generate=True)`
    returns it: `sequences` `[1, n]` (prompt IDs first for a token prompt) and `cache`
    (prompt and tokens but the last, which was never forwarded)."""

    sequences: torch.Tensor
    cache: Any


class HFBackend(Backend):
    """Model work on a local HF causal LM (see `Backend` for the contract)."""

    name = "hf"
    records_by_prefill = False  # a continuation reuses generate's cache, built token by token
    engine = None

    def __init__(self, model: Any, tokenizer: Any) -> None:
        check_model(model)
        self.model = model
        self.tokenizer = tokenizer

    def context_limit(self, requested: int | None) -> int:
        """`requested`, at most the model's `max_position_embeddings`; that limit when None."""
        return context_window(self.model, requested)

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
            raise RclcError("request_id: only vLLM agents take a capture request ID")
        return sender_from_hf(self.model, self.tokenizer, prompt, past_key_values=past_key_values, generation=generation)

    def extend(self, state: SenderState, new_ids: torch.Tensor) -> SenderState:
        """Old rows + embeddings of new IDs, cache extended on a private view; latent tail reset."""
        rows, ids, new_rows = appended_rows(state, new_ids)
        cache = extend(self.model, state.past_key_values, new_rows)
        return build_state(
            self.model, self.tokenizer, rows, ids, inherited_positions=state.inherited_positions, cache=cache
        )

    # -- native generation -------------------------------------------------------------

    def generation_inputs(self, rows: torch.Tensor, output: int) -> dict[str, Any]:
        """`model.generate` keyword arguments: the rows as `inputs_embeds`, the output cap."""
        return hf_generation_inputs(rows, output)

    def state_inputs(self, state: SenderState, output: int) -> dict[str, Any]:
        """`generation_inputs` for the state's rows plus a view of its cache without the last
        position: the engine's prefill (like `model.generate`) forwards only the uncached
        position before the first new token, so a long history (a tool loop's earlier turns)
        is never prefilled again."""
        inputs = hf_generation_inputs(state.input_embeds, output)
        if state.past_key_values is not None and state.positions > 1:
            cache = crop_cache(self.model, state.past_key_values, state.positions - 1)
            inputs[cache_keyword(self.model)] = cache
        return inputs

    def prompt_inputs(self, ids: torch.Tensor, output: int) -> dict[str, Any]:
        """`model.generate` keyword arguments for a token prompt `[1, n]`, the output cap."""
        ids = ids.to(self.weight.device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": output}

    def prefix_rows(self, inputs: dict[str, Any], positions: int) -> torch.Tensor:
        """The exact rows generation started from; refuse a dictionary whose rows were replaced."""
        rows = inputs.get("inputs_embeds") if isinstance(inputs, dict) else None
        if not isinstance(rows, torch.Tensor) or rows.dim() != 3 or rows.shape[0] != 1 or rows.shape[1] != positions:
            raise RclcError(
                f"inputs: expected inputs_embeds [1, {positions}, hidden] as pop()/inputs() returned them; "
                "generate from the dictionary without replacing its rows"
            )
        return rows[0]

    def generate(
        self, inputs: dict[str, Any], sampling: Sampling, *, on_token: TokenCallback | None, stop: threading.Event | None
    ) -> NativeGeneration:
        """Decode in the model's batching engine, reporting tokens from this thread (see the module docs)."""
        if self.tokenizer is None:
            raise RclcError("tokenizer: native generation decodes tokens; bind the agent with its tokenizer")
        check_stop()  # cancelled before anything started: submit nothing
        model, tokenizer = self.model, self.tokenizer
        output = int(inputs["max_new_tokens"])
        config = generation_config(model, tokenizer, sampling, output)
        token_prompt = "input_ids" in inputs
        device = self.weight.device
        past = self._past_layers(inputs, token_prompt)
        ends = end_tokens(config)
        mask = self._grammar_mask(sampling, ends)
        if token_prompt:
            prompt_ids = inputs["input_ids"].to(device)
            chooser = TokenChooser(model, config, sampling.seed, prompt_ids, mask)
        else:
            prompt_ids = None
            chooser = TokenChooser(model, config, sampling.seed, torch.empty(1, 0, dtype=torch.long, device=device), mask)
        sequence = Sequence(
            input_ids=prompt_ids,
            inputs_embeds=None if token_prompt else inputs["inputs_embeds"].to(device),
            max_new_tokens=output,
            past=past,
            end_tokens=ends,
            chooser=chooser,
            stop=stop,
            cancel=current_stop(),
        )
        report = None
        if on_token is not None:
            counter = iter(range(output))
            streamed = StreamedText(tokenizer)

            def report(token: int) -> None:
                on_token(next(counter), streamed.add(token))

        engine = engine_for(model)
        engine.submit(sequence)
        outcome = sequence.wait(report, engine.settle)
        if outcome.error is not None:
            raise outcome.error
        if outcome.cancelled:
            raise WorkCancelled("the caller was cancelled; the sequence left the batch at its next step")
        generated = torch.tensor(outcome.tokens, dtype=torch.int64, device=device)
        sequences = torch.cat([prompt_ids[0], generated]) if token_prompt else generated
        cache = cache_from_layers(model, outcome.layers) if outcome.layers else None
        return NativeGeneration(generated, BatchedGeneration(sequences.unsqueeze(0), cache), outcome.stopped)

    def _grammar_mask(self, sampling: Sampling, ends: frozenset[int]) -> GrammarMask | None:
        """The sequence's constraint compiled for this model's tokenizer and logits (None when
        free); built here, in the waiting thread, so compiling never delays the engine's steps.
        The grammar's end token is the model's (the lowest ID when it names several)."""
        if sampling.constraint is None:
            return None
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        return GrammarMask(sampling.constraint, self.tokenizer, vocab, min(ends) if ends else None)

    def _past_layers(self, inputs: dict[str, Any], token_prompt: bool) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The cache `state_inputs` put in `inputs` (a prefix of its rows), as layers the
        engine prefills over; None when generation starts from the rows alone."""
        cache = inputs.get(cache_keyword(self.model))
        if cache is None:
            return None
        cached = cache_length(cache)
        positions = 0 if token_prompt else int(inputs["inputs_embeds"].shape[1])
        if token_prompt or not 0 < cached < positions:
            raise IncompatibleStateError(
                f"inputs: a cache of {cached} positions must be a proper prefix of the {positions} input rows; "
                "generate from the dictionary state_inputs() returned"
            )
        return cache_layers(cache)

    def continuation(
        self, inputs: dict[str, Any], known_ids: torch.Tensor, inherited: int, generation: Any
    ) -> SenderState:
        """The state after `generate(**inputs)`: the exact prefix rows, then the generated tokens.

        HF returns only the new tokens for embedding inputs, and a cache one position short
        of prefix + tokens (the last token was never forwarded); that suffix is completed on
        a private view of the cache, so the caller's generate output is left untouched. The
        batching engine's generations arrive complete (it forwards the last token in one more
        decode step, `hf_batching`), so for them nothing is forwarded here, under the
        preparation lock the caller holds.
        For a token prompt (`prompt_inputs`) the output holds prompt and tokens together.
        """
        if "input_ids" in inputs:
            return self.explicit(None, None, generation, None)
        sequences, cache = generation_parts(generation)
        prefix = self.prefix_rows(inputs, int(known_ids.shape[0]))
        weight = self.weight
        generated = sequences[0].to(weight.device)
        if generated.dtype != torch.int64 or bool(((generated < 0) | (generated >= weight.shape[0])).any()):
            raise RclcError(
                f"generation: sequences must be int64 token IDs in [0, {weight.shape[0]}); pass the output of "
                "model.generate(**inputs, return_dict_in_generate=True)"
            )
        cached = cache_length(cache)
        if cached > prefix.shape[0] + generated.shape[0]:
            raise IncompatibleStateError(
                f"generation: its cache holds {cached} positions, more than the {prefix.shape[0]} inputs plus "
                f"{generated.shape[0]} generated tokens; pass the output of model.generate(**inputs)"
            )
        if 0 < cached < prefix.shape[0]:
            raise IncompatibleStateError(
                f"generation: its cache holds {cached} positions, fewer than the {prefix.shape[0]} input rows; "
                "pass the output of model.generate(**inputs, return_dict_in_generate=True)"
            )
        with torch.no_grad():
            rows = torch.cat([prefix, weight[generated]], dim=0)
        ids = torch.cat([known_ids.to(weight.device), generated])
        if cache is None or cached == 0:
            cache = None  # prefilled afresh
        elif cached < rows.shape[0]:
            cache = extend(self.model, cache, rows[cached:])
        return build_state(self.model, self.tokenizer, rows, ids, inherited_positions=inherited, cache=cache)

    def restore(
        self, rows: torch.Tensor, ids: torch.Tensor | None, latent_steps: int, inherited: int
    ) -> SenderState:
        """Rebuild a state from validated rows by re-prefilling them from position 0."""
        return restore_state(self.model, self.tokenizer, rows, ids, latent_steps, inherited)
