"""The Hugging Face backend: an agent's model work on a local HF model, in this process.

Native generation is `model.generate` under the attention lock (attention capture swaps
the process-global dispatch, so no generation may overlap one), with a streamer that
reports each token from the worker thread and a stopping criterion that ends generation
after the current step once a `stop` event is set or the awaiting caller is cancelled.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from .._cache import cache_keyword, cache_length, crop_cache, extend
from .._locks import attention_lock
from .._worker import check_stop, stop_requested
from ..errors import IncompatibleStateError, RclcError
from ..generation import Sampling
from ..hf import generation_parts, complete_state, hf_generation_inputs, sender_from_hf
from ..models import check_model, context_window
from ..snapshot import restore_state
from ..state import SenderState, appended_rows, build_state
from .contract import Backend, NativeGeneration, TokenCallback


class _TokenReporter:
    """A `generate` streamer that hands each new token's text to `on_token(index, text)`.

    HF first puts the prompt when generating from `input_ids`; that put is skipped.
    """

    def __init__(self, tokenizer: Any, on_token: TokenCallback, skip_prompt: bool) -> None:
        self.tokenizer, self.on_token, self.skip_prompt = tokenizer, on_token, skip_prompt
        self.index = 0

    def put(self, value: torch.Tensor) -> None:
        if self.skip_prompt:
            self.skip_prompt = False
            return
        for token in value.reshape(-1).tolist():
            self.on_token(self.index, self.tokenizer.decode([token], skip_special_tokens=False))
            self.index += 1

    def end(self) -> None:
        pass


class _StopRequested(StoppingCriteria):
    """Ends generation at the next step once `stop` is set or the worker's caller was cancelled."""

    def __init__(self, stop: threading.Event | None) -> None:
        self.stop = stop
        self.fired = False  # the stop event (not a cancellation) ended generation

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        by_event = self.stop is not None and self.stop.is_set()
        self.fired = self.fired or by_event
        stopped = by_event or stop_requested()
        return torch.full((input_ids.shape[0],), stopped, dtype=torch.bool, device=input_ids.device)


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
        position: `generate` forwards only that position before the first new token, so a
        long history (a tool loop's earlier turns) is never prefilled again."""
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

    def _config(self, sampling: Sampling, output: int) -> GenerationConfig:
        """The model's end-of-sequence token, the tokenizer's padding, and `sampling` as HF settings."""
        model, tokenizer = self.model, self.tokenizer
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        settings: dict[str, Any] = {
            "max_new_tokens": output,
            "do_sample": not sampling.greedy,
            "eos_token_id": eos,
            "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
            "return_dict_in_generate": True,
        }
        if not sampling.greedy:
            settings["temperature"] = sampling.temperature
            if sampling.top_p is not None:
                settings["top_p"] = sampling.top_p
        return GenerationConfig(**settings)

    def generate(
        self, inputs: dict[str, Any], sampling: Sampling, *, on_token: TokenCallback | None, stop: threading.Event | None
    ) -> NativeGeneration:
        """`model.generate` with a seeded, forked RNG under the attention lock (see the module docs)."""
        if self.tokenizer is None:
            raise RclcError("tokenizer: native generation decodes tokens; bind the agent with its tokenizer")
        config = self._config(sampling, inputs["max_new_tokens"])
        arguments = {key: value for key, value in inputs.items() if key != "max_new_tokens"}
        token_prompt = "input_ids" in arguments
        streamer = None if on_token is None else _TokenReporter(self.tokenizer, on_token, skip_prompt=token_prompt)
        criterion = _StopRequested(stop)
        # Native generation must not overlap a capture on the same model (global dispatch).
        with attention_lock, torch.no_grad(), torch.random.fork_rng(devices=[]):
            check_stop()  # cancelled while waiting for the lock: start no model work
            torch.manual_seed(sampling.seed)
            output = self.model.generate(
                **arguments,
                generation_config=config,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([criterion]),
            )
        sequences = output.sequences[0]
        generated = sequences[arguments["input_ids"].shape[1] :] if token_prompt else sequences
        return NativeGeneration(generated, output, criterion.fired)

    def continuation(
        self, inputs: dict[str, Any], known_ids: torch.Tensor, inherited: int, generation: Any
    ) -> SenderState:
        """The state after `generate(**inputs)`: the exact prefix rows, then the generated tokens.

        HF returns only the new tokens for embedding inputs, and a cache one position short
        of prefix + tokens (the last token was never forwarded); that suffix is completed on
        a private view of the cache, so the caller's generate output is left untouched.
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
