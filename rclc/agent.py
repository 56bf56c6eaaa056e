"""Bound agents: wrap the model, tokenizer and history an application already has.

An `Agent` is both a sender (its position in `transfer` decides) and an inbox. It keeps
either *history* state (rendered from `messages` lazily, reusing the cached prefix) or
*retained* state (set explicitly, by a recorded continuation, an append or a load). After
`pop()`/`inputs()` the agent holds a pending continuation, and refuses to send or pop
again until `update(inputs=..., generation=...)` records it, so stale state is never sent.
Every method computes its new state first and assigns it last: a failure keeps the old one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ._checks import optional_int, require_int
from ._hf_backend import HFBackend
from ._locks import preparation_lock
from ._worker import run_in_worker
from .hf import HFReceiver, _is_messages, prompt_ids, render_messages
from .state import Delivery, SenderState

BACKENDS = ("hf", "vllm")


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

    def __init__(
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
            raise ValueError(f"backend: {backend!r} is not one of {BACKENDS}")
        if type(allow_unstable) is not bool:
            raise ValueError(f"allow_unstable: expected True or False, got {allow_unstable!r}")
        if backend == "hf" and (request_id is not None or allow_unstable):
            raise ValueError("request_id, allow_unstable: these apply to backend='vllm' only")
        require_int("max_new_tokens", max_new_tokens, minimum=1)
        if backend == "vllm":
            from .vllm.backend import VLLMBackend

            self._backend = VLLMBackend(model, tokenizer, allow_unstable=allow_unstable)
            hf_model, tokenizer = self._backend.model, self._backend.tokenizer
            context_limit = self._backend.context_limit(context_limit)
        else:
            self._backend = HFBackend(model, tokenizer)
            hf_model = model
        super().__init__(hf_model, tokenizer, messages=messages, max_new_tokens=max_new_tokens, context_limit=context_limit)
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
            raise ValueError(
                "agent: a continuation is pending; record it with agent.update(inputs=..., generation=...) "
                "before sending, or pop(discard_pending=True)"
            )
        if not self._from_history:
            assert self._state is not None
            return self._state
        if not self.messages:
            raise ValueError(
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
                    raise ValueError(
                        "inputs: pass the exact dictionary returned by this agent's latest pop() or inputs()"
                    )
                if prompt is not None or past_key_values is not None or request_id is not None:
                    raise ValueError("inputs: pass only generation= with inputs= (no prompt, cache or request_id)")
                if generation is None:
                    raise ValueError("generation: required with inputs=; pass the output of generating from them")
                state = self._backend.continuation(inputs, pending.known_ids, pending.inherited_positions, generation)
                self._state, self._from_history, self._pending = state, False, None
                return
            if self._pending is not None and generation is not None:
                raise ValueError(
                    "generation: a continuation is pending; record it with update(inputs=..., generation=...)"
                )
            if prompt is None and past_key_values is None and generation is None and request_id is None:
                self._state, self._from_history, self._pending = None, True, None
                return
            state = self._backend.explicit(prompt, past_key_values, generation, request_id)
            self._state, self._from_history, self._pending = state, False, None

    # -- continuation ------------------------------------------------------------------

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
        if type(discard_pending) is not bool:
            raise ValueError(f"discard_pending: expected True or False, got {discard_pending!r}")
        if self._pending is not None and not discard_pending:
            raise ValueError(
                "agent: the previous continuation is pending; record it with update(inputs=..., generation=...) "
                "or pop(discard_pending=True)"
            )
        taken = self._take(deliveries)
        generic, ids = self._build_inputs(taken, prompt, max_new_tokens)
        rows = generic["inputs_embeds"][0]
        inputs = self._backend.generation_inputs(rows, generic["max_new_tokens"])
        received = [delivery for delivery, _ in taken]
        known = torch.cat([*(_known_ids(d, rows.device) for d in received), ids[0].to(rows.device)])
        for _ in taken:
            self._queue.popleft()
        self._pending = _Pending(inputs, known, sum(d.positions for d in received))
        return inputs

    async def absorb(self, *, prompt: Any = None, deliveries: int = 1) -> None:
        """Make received rows + prompt the retained state without generating anything.

        For agents that only read and pass state on (a chain-of-agents worker): the k oldest
        deliveries, then `prompt` (or the planned prompt), are prefilled as one state whose
        inherited prefix is the received rows. Deliveries leave the queue only on success.
        """
        if self._pending is not None:
            raise ValueError("agent: a continuation is pending; record it with update(inputs=..., generation=...) first")
        taken = self._take(deliveries)

        def build() -> SenderState:
            generic, ids = self._build_inputs(taken, prompt, 1)
            rows = generic["inputs_embeds"][0]
            received = [delivery for delivery, _ in taken]
            known = torch.cat([*(_known_ids(d, rows.device) for d in received), ids[0].to(rows.device)])
            return self._backend.restore(rows, known, 0, sum(d.positions for d in received))

        state = await run_in_worker(build)
        for _ in taken:
            self._queue.popleft()
        self._state, self._from_history = state, False

    async def inputs(self, *, max_new_tokens: int | None = None) -> dict[str, Any]:
        """Generate inputs from the retained state itself, without consuming queued handoffs."""
        optional_int("max_new_tokens", max_new_tokens, minimum=1)

        def prepare() -> tuple[SenderState, dict[str, Any], _Pending]:
            with preparation_lock:
                state = self._resolve_state()
            output = max_new_tokens or self.max_new_tokens or 1
            if state.positions + output > self.context_limit:
                raise ValueError(
                    f"context space: {state.positions} positions + {output} output exceed the context limit "
                    f"of {self.context_limit}; generate fewer tokens (max_new_tokens=) or shorten the state"
                )
            rows = state.input_embeds.clone()
            known = state.token_ids.clone() if state.token_ids is not None else torch.full(
                (state.positions,), -1, dtype=torch.int64, device=rows.device
            )
            inputs = self._backend.generation_inputs(rows, output)
            return state, inputs, _Pending(inputs, known, state.inherited_positions)

        state, inputs, pending = await run_in_worker(prepare)
        self._remember(state)
        self._pending = pending
        return inputs

    async def append(self, prompt: Any) -> None:
        """Append rendered text or `[1, n]` IDs to the retained state (no template, nothing generated).

        Received rows, their -1 IDs and the inherited count survive; the latent tail ends
        (new tokens follow it). The extension runs on a private cache copy and the agent
        switches to it only on success, so a failure or cancellation keeps the old state.
        """
        if _is_messages(prompt):
            raise ValueError(
                "prompt: append takes rendered text or IDs [1, n], not chat messages; render them first "
                "(append applies no chat template)"
            )

        def extend() -> SenderState:
            with preparation_lock:
                state = self._resolve_state()
                new_ids = prompt_ids(self.model, self.tokenizer, prompt)
                total = state.positions + new_ids.shape[1]
                if total > self.context_limit:
                    raise ValueError(
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
        if self._pending is not None:
            raise ValueError("refresh: a continuation is pending; record it with update(inputs=..., generation=...) first")

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
        if self._pending is not None:
            raise ValueError(f"{action}: a continuation is pending; record it with update(inputs=..., generation=...) first")
        if self._queue:
            raise ValueError(f"{action}: {len(self._queue)} handoffs are queued; pop them first")

    async def save(self, path: Any) -> None:
        """Write the retained state (rows, IDs, counts, model identity) atomically to safetensors."""
        from .snapshot import model_identity, write_snapshot

        self._require_quiet("save")

        def write() -> SenderState:
            with preparation_lock:
                state = self._resolve_state()
            write_snapshot(path, state, model_identity(self.model, self.tokenizer))
            return state

        self._remember(await run_in_worker(write))

    async def load(self, path: Any) -> None:
        """Restore a snapshot: validate everything, re-prefill, then switch to it (else keep the old)."""
        from .snapshot import read_snapshot

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
        deliveries = []
        for delivery, prepared in self._queue:
            retained = [message.positions for message in delivery.messages]
            entry: dict[str, Any] = {
                "senders": len(delivery.messages),
                "retained_positions": retained,
                "payload_bytes": delivery.nbytes,
                "prompt_positions": int(prepared.input_ids.shape[1]),
                "reserved_output_positions": prepared.max_new_tokens,
                "remaining_positions": prepared.available_positions - sum(retained),
            }
            if selection:
                entry["selection"] = [None if m.selection is None else m.selection.inspect() for m in delivery.messages]
            deliveries.append(entry)
        return {
            "backend": self.backend,
            "state_source": "messages" if self._from_history else "retained",
            "cached_positions": 0 if state is None else state.positions,
            "inherited_positions": 0 if state is None else state.inherited_positions,
            "latent_steps": 0 if state is None else state.latent_steps,
            "pending_generation": self._pending is not None,
            "queued_requests": len(self._queue),
            "context_limit": self.context_limit,
            "deliveries": deliveries,
        }


def _known_ids(delivery: Delivery, device: torch.device) -> torch.Tensor:
    """Token IDs of received positions where the message carried them, else -1."""
    parts = []
    for message in delivery.messages:
        if message.token_ids is not None:
            parts.append(message.token_ids.to(device))
        else:
            parts.append(torch.full((message.positions,), -1, dtype=torch.int64, device=device))
    return torch.cat(parts)


bind = Agent
