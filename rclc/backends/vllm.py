"""The vLLM backend: an agent's model work on an in-process vLLM engine.

The vLLM implementation of `rclc.backends.contract.Backend` (as `HFBackend` is the HF
one). Differences that follow from the engine:

- every state is a capture: the engine prefills the prompt (token IDs, or continuous
  rows as `prompt_embeds`) in a discarded one-token request and the connector copies
  its KV; nothing is extended in place, because a finished `RequestOutput` exposes no
  KV, so `extend` and `continuation` re-prefill the combined rows;
- selection and reasoning run on the engine's HF-shaped view (`shared_view`), so the
  agent's `model` is that view and its tokenizer is the engine's;
- generation inputs are `llm.generate` keyword arguments, not HF `generate` ones, and
  `generate` hands the request to the engine's submission loop (`rclc.vllm.submission`),
  which steps the engine for every agent's requests together, so vLLM's own continuous
  batching serves concurrent agents; tokens are reported after generation and a
  generation runs to its end (a cancelled caller's request is aborted).

The engine must not hold requests of a user's own loop whenever the agent does model work
(`require_idle`); other agents' requests through the submission loop are fine.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from typing import Any

import torch

from .._arguments import is_exact_int, optional_int, require_bool
from .._worker import WorkCancelled, current_stop
from ..constraints import Constraint
from ..errors import ConstraintError, ContextLimitError, IncompatibleStateError, RclcError, UnsupportedModelError
from ..generation import Sampling
from ..hf_senders import prompt_ids
from ..models import context_limit_of
from ..state import SenderState, appended_rows, checkpoint_vocabulary, embedding_weight
from ..vllm.capture.engine_checks import check_version
from ..vllm.engine import check_engine, engine_context_limit, engine_tokenizer, require_idle
from ..vllm.senders import prefill_state, shared_view, state_from_capture
from ..vllm.submission import run_request
from .contract import Backend, NativeGeneration, TokenCallback
from .streamed_text import StreamedText


def _check_tokenizer(supplied: Any, engine: Any, rows: int) -> None:
    if supplied is None or supplied is engine:
        return
    if not callable(getattr(supplied, "get_vocab", None)):
        raise RclcError(f"tokenizer: expected a Hugging Face tokenizer or None, got {type(supplied).__name__}")
    if checkpoint_vocabulary(supplied, rows) != checkpoint_vocabulary(engine, rows):
        raise IncompatibleStateError(
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
            raise RclcError(
                f"generation: expected the output of llm.generate(**inputs) for one prompt, got {len(generation)} results"
            )
        generation = generation[0]
    outputs = getattr(generation, "outputs", None)
    if not isinstance(outputs, list) or not hasattr(generation, "finished"):
        raise RclcError(
            f"generation: expected a vllm RequestOutput from llm.generate(**inputs), got {type(generation).__name__}"
        )
    if not generation.finished:
        raise RclcError("generation: the request is not finished; pass the final output of llm.generate(**inputs)")
    if len(outputs) != 1:
        raise RclcError(f"generation: expected exactly one completion (n=1), got {len(outputs)}")
    tokens = list(getattr(outputs[0], "token_ids", None) or [])
    if not all(is_exact_int(token) and 0 <= token < vocab for token in tokens):
        raise RclcError(f"generation: the completion's token_ids must be ints in [0, {vocab})")
    prompt = getattr(generation, "prompt_token_ids", None)
    prompt_length = -1 if prompt is None else len(prompt)
    return torch.tensor(tokens, dtype=torch.int64), prompt_length


class VLLMBackend(Backend):
    """Model work for an agent bound to an in-process `vllm.LLM` (see the module docs)."""

    name = "vllm"
    records_by_prefill = True  # every continuation is a fresh capture prefill of its rows

    def __init__(self, llm: Any, tokenizer: Any, *, allow_unstable: bool) -> None:
        require_bool("allow_unstable", allow_unstable)
        check_version(allow_unstable=allow_unstable)  # RuntimeError: untested release
        # Every configuration problem, an out-of-process engine included, is an
        # UnsupportedModelError (a ValueError: api.md says unsupported configuration fails
        # the binding check); a busy engine is a condition of the moment (EngineBusyError).
        problems = check_engine(llm, allow_unstable=allow_unstable)
        if problems:
            raise UnsupportedModelError("llm: " + "; ".join(problems))
        require_idle(llm)
        view = shared_view(llm, allow_unstable=allow_unstable)
        supplied_by_engine = engine_tokenizer(llm)
        _check_tokenizer(tokenizer, supplied_by_engine, int(embedding_weight(view).shape[0]))
        self.engine = llm
        self.model = view
        self.tokenizer = supplied_by_engine

    def context_limit(self, requested: int | None) -> int:
        """min(max_model_len, max_position_embeddings), or a smaller `requested` limit."""
        limit = min(engine_context_limit(self.engine), context_limit_of(self.model))
        optional_int("context_limit", requested, minimum=1)
        if requested is None:
            return limit
        if requested > limit:
            raise RclcError(
                f"context_limit: {requested} exceeds the engine's limit of {limit} "
                "(min of max_model_len and max_position_embeddings)"
            )
        return requested

    def require_idle(self) -> None:
        """Raise `EngineBusyError` while the engine has unfinished requests."""
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
            raise RclcError(
                "past_key_values: vLLM agents hold no HF cache; pass prompt= (captured now) or prompt= with "
                "request_id= (a capture your loop already made)"
            )
        if generation is not None:
            raise RclcError(
                "generation: a vLLM generation is recorded only with update(inputs=..., generation=...); "
                "for a token generation pass the complete prompt and output IDs as prompt="
            )
        if prompt is None:
            raise RclcError("prompt: request_id needs the exact captured prompt; pass prompt=exact_ids as well")
        ids = prompt_ids(self.model, self.tokenizer, prompt)
        limit = engine_context_limit(self.engine)
        if ids.shape[1] > limit:
            raise ContextLimitError(f"prompt: {ids.shape[1]} positions exceed the engine's context limit of {limit}")
        if request_id is None:
            return self._capture(ids[0], None, 0)
        if not isinstance(request_id, str) or not request_id:
            raise RclcError(f"request_id: expected the engine's request ID (a non-empty str), got {request_id!r}")
        return state_from_capture(self.model, self.tokenizer, request_id, ids[0].cpu())

    def extend(self, state: SenderState, new_ids: torch.Tensor) -> SenderState:
        """Old rows + embeddings of new IDs, re-prefilled through the engine; latent tail reset."""
        rows, ids, _ = appended_rows(state, new_ids)
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

    def prompt_inputs(self, ids: torch.Tensor, output: int) -> dict[str, Any]:
        """Keyword arguments of `llm.generate` for a token prompt `[1, n]` (engine-default sampling)."""
        params = self.engine.get_default_sampling_params()
        params.max_tokens = int(output)
        return {"prompts": {"prompt_token_ids": ids[0].tolist()}, "sampling_params": params, "use_tqdm": False}

    def prefix_rows(self, inputs: dict[str, Any], positions: int) -> torch.Tensor:
        """The exact rows generation started from; refuse a dictionary whose rows were replaced."""
        prompts = inputs.get("prompts") if isinstance(inputs, dict) else None
        rows = prompts.get("prompt_embeds") if isinstance(prompts, dict) else None
        if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] != positions:
            raise RclcError(
                f"inputs: expected prompts={{'prompt_embeds': [{positions}, hidden]}} as pop()/inputs() returned "
                "them; generate from the dictionary without replacing its rows"
            )
        weight = self.weight
        return rows.to(device=weight.device, dtype=weight.dtype)

    def _sampling_params(self, sampling: Sampling, max_tokens: int) -> Any:
        """`sampling` as vLLM settings: greedy is temperature 0 (and draws nothing, so no seed).
        Only the final output is wanted (as `llm.generate` asks for it). A constraint becomes
        vLLM's own structured outputs (`structured_outputs`)."""
        import vllm  # the optional extra: only an agent bound to an engine gets here
        from vllm.sampling_params import RequestOutputKind  # the same optional extra

        final: dict[str, Any] = {"output_kind": RequestOutputKind.FINAL_ONLY}
        if sampling.constraint is not None:
            final["structured_outputs"] = structured_outputs(sampling.constraint, self.engine)
        if sampling.greedy:
            return vllm.SamplingParams(max_tokens=max_tokens, temperature=0.0, **final)
        options: dict[str, Any] = {"temperature": sampling.temperature, "seed": sampling.seed}
        if sampling.top_p is not None:
            options["top_p"] = sampling.top_p
        return vllm.SamplingParams(max_tokens=max_tokens, **options, **final)

    def generate(
        self, inputs: dict[str, Any], sampling: Sampling, *, on_token: TokenCallback | None, stop: threading.Event | None
    ) -> NativeGeneration:
        """One request through the engine's submission loop; tokens are reported once it ends.

        The output is capped at `max_model_len - prompt - 1`: recording the continuation
        re-prefills prompt and output, and the capture needs one spare position. `stop` is
        not consulted (a vLLM generation runs to its end); a cancelled caller's request is
        aborted at the loop's next step.
        """
        prompts = inputs["prompts"]
        if "prompt_embeds" in prompts:
            prompt_length = int(prompts["prompt_embeds"].shape[0])
        else:
            prompt_length = len(prompts["prompt_token_ids"])
        limit = engine_context_limit(self.engine)
        cap = min(int(inputs["sampling_params"].max_tokens), limit - prompt_length - 1)
        if cap < 1:
            raise ContextLimitError(
                f"context space: the prompt holds {prompt_length} positions; the engine's limit {limit} leaves no "
                "room to generate and record a continuation"
            )
        require_idle(self.engine)
        cancel = current_stop()
        submitted = run_request(self.engine, prompts, self._sampling_params(sampling, cap), capture=False, cancel=cancel)
        if submitted.error is not None:
            raise submitted.error
        if submitted.cancelled:
            raise WorkCancelled("the caller was cancelled; the generation request was aborted")
        output = [submitted.output]  # shaped as llm.generate returns it
        generated, _ = completion_ids(output, int(self.weight.shape[0]))
        if on_token is not None:
            streamed = StreamedText(self.tokenizer)
            for index, token in enumerate(generated.tolist()):
                on_token(index, streamed.add(token))
        return NativeGeneration(generated, output)

    def continuation(
        self, inputs: dict[str, Any], known_ids: torch.Tensor, inherited: int, generation: Any
    ) -> SenderState:
        """The state after `llm.generate(**inputs)`: prefix rows + completion, re-prefilled.

        For a token prompt (`prompt_inputs`) that is prompt IDs + completion, captured by IDs.
        """
        weight = self.weight
        generated, prompt_length = completion_ids(generation, int(weight.shape[0]))
        params = inputs.get("sampling_params")
        if getattr(params, "n", 1) != 1:
            raise RclcError("inputs: sampling_params.n must be 1; one continuation is recorded")
        if "prompt_token_ids" in inputs["prompts"]:
            return self.explicit(torch.cat([known_ids.cpu(), generated])[None], None, None, None)
        prefix = self.prefix_rows(inputs, int(known_ids.shape[0]))
        if prompt_length >= 0 and prompt_length != prefix.shape[0]:
            raise IncompatibleStateError(
                f"generation: its prompt has {prompt_length} positions but the inputs hold {prefix.shape[0]}; "
                "pass the output of llm.generate(**inputs) for these inputs"
            )
        total = prefix.shape[0] + generated.shape[0]
        limit = engine_context_limit(self.engine)
        if total + 1 > limit:
            raise ContextLimitError(
                f"generation: {total} positions plus one spare position for the re-prefill exceed the engine's "
                f"context limit of {limit}; reserve fewer output tokens"
            )
        generated = generated.to(weight.device)
        with torch.no_grad():
            rows = torch.cat([prefix, weight[generated]], dim=0)
        ids = torch.cat([known_ids.to(weight.device), generated])
        return self._capture(ids, rows, inherited)

    def restore(
        self, rows: torch.Tensor, ids: torch.Tensor | None, latent_steps: int, inherited: int
    ) -> SenderState:
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


def structured_outputs(constraint: Constraint, engine: Any = None) -> Any:
    """An `rclc.Constraint` as vLLM's `StructuredOutputsParams`: a JSON Schema as `json=`
    (one line, no free whitespace), a format tree as an xgrammar structural tag
    (`structural_tag=`). vLLM compiles both with xgrammar (its "auto" default).

    Why not llguidance, the HF backend's library, here too: vLLM's llguidance backend
    cannot start on an engine with `enable_prompt_embeds` (which rclc needs): the engine's
    tokenizer gains a `<prompt_embeds>` token past the model's vocabulary, which llguidance
    refuses ("vocab size too small"). An engine configured for another backend is refused
    here with the fix, and a Lark grammar (HF only) is refused too.
    """
    from vllm.sampling_params import StructuredOutputsParams  # the optional extra

    configured = _structured_backend(engine)
    if configured not in (None, "auto", "xgrammar"):
        raise ConstraintError(
            f"constraint: this vLLM engine's structured outputs backend is {configured!r}; rclc's constraints run on "
            "xgrammar in vLLM: create the engine with structured_outputs_config={'backend': 'auto'} (the default)"
        )
    if constraint.kind == "json_schema":
        return StructuredOutputsParams(json=constraint.schema, disable_any_whitespace=True)
    if constraint.kind == "format":
        tag = {"type": "structural_tag", "format": _bounded_whitespace(json.loads(constraint.source))}
        return StructuredOutputsParams(structural_tag=json.dumps(tag))
    raise ConstraintError(
        "constraint: a Lark grammar runs on the HF backend only; on vLLM use Constraint.json_schema or Constraint.format"
    )


def _bounded_whitespace(node: Any) -> Any:
    """The format tree with at most one white-space character between a JSON document's tokens
    (what the HF backend's one-line JSON allows, near enough): free white space lets a small
    model spend its tokens on blank lines."""
    if isinstance(node, dict):
        node = {key: _bounded_whitespace(value) for key, value in node.items()}
        if node.get("type") == "json_schema":
            node.setdefault("max_whitespace_cnt", 1)
        return node
    if isinstance(node, list):
        return [_bounded_whitespace(value) for value in node]
    return node


def _structured_backend(engine: Any) -> str | None:
    """The engine's configured structured-outputs backend (None when it cannot be read)."""
    config = getattr(getattr(getattr(engine, "llm_engine", None), "vllm_config", None), "structured_outputs_config", None)
    return getattr(config, "backend", None)
