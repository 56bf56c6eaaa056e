"""Bound agents: wrap the model, tokenizer and history an application already has.

An `Agent` is both a sender (its position in `transfer` decides) and an inbox. It keeps
either *history* state (rendered from `messages` lazily, reusing the cached prefix) or
*retained* state (set explicitly, by a recorded continuation, an append or a load). After
`pop()`/`inputs()` the agent holds a pending continuation, and refuses to send or pop
again until `update(inputs=..., generation=...)` records it, so stale state is never sent.
Every method computes its new state first and assigns it last: a failure keeps the old one.
`generate` runs the backend's own generation in one call (pop, generate, record).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from ._arguments import optional_int, require_bool, require_int
from ._locks import preparation_lock
from ._worker import run_in_worker
from .backends import BACKENDS, Backend, TokenCallback, open_backend
from .backends.native import generate_continuation
from .errors import AgentStateError, ContextLimitError, RclcError
from .generation import GenerationResult, Sampling, check_generate_options
from .hf_senders import is_messages, prompt_ids, render_messages
from .literal import encode_literal
from .receiver import HFReceiver
from .snapshot import model_identity, read_snapshot, write_snapshot
from .state import SenderState


@dataclass(frozen=True)
class _Pending:
    """A continuation handed to native generation and not yet recorded."""

    inputs: dict[str, Any]
    known_ids: torch.Tensor
    inherited_positions: int


class Agent(HFReceiver):
    """`rclc.bind(model, tokenizer, messages=history)`: an existing agent as sender and receiver.

    Bind with `messages` (lazy, cached history prefill), or explicit `prompt` /
    `past_key_values`, or a `generation` output; `messages` are still the receiver history
    when explicit state is given. `max_new_tokens` (default 128) and `context_limit`
    (default: the model's) are the output reservation and window used when this agent
    receives. Its position in `transfer` decides whether it sends or receives.
    """

    def __init__(  # rclc.bind's public signature (api.md): one keyword per way to start an agent, so 11 parameters
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        backend: str = "hf",
        messages: Any = None,
        prompt: Any = None,
        past_key_values: Any = None,
        generation: Any = None,
        max_new_tokens: int = 128,
        context_limit: int | None = None,
        request_id: Any = None,
        allow_unstable: bool = False,
    ) -> None:
        if backend not in BACKENDS:
            raise RclcError(f"backend: {backend!r} is not one of {BACKENDS}")
        require_bool("allow_unstable", allow_unstable)
        if backend == "hf" and (request_id is not None or allow_unstable):
            raise RclcError("request_id, allow_unstable: these apply to backend='vllm' only")
        require_int("max_new_tokens", max_new_tokens, minimum=1)
        self._backend: Backend = open_backend(backend, model, tokenizer, allow_unstable=allow_unstable)
        context_limit = self._backend.context_limit(context_limit)
        super().__init__(
            self._backend.model,
            self._backend.tokenizer,
            messages=messages,
            max_new_tokens=max_new_tokens,
            context_limit=context_limit,
        )
        self.backend = backend
        self.allow_unstable = allow_unstable
        self._state: SenderState | None = None
        self._from_history = True
        self._pending: _Pending | None = None
        if any(value is not None for value in (prompt, past_key_values, generation, request_id)):
            self.update(prompt, past_key_values=past_key_values, generation=generation, request_id=request_id)

    @property
    def engine(self) -> Any:
        """The vLLM engine, or None for HF agents."""
        return self._backend.engine

    # -- state -------------------------------------------------------------------------

    def _resolve_state(self) -> SenderState:
        """The state to send, extend or save, computed without committing anything.

        In history mode this renders the messages and reuses the cached prefix; the caller
        decides whether to keep the result (see `_remember`), so a failed or cancelled
        operation leaves even the cache as it was. Callers hold the preparation lock.
        """
        self._backend.require_idle()
        if self._pending is not None:
            raise AgentStateError(
                "agent: a continuation is pending; record it with agent.update(inputs=..., generation=...) "
                "before sending, or pop(discard_pending=True)"
            )
        if not self._from_history:
            assert self._state is not None
            return self._state
        if not self.messages:
            raise AgentStateError(
                "agent: it has no state; bind it with messages=, prompt= or generation=, or call agent.update(prompt)"
            )
        ids = render_messages(self.tokenizer, self.messages, generation_prompt=False)
        return self._backend.from_history(ids, self._state)

    def _remember(self, state: SenderState) -> None:
        """Keep a history prefill so the next send only prefills what the history appended."""
        if self._from_history and self._pending is None:
            self._state = state

    def sender_state(self) -> SenderState:
        """The state this agent sends: retained state, or its history (prefilled lazily)."""
        with preparation_lock:
            state = self._resolve_state()
            self._remember(state)
            return state

    def update(
        self,
        prompt: Any = None,
        *,
        past_key_values: Any = None,
        generation: Any = None,
        inputs: dict[str, Any] | None = None,
        request_id: Any = None,
    ) -> None:
        """Record what happened outside rclc: a continuation, a new prompt/cache, or back to history."""
        with preparation_lock:
            self._backend.require_idle()
            if inputs is not None:
                pending = self._pending
                if pending is None or inputs is not pending.inputs:
                    raise AgentStateError(
                        "inputs: pass the exact dictionary returned by this agent's latest pop() or inputs()"
                    )
                if prompt is not None or past_key_values is not None or request_id is not None:
                    raise RclcError("inputs: pass only generation= with inputs= (no prompt, cache or request_id)")
                if generation is None:
                    raise RclcError("generation: required with inputs=; pass the output of generating from them")
                state = self._backend.continuation(inputs, pending.known_ids, pending.inherited_positions, generation)
                self._state, self._from_history, self._pending = state, False, None
                return
            self._refuse_generation_while_pending(generation)
            if prompt is None and past_key_values is None and generation is None and request_id is None:
                self._state, self._from_history, self._pending = None, True, None
                return
        # The prefill reads no agent state, so it runs outside the process-wide lock (under
        # its model's forward slot only): other runs' selections and prefills go on meanwhile.
        state = self._backend.explicit(prompt, past_key_values, generation, request_id)
        with preparation_lock:
            self._backend.require_idle()
            self._refuse_generation_while_pending(generation)
            self._state, self._from_history, self._pending = state, False, None

    def _refuse_generation_while_pending(self, generation: Any) -> None:
        """AgentStateError for a `generation` recorded while a continuation is pending (caller
        holds the preparation lock; `update` checks before its prefill and again at commit)."""
        if self._pending is not None and generation is not None:
            raise AgentStateError(
                "generation: a continuation is pending; record it with update(inputs=..., generation=...)"
            )

    # -- continuation ------------------------------------------------------------------

    def _require_no_pending(self, action: str) -> None:
        if self._pending is not None:
            raise AgentStateError(
                f"{action}: a continuation is pending; record it with update(inputs=..., generation=...) first"
            )

    def pop(
        self,
        *,
        prompt: Any = None,
        max_new_tokens: int | None = None,
        discard_pending: bool = False,
        deliveries: int = 1,
    ) -> dict[str, Any]:
        """Generate inputs for the oldest handoff (received rows, then this agent's prompt).

        The handoff leaves the queue and becomes the pending continuation only on success;
        record it with `update(inputs=..., generation=...)` before the next pop or send.
        """
        require_bool("discard_pending", discard_pending)
        if self._pending is not None and not discard_pending:
            raise AgentStateError(
                "agent: the previous continuation is pending; record it with update(inputs=..., generation=...) "
                "or pop(discard_pending=True)"
            )
        taken = self._take(deliveries)
        joined = self._join(taken, prompt, max_new_tokens)
        inputs = self._backend.generation_inputs(joined.rows, joined.max_new_tokens)
        for _ in taken:
            self._queue.popleft()
        self._pending = _Pending(inputs, joined.known_ids, joined.inherited)
        return inputs

    async def generate(
        self,
        prompt: Any = None,
        *,
        deliveries: int | None = None,
        max_new_tokens: int | None = None,
        sampling: Sampling | None = None,
        on_token: TokenCallback | None = None,
        stop: threading.Event | None = None,
        refresh: bool = False,
        from_state: bool = False,
    ) -> GenerationResult:
        """Generate natively from queued handoffs (or a prompt alone) and record the continuation.

        With `deliveries=k` (default: every queued handoff) the k oldest are joined before
        `prompt` (default: the prompt planned for the last of them), as `pop(deliveries=k)`
        does; with none queued (or `deliveries=0`) generation starts from `prompt` alone
        (rendered text or `[1, n]` IDs) and this agent's state is replaced by it. The
        backend generates (`model.generate` or `llm.generate`) with `sampling` (default
        greedy), calls `on_token(index, text)` from the worker thread for each new token
        (HF: as it is generated; vLLM: once generation returns), and the agent's state
        becomes prompt rows + generated tokens, exactly as `update(inputs=..., generation=...)`
        records it. `refresh=True` then re-prefills it as `refresh()` does (vLLM
        continuations already are one prefill).

        With `from_state=True` generation continues the retained state itself (no prompt, no
        handoff taken): after `append` of a tool result, say, the agent generates its next
        turn from everything it holds, and the state grows by the new tokens. The HF backend
        reuses the state's cache (only its last position is forwarded again); vLLM prefills
        the rows as one prompt.

        Setting `stop` ends an HF generation after the current step; what was generated is
        recorded and the result says `stopped`. Cancelling the awaiting task also ends it
        after the current step, but records nothing. On any error or cancellation the state,
        the queue and any pending continuation are as they were.
        """
        sampling = check_generate_options(sampling, deliveries, max_new_tokens, on_token, stop, refresh)
        require_bool("from_state", from_state)
        self._require_no_pending("agent")
        if from_state:
            if prompt is not None or deliveries:
                raise RclcError(
                    "from_state: it continues the retained state; pass no prompt and no deliveries "
                    "(append text first with agent.append)"
                )
            return await self._generate_from_state(max_new_tokens, sampling, on_token, stop, refresh)
        count = len(self._queue) if deliveries is None else deliveries
        taken = self._take(count) if count else []
        if not taken and prompt is None:
            raise RclcError("prompt: no handoff is taken, so generation needs a prompt (rendered text or IDs [1, n])")
        backend = self._backend

        def generate() -> tuple[SenderState, GenerationResult]:
            if taken:
                joined = self._join(taken, prompt, max_new_tokens)
                inputs = backend.generation_inputs(joined.rows, joined.max_new_tokens)
                known, inherited = joined.known_ids, joined.inherited
            else:
                ids = prompt_ids(self.model, self.tokenizer, prompt)
                output = max_new_tokens or self.max_new_tokens or 1
                if ids.shape[1] + output > self.context_limit:
                    raise ContextLimitError(
                        f"context space: {ids.shape[1]} prompt + {output} output positions exceed the context "
                        f"limit of {self.context_limit}; generate fewer tokens (max_new_tokens=) or shorten the prompt"
                    )
                inputs, known, inherited = backend.prompt_inputs(ids, output), ids[0], 0
            return generate_continuation(
                backend, inputs, known, inherited, sampling=sampling, on_token=on_token, stop=stop, refresh=refresh
            )

        state, result = await run_in_worker(generate)
        for _ in taken:
            self._queue.popleft()
        self._state, self._from_history, self._pending = state, False, None
        return result

    async def _generate_from_state(
        self,
        max_new_tokens: int | None,
        sampling: Sampling,
        on_token: TokenCallback | None,
        stop: threading.Event | None,
        refresh: bool,
    ) -> GenerationResult:
        """`generate(from_state=True)`: the retained state's rows and cache, then new tokens."""
        backend = self._backend

        def generate() -> tuple[SenderState, GenerationResult]:
            state, output = self._state_with_room(max_new_tokens)
            inputs = backend.state_inputs(state, output)
            return generate_continuation(
                backend, inputs, state.known_ids().clone(), state.inherited_positions,
                sampling=sampling, on_token=on_token, stop=stop, refresh=refresh,
            )

        state, result = await run_in_worker(generate)
        self._state, self._from_history, self._pending = state, False, None
        return result

    async def absorb(self, *, prompt: Any = None, deliveries: int = 1) -> None:
        """Make received rows + prompt the retained state without generating anything.

        For agents that only read and pass state on (a chain-of-agents worker): the k oldest
        deliveries, then `prompt` (or the planned prompt), are prefilled as one state whose
        inherited prefix is the received rows. Deliveries leave the queue only on success.
        """
        self._require_no_pending("agent")
        taken = self._take(deliveries)

        def build() -> SenderState:
            joined = self._join(taken, prompt, 1)
            return self._backend.restore(joined.rows, joined.known_ids, 0, joined.inherited)

        state = await run_in_worker(build)
        for _ in taken:
            self._queue.popleft()
        self._state, self._from_history = state, False

    def _state_with_room(self, max_new_tokens: int | None) -> tuple[SenderState, int]:
        """The retained state and the tokens to generate after it, refused (state untouched)
        when they do not fit the context limit; runs in the worker thread."""
        with preparation_lock:
            state = self._resolve_state()
        output = max_new_tokens or self.max_new_tokens or 1
        if state.positions + output > self.context_limit:
            raise ContextLimitError(
                f"context space: {state.positions} positions + {output} output exceed the context limit "
                f"of {self.context_limit}; generate fewer tokens (max_new_tokens=) or shorten the state"
            )
        return state, output

    async def inputs(self, *, max_new_tokens: int | None = None) -> dict[str, Any]:
        """Generate inputs from the retained state itself, without consuming queued handoffs."""
        optional_int("max_new_tokens", max_new_tokens, minimum=1)

        def prepare() -> tuple[SenderState, dict[str, Any], _Pending]:
            state, output = self._state_with_room(max_new_tokens)
            rows = state.input_embeds.clone()
            inputs = self._backend.generation_inputs(rows, output)
            return state, inputs, _Pending(inputs, state.known_ids().clone(), state.inherited_positions)

        state, inputs, pending = await run_in_worker(prepare)
        self._remember(state)
        self._pending = pending
        return inputs

    async def append(self, prompt: Any, *, literal: bool = False) -> None:
        """Append rendered text or `[1, n]` IDs to the retained state (no template, nothing generated).

        Rendered text is your loop's template text: its role delimiters become control tokens.
        With `literal=True` the text is user text (a tool result, a document) and is tokenized
        as literal text: control-token text in it stays text (`rclc.literal`). Append the
        delimiters and the content separately to frame untrusted text safely.

        Received rows, their -1 IDs and the inherited count survive; the latent tail ends
        (new tokens follow it). The extension runs on a private cache copy and the agent
        switches to it only on success, so a failure or cancellation keeps the old state.
        """
        if is_messages(prompt):
            raise RclcError(
                "prompt: append takes rendered text or IDs [1, n], not chat messages; render them first "
                "(append applies no chat template)"
            )
        require_bool("literal", literal)
        if literal and not isinstance(prompt, str):
            raise RclcError("literal: only text can be appended as literal text; pass a string")

        def extend() -> SenderState:
            with preparation_lock:
                state = self._resolve_state()
                text = prompt
                if literal:
                    text = torch.tensor([encode_literal(self.tokenizer, prompt).ids], dtype=torch.int64)
                new_ids = prompt_ids(self.model, self.tokenizer, text)
                total = state.positions + new_ids.shape[1]
                if total > self.context_limit:
                    raise ContextLimitError(
                        f"prompt: appending {new_ids.shape[1]} positions gives {total}, above the context limit "
                        f"of {self.context_limit}; append less or reset with agent.update()"
                    )
                return self._backend.extend(state, new_ids)

        state = await run_in_worker(extend)
        self._state, self._from_history = state, False

    async def refresh(self) -> None:
        """Rebuild this agent's cache by re-prefilling its rows from position 0.

        After native generation the cache was built one token at a time, while a snapshot
        restored from the same rows is prefilled in one forward; the two agree only up to
        float rounding, which is enough to move a selector's scores (and, rarely, its
        choice). After `refresh()` the cache is exactly what `load()` of this state's
        snapshot builds, so a crashed run that resumes from snapshots selects what the
        uninterrupted run selected. Rows, IDs and counts are unchanged; on any error the
        old state is kept. Costs one prefill of the whole state.
        """
        self._require_no_pending("refresh")

        def rebuild() -> SenderState:
            with preparation_lock:
                state = self.sender_state()
                return self._backend.restore(
                    state.input_embeds, state.token_ids, state.latent_steps, state.inherited_positions
                )

        state = await run_in_worker(rebuild)
        self._state = state  # history-bound agents stay history-bound: their IDs are unchanged

    # -- snapshots ---------------------------------------------------------------------

    def _require_quiet(self, action: str) -> None:
        self._require_no_pending(action)
        if self._queue:
            raise AgentStateError(f"{action}: {len(self._queue)} handoffs are queued; pop them first")

    async def save(self, path: Any) -> None:
        """Write the retained state (rows, IDs, counts, model identity) atomically to safetensors."""
        self._require_quiet("save")

        def write() -> SenderState:
            with preparation_lock:
                state = self._resolve_state()
            write_snapshot(path, state, model_identity(self.model, self.tokenizer))
            return state

        self._remember(await run_in_worker(write))

    async def load(self, path: Any) -> None:
        """Restore a snapshot: validate everything, re-prefill, then switch to it (else keep the old)."""
        self._require_quiet("load")

        def read() -> SenderState:
            self._backend.require_idle()
            rows, ids, latent_steps, inherited = read_snapshot(
                path, self.model, self.tokenizer, context_limit=self.context_limit
            )
            return self._backend.restore(rows, ids, latent_steps, inherited)

        state = await run_in_worker(read)
        self._state, self._from_history, self._pending = state, False, None

    # -- inspection --------------------------------------------------------------------

    def inspect(self, *, selection: bool = False) -> dict[str, Any]:
        """A JSON-serialisable report; runs no forward pass and consumes nothing."""
        state = self._state
        return {
            "backend": self.backend,
            "state_source": "messages" if self._from_history else "retained",
            "cached_positions": 0 if state is None else state.positions,
            "inherited_positions": 0 if state is None else state.inherited_positions,
            "latent_steps": 0 if state is None else state.latent_steps,
            "pending_generation": self._pending is not None,
            "queued_requests": len(self._queue),
            "context_limit": self.context_limit,
            "deliveries": self._queue_report(selection=selection),
        }



bind = Agent
