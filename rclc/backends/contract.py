"""The backend contract: every piece of model work a bound `Agent` asks for, in one base class.

`Agent` keeps the lifecycle (history or retained state, the pending continuation, the
inbox) and never touches a model directly; it calls exactly these methods. A backend is
the model side: `HFBackend` runs a Hugging Face model in this process, `VLLMBackend` an
in-process vLLM engine (its selection runs on an HF-shaped view of the engine's weights).
A new engine (a continuous-batching one, say) plugs in by implementing this class.

Who calls what, and when:

- at binding: the constructor, then `context_limit(requested)`;
- before any model work and at every send: `require_idle()`;
- to send or extend state: `from_history`, `explicit`, `extend`, `restore`;
- for native generation in the user's own loop: `generation_inputs` (from `pop()` and
  `inputs()`), then `continuation` from `update(inputs=..., generation=...)`, which
  reads the rows back with `prefix_rows`;
- for `Agent.generate`: `generation_inputs` or `prompt_inputs` (or `state_inputs` when it
  continues the retained state), then `generate`, then `continuation`, then `restore`
  when a refresh is asked for and `records_by_prefill` is False.

Every method returns a new, validated `SenderState` (or inputs) and leaves its arguments
untouched; `generate` and the state builders are blocking and run in worker threads.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..generation import Sampling
from ..state import SenderState, embedding_weight

TokenCallback = Callable[[int, str], None]
"""`on_token(index, text)`: called from the generating worker thread, in token order."""


@dataclass(frozen=True)
class NativeGeneration:
    """What `Backend.generate` returns: the new token IDs `[n]` (int64), the backend's own
    output (what `continuation` records), and whether the `stop` event ended it early."""

    token_ids: torch.Tensor
    output: Any
    stopped: bool = False


class Backend(ABC):
    """Model work for one bound agent (see the module docs for the calling order)."""

    name: ClassVar[str]
    """`"hf"` or `"vllm"`: the `backend=` an agent was bound with."""
    records_by_prefill: ClassVar[bool]
    """True when `continuation` already builds its state in one prefill of the rows, so a
    refresh after it would repeat the same work."""

    model: Any
    """The HF model (for vLLM: the HF-shaped view over the engine's weights)."""
    tokenizer: Any
    """The tokenizer states are rendered and decoded with (for vLLM: the engine's)."""
    engine: Any
    """The vLLM engine, or None when there is none."""

    @property
    def weight(self) -> torch.Tensor:
        """The input embedding table `[vocab, hidden]` rows are looked up in."""
        return embedding_weight(self.model)

    @abstractmethod
    def context_limit(self, requested: int | None) -> int:
        """The agent's window: `requested`, checked against the backend's limit, or that limit."""

    @abstractmethod
    def require_idle(self) -> None:
        """Raise `EngineBusyError` when the model is serving other requests right now."""

    @abstractmethod
    def from_history(self, ids: torch.Tensor, previous: SenderState | None) -> SenderState:
        """State for rendered history IDs `[1, n]`, reusing `previous` where its IDs are a prefix."""

    @abstractmethod
    def explicit(self, prompt: Any, past_key_values: Any, generation: Any, request_id: Any) -> SenderState:
        """State for what `update(prompt, past_key_values=, generation=, request_id=)` was given."""

    @abstractmethod
    def extend(self, state: SenderState, new_ids: torch.Tensor) -> SenderState:
        """`state` followed by the tokens `new_ids` `[1, n]` (the latent tail ends)."""

    @abstractmethod
    def generation_inputs(self, rows: torch.Tensor, output: int) -> dict[str, Any]:
        """Native generation inputs for `[T, hidden]` rows with `output` new tokens at most."""

    @abstractmethod
    def prompt_inputs(self, ids: torch.Tensor, output: int) -> dict[str, Any]:
        """Native generation inputs for a token-ID prompt `[1, n]` with `output` new tokens at most."""

    def state_inputs(self, state: SenderState, output: int) -> dict[str, Any]:
        """Native generation inputs that continue `state` itself (after `Agent.append`, say).

        What `continuation` then records is `state`'s rows followed by the new tokens, as for
        `generation_inputs(state.input_embeds, output)`, which is this default: backends that
        can reuse the state's cache override it so the history is not prefilled again.
        """
        return self.generation_inputs(state.input_embeds, output)

    @abstractmethod
    def prefix_rows(self, inputs: dict[str, Any], positions: int) -> torch.Tensor:
        """The `[positions, hidden]` rows `generation_inputs` put in `inputs`; refuse replaced rows."""

    @abstractmethod
    def generate(
        self, inputs: dict[str, Any], sampling: Sampling, *, on_token: TokenCallback | None, stop: threading.Event | None
    ) -> NativeGeneration:
        """Generate natively from `inputs` (from `generation_inputs` or `prompt_inputs`).

        Blocking: runs in a worker thread under the core's locks. Ends after the current
        step once `stop` is set or the awaiting caller is cancelled (where the engine
        allows it), reporting each token through `on_token` when given.
        """

    @abstractmethod
    def continuation(
        self, inputs: dict[str, Any], known_ids: torch.Tensor, inherited: int, generation: Any
    ) -> SenderState:
        """The state after generating from `inputs`: its prompt (IDs `known_ids`), then the new tokens."""

    @abstractmethod
    def restore(
        self, rows: torch.Tensor, ids: torch.Tensor | None, latent_steps: int, inherited: int
    ) -> SenderState:
        """A state re-prefilled from validated rows (snapshot loads, refreshes, absorbed handoffs)."""
