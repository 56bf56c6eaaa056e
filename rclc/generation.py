"""What a native generation is asked to do (`Sampling`) and what it returns (`GenerationResult`).

Backend-neutral values for `Agent.generate`: each backend turns `Sampling` into its own
settings (HF `GenerationConfig`, vLLM `SamplingParams`). Plain Python, no torch.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass
from typing import Any

from ._arguments import is_exact_int, optional_int, require_bool, require_int
from .constraints import Constraint
from .errors import RclcError
from .policy import (
    DEFAULT_CAPTURE_BATCH,
    DEFAULT_MAX_BATCH,
    DEFAULT_PREFILL_BATCH,
    DEFAULT_PREFIX_CACHE_MIB,
    DEFAULT_PREFILL_FIRST_MS,
    DEFAULT_WAIT_MS,
    DEFAULT_WORKER_FORWARDS,
)

__all__ = ["Batching", "GenerationResult", "Sampling", "check_generate_options"]


MAX_SEED = 2**64 - 1  # torch.manual_seed refuses anything larger


@dataclass(frozen=True)
class Sampling:
    """Decoding settings: greedy when `temperature` is None, else sampling with `top_p` and `seed`.

    When sampling, the seed seeds a random generator of this generation's own (HF) or the
    request's (vLLM), so what is drawn does not depend on other generations decoded in the
    same batch, and the caller's global random state is never touched. Greedy decoding
    draws nothing.

    `constraint` (an `rclc.Constraint`: a JSON Schema or a grammar) restricts every token to
    those that keep the output matching it (constrained decoding): the HF backend masks the
    sequence's logits with llguidance before choosing, vLLM uses its structured outputs.
    """

    temperature: float | None = None
    top_p: float | None = None
    seed: int = 0
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None:
            if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
                raise RclcError(f"temperature: expected a number > 0 or None (greedy), got {self.temperature!r}")
            if not (math.isfinite(self.temperature) and self.temperature > 0):
                raise RclcError(f"temperature: expected a finite number > 0 or None (greedy), got {self.temperature!r}")
        if self.top_p is not None:
            if self.temperature is None:
                raise RclcError("top_p: it needs sampling; set temperature as well, or drop top_p")
            if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
                raise RclcError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        if not is_exact_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            raise RclcError(f"seed: expected an int in [0, 2**64 - 1] (what torch's generator takes), got {self.seed!r}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise RclcError(
                f"constraint: expected rclc.Constraint (Constraint.json_schema(...) or Constraint.lark(...)) or None, "
                f"got {type(self.constraint).__name__}"
            )

    @property
    def greedy(self) -> bool:
        """True when decoding picks the most likely token at every step (no temperature)."""
        return self.temperature is None


@dataclass(frozen=True)
class Batching:
    """How concurrent native generations on one model share its forwards.

    With `enabled` (the default) every generation on a model is decoded by that model's
    batching engine: sequences join after their prefill, decode together, at most
    `max_batch` at a time, and leave when they end. A decode step with room in its batch
    waits up to `wait_ms` milliseconds for another sequence to join. `enabled=False` is
    `max_batch=1`: generations decode one at a time, in arrival order, through the same
    decode loop (so greedy and sampled outputs are the same either way, up to float
    rounding). `worker_forwards` is how many of the model's other forwards (prefills of
    prompts and received rows, selectors' captures, refreshes), which run in callers' worker
    threads, may run at once (HF models; a vLLM engine runs one step at a time). Set per
    model with `rclc.configure_batching(model, Batching(...))`.

    Prompts (HF models): with `shared_prefixes` a token prompt starting with the same token
    IDs as one the model prefilled before reuses that prefix's KV (kept in a store of at most
    `prefix_cache_mib` MiB per model) and forwards only the rest; up to `prefill_batch`
    token prompts that wait for the model together are prefilled in one forward over the
    prefix they share. Both agree with one causal prefill up to float32 rounding
    (docs/performance.md); `shared_prefixes=False, prefill_batch=1` prefills every prompt
    alone and whole, exactly as before they existed.

    Captures (HF models): the request captures of up to `capture_batch` transfers that wait
    for the model together (concurrent runs' selections) are folded in one forward; each
    fold is what a capture alone computes up to a BLAS that rounds a row differently at
    another batch size (docs/performance.md). `capture_batch=1` captures each transfer's
    senders in their own forward, as before.
    """

    enabled: bool = True
    max_batch: int = DEFAULT_MAX_BATCH
    wait_ms: float = DEFAULT_WAIT_MS
    worker_forwards: int = DEFAULT_WORKER_FORWARDS
    shared_prefixes: bool = True
    prefill_batch: int = DEFAULT_PREFILL_BATCH
    prefix_cache_mib: int = DEFAULT_PREFIX_CACHE_MIB
    capture_batch: int = DEFAULT_CAPTURE_BATCH
    prefill_first_ms: float = DEFAULT_PREFILL_FIRST_MS

    def __post_init__(self) -> None:
        require_bool("enabled", self.enabled)
        require_int("max_batch", self.max_batch, minimum=1)
        require_int("worker_forwards", self.worker_forwards, minimum=1)
        require_bool("shared_prefixes", self.shared_prefixes)
        require_int("prefill_batch", self.prefill_batch, minimum=1)
        require_int("prefix_cache_mib", self.prefix_cache_mib, minimum=0)
        require_int("capture_batch", self.capture_batch, minimum=1)
        for name in ("wait_ms", "prefill_first_ms"):
            wait = getattr(self, name)
            if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
                raise RclcError(f"{name}: expected a finite number of milliseconds >= 0, got {wait!r}")

    @property
    def batch_limit(self) -> int:
        """Sequences decoded together at most: `max_batch`, or 1 when batching is off."""
        return self.max_batch if self.enabled else 1

    def to_dict(self) -> dict[str, Any]:
        """The options as plain data (reports, `rclc.check()`)."""
        return {**asdict(self), "wait_ms": float(self.wait_ms), "prefill_first_ms": float(self.prefill_first_ms)}



class BatchingLoop:
    """What the HF batching engine and the vLLM submission loop share: the options in force,
    replaced under the loop's condition so a waiting loop sees them at its next step."""

    def __init__(self, batching: Batching) -> None:
        self.batching = batching
        self._cond = threading.Condition()

    def configure(self, batching: Batching) -> None:
        """New options; they apply from the next step on."""
        with self._cond:
            self.batching = batching
            self._cond.notify_all()

@dataclass(frozen=True)
class GenerationResult:
    """One native generation, already recorded in the agent.

    `token_ids` are the generated tokens only; `text` is their decoding without special
    tokens, stripped; `seconds` is the wall time of the generation itself (waiting for the
    model included, recording excluded); `stopped` is True when the `stop` event ended it
    before its natural end (HF only: a vLLM generation always runs to its end).
    """

    token_ids: tuple[int, ...]
    text: str
    seconds: float
    stopped: bool = False

    @property
    def tokens(self) -> int:
        """How many tokens were generated."""
        return len(self.token_ids)


def check_generate_options(
    sampling: Any, deliveries: Any, max_new_tokens: Any, on_token: Any, stop: Any, refresh: Any
) -> Sampling:
    """Check `Agent.generate`'s options before anything is taken from the queue; return the sampling."""
    sampling = Sampling() if sampling is None else sampling
    if not isinstance(sampling, Sampling):
        raise RclcError(f"sampling: expected rclc.Sampling or None (greedy), got {type(sampling).__name__}")
    optional_int("deliveries", deliveries, minimum=0)
    optional_int("max_new_tokens", max_new_tokens, minimum=1)
    require_bool("refresh", refresh)
    if on_token is not None and not callable(on_token):
        raise RclcError(f"on_token: expected a callable on_token(index, text), got {type(on_token).__name__}")
    if stop is not None and not isinstance(stop, threading.Event):
        raise RclcError(f"stop: expected a threading.Event or None, got {type(stop).__name__}")
    return sampling
