"""How a bound agent builds, extends and continues state on an in-process vLLM engine.

The vLLM counterpart of `rclc._hf_backend.HFBackend`: `Agent` keeps the lifecycle and
calls the same methods here. Differences that follow from the engine:

- every state is a capture: the engine prefills the prompt (token IDs, or continuous
  rows as `prompt_embeds`) in a discarded one-token request and the connector copies
  its KV; nothing is extended in place, because a finished `RequestOutput` exposes no
  KV, so `extend` and `continuation` re-prefill the combined rows;
- selection and reasoning run on the engine's HF-shaped view (`shared_view`), so the
  agent's `model` is that view and its tokenizer is the engine's;
- generation inputs are `llm.generate` keyword arguments, not HF `generate` ones.

The engine must be idle whenever the agent does model work (`require_idle`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from .._checks import is_exact_int
from ..capture.engine_checks import check_version
from ..hf import prompt_ids
from ..models import context_limit_of
from ..state import SenderState, checkpoint_vocabulary, embedding_weight
from .engine import check_engine, engine_context_limit, engine_tokenizer, require_idle
from .state import prefill_state, shared_view, state_from_capture


def _check_tokenizer(supplied: Any, engine: Any, rows: int) -> None:
    if supplied is None or supplied is engine:
        return
    if not callable(getattr(supplied, "get_vocab", None)):
        raise ValueError(f"tokenizer: expected a Hugging Face tokenizer or None, got {type(supplied).__name__}")
    if checkpoint_vocabulary(supplied, rows) != checkpoint_vocabulary(engine, rows):
        raise ValueError(
            "tokenizer: its vocabulary differs from the engine's; omit tokenizer (the engine supplies it) "
            "or pass the checkpoint's own tokenizer"
        )


def completion_ids(generation: Any, vocab: int) -> tuple[torch.Tensor, int]:
    """(generated IDs, prompt length) of one finished `llm.generate` result with one completion.

    Accepts a `RequestOutput` or the one-element list `llm.generate` returns; refuses
    anything else (several requests, `n > 1`, unfinished or non-integer outputs).
    """
    if isinstance(generation, Sequence) and not isinstance(generation, (str, bytes)):
        if len(generation) != 1:
            raise ValueError(
                f"generation: expected the output of llm.generate(**inputs) for one prompt, got {len(generation)} results"
            )
        generation = generation[0]
    outputs = getattr(generation, "outputs", None)
    if not isinstance(outputs, list) or not hasattr(generation, "finished"):
        raise ValueError(
            f"generation: expected a vllm RequestOutput from llm.generate(**inputs), got {type(generation).__name__}"
        )
    if not generation.finished:
        raise ValueError("generation: the request is not finished; pass the final output of llm.generate(**inputs)")
    if len(outputs) != 1:
        raise ValueError(f"generation: expected exactly one completion (n=1), got {len(outputs)}")
    tokens = list(getattr(outputs[0], "token_ids", None) or [])
    if not all(is_exact_int(token) and 0 <= token < vocab for token in tokens):
        raise ValueError(f"generation: the completion's token_ids must be ints in [0, {vocab})")
    prompt = getattr(generation, "prompt_token_ids", None)
    prompt_length = -1 if prompt is None else len(prompt)
    return torch.tensor(tokens, dtype=torch.int64), prompt_length


class VLLMBackend:
    """Model work for an agent bound to an in-process `vllm.LLM` (see the module docs)."""

    name = "vllm"

    def __init__(self, llm: Any, tokenizer: Any, *, allow_unstable: bool) -> None:
        if type(allow_unstable) is not bool:
            raise ValueError(f"allow_unstable: expected True or False, got {allow_unstable!r}")
        check_version(allow_unstable=allow_unstable)  # RuntimeError: untested release
        # Every configuration problem, an out-of-process engine included, is a ValueError
        # (api.md: unsupported configuration raises ValueError at the binding check);
        # a busy engine is a condition of the moment and stays a RuntimeError.
        problems = check_engine(llm, allow_unstable=allow_unstable)
        if problems:
            raise ValueError("llm: " + "; ".join(problems))
        require_idle(llm)
        view = shared_view(llm, allow_unstable=allow_unstable)
        supplied_by_engine = engine_tokenizer(llm)
        _check_tokenizer(tokenizer, supplied_by_engine, int(embedding_weight(view).shape[0]))
        self.engine = llm
        self.model = view
        self.tokenizer = supplied_by_engine

    @property
    def weight(self) -> torch.Tensor:
        return embedding_weight(self.model)

    def context_limit(self, requested: int | None) -> int:
        """min(max_model_len, max_position_embeddings), or a smaller `requested` limit."""
        limit = min(engine_context_limit(self.engine), context_limit_of(self.model))
        if requested is None:
            return limit
        if not is_exact_int(requested) or requested < 1:
            raise ValueError(f"context_limit: expected an int >= 1, got {requested!r}")
        if requested > limit:
            raise ValueError(
                f"context_limit: {requested} exceeds the engine's limit of {limit} "
                "(min of max_model_len and max_position_embeddings)"
            )
        return requested

    def require_idle(self) -> None:
        require_idle(self.engine)

    # -- captures ----------------------------------------------------------------------

    def _capture(self, ids: torch.Tensor, rows: torch.Tensor | None, inherited: int) -> SenderState:
        """Prefill through the engine: token IDs when every row is its token's embedding, else the rows."""
        ids = ids.to("cpu")
        if rows is not None and not self._rows_are_tokens(ids, rows):
            return prefill_state(
                self.engine, self.model, self.tokenizer, ids, input_embeds=rows, inherited_positions=inherited
            )
        return prefill_state(self.engine, self.model, self.tokenizer, ids, inherited_positions=inherited)

    def _rows_are_tokens(self, ids: torch.Tensor, rows: torch.Tensor) -> bool:
        """Whether every row is exactly its token's embedding (then the IDs are the cheaper prompt)."""
        if bool((ids < 0).any()):
            return False
        weight = self.weight
        with torch.no_grad():
            return torch.equal(rows.to(weight.device), weight[ids.to(weight.device)])

    def from_history(self, ids: torch.Tensor, previous: SenderState | None) -> SenderState:
        """State for rendered history IDs: `previous` when unchanged, else a fresh capture."""
        if previous is not None and previous.token_ids is not None and previous.latent_steps == 0:
            old = previous.token_ids
            if old.shape[0] == ids.shape[1] and torch.equal(old.cpu(), ids[0].cpu()):
                return previous
        return self._capture(ids[0], None, 0)

    def explicit(self, prompt: Any, past_key_values: Any, generation: Any, request_id: Any) -> SenderState:
        if past_key_values is not None:
            raise ValueError(
                "past_key_values: vLLM agents hold no HF cache; pass prompt= (captured now) or prompt= with "
                "request_id= (a capture your loop already made)"
            )
        if generation is not None:
            raise ValueError(
                "generation: a vLLM generation is recorded only with update(inputs=..., generation=...); "
                "for a token generation pass the complete prompt and output IDs as prompt="
            )
        if prompt is None:
            raise ValueError("prompt: request_id needs the exact captured prompt; pass prompt=exact_ids as well")
        ids = prompt_ids(self.model, self.tokenizer, prompt)
        limit = engine_context_limit(self.engine)
        if ids.shape[1] > limit:
            raise ValueError(f"prompt: {ids.shape[1]} positions exceed the engine's context limit of {limit}")
        if request_id is None:
            return self._capture(ids[0], None, 0)
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id: expected the engine's request ID (a non-empty str), got {request_id!r}")
        return state_from_capture(self.model, self.tokenizer, request_id, ids[0].cpu())

    def extend(self, state: SenderState, new_ids: torch.Tensor) -> SenderState:
        """Old rows + embeddings of new IDs, re-prefilled through the engine; latent tail reset."""
        weight = self.weight
        with torch.no_grad():
            new_rows = weight[new_ids[0].to(weight.device)]
        old_ids = state.token_ids if state.token_ids is not None else torch.full(
            (state.positions,), -1, dtype=torch.int64, device=weight.device
        )
        rows = torch.cat([state.input_embeds, new_rows], dim=0)
        ids = torch.cat([old_ids.to(weight.device), new_ids[0].to(weight.device)])
        return self._capture(ids, rows, state.inherited_positions)

    # -- native generation -------------------------------------------------------------

    def generation_inputs(self, rows: torch.Tensor, output: int) -> dict[str, Any]:
        """Keyword arguments of `llm.generate`: the rows as prompt embeddings, the output cap.

        Sampling starts from the engine's defaults (the checkpoint's generation config, as
        HF `generate` does) with `max_tokens` set to the reserved output.
        """
        params = self.engine.get_default_sampling_params()
        params.max_tokens = int(output)
        return {
            "prompts": {"prompt_embeds": rows.detach().to("cpu")},
            "sampling_params": params,
            "use_tqdm": False,
        }

    def prefix_rows(self, inputs: dict[str, Any]) -> torch.Tensor:
        weight = self.weight
        return inputs["prompts"]["prompt_embeds"].to(device=weight.device, dtype=weight.dtype)

    def continuation(
        self, inputs: dict[str, Any], known_ids: torch.Tensor, inherited: int, generation: Any
    ) -> SenderState:
        """The state after `llm.generate(**inputs)`: prefix rows + completion, re-prefilled."""
        weight = self.weight
        generated, prompt_length = completion_ids(generation, int(weight.shape[0]))
        params = inputs.get("sampling_params")
        if getattr(params, "n", 1) != 1:
            raise ValueError("inputs: sampling_params.n must be 1; one continuation is recorded")
        prefix = self.prefix_rows(inputs)
        if prompt_length >= 0 and prompt_length != prefix.shape[0]:
            raise ValueError(
                f"generation: its prompt has {prompt_length} positions but the inputs hold {prefix.shape[0]}; "
                "pass the output of llm.generate(**inputs) for these inputs"
            )
        total = prefix.shape[0] + generated.shape[0]
        limit = engine_context_limit(self.engine)
        if total + 1 > limit:
            raise ValueError(
                f"generation: {total} positions plus one spare position for the re-prefill exceed the engine's "
                f"context limit of {limit}; reserve fewer output tokens"
            )
        generated = generated.to(weight.device)
        with torch.no_grad():
            rows = torch.cat([prefix, weight[generated]], dim=0)
        ids = torch.cat([known_ids.to(weight.device), generated])
        return self._capture(ids, rows, inherited)

    def restore(self, rows: torch.Tensor, ids: torch.Tensor | None, latent_steps: int, inherited: int) -> SenderState:
        """Re-prefill validated rows as prompt embeddings; the latent/inherited counts come back."""
        weight = self.weight
        if ids is None:
            ids = torch.full((rows.shape[0],), -1, dtype=torch.int64)
        rows = rows.to(device=weight.device, dtype=weight.dtype)
        state = prefill_state(
            self.engine, self.model, self.tokenizer, ids.to("cpu"), input_embeds=rows, inherited_positions=0
        )
        state = dataclasses.replace(state, latent_steps=latent_steps, inherited_positions=inherited)
        state.validate()
        return state
