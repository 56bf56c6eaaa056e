"""rclc: receiver-conditioned state transfer between agents that share one local model.

The whole public surface is listed here (`__all__`, grouped). `import rclc` is cheap and
imports no torch: every torch-backed name (agents, `transfer`, states, ...) is imported
the first time it is used (PEP 562 `__getattr__`), so code that only needs the error
classes, the policy constants or atomic files never pays for torch.

Public submodules (each documented in docs/api.md):

- `rclc.errors`    the exception tree (torch-free)
- `rclc.policy`    budgets, fitting, defaults and built-in names (torch-free)
- `rclc.files`     atomic, durable file writes (torch-free)
- `rclc.models`    supported families, `check_model`, the embedded model (torch-free until `load`)
- `rclc.selectors` the built-in selectors and the selector contract's checks
- `rclc.testing`   tiny random models for tests
- `rclc.vllm`      the vLLM adapter (imports vLLM only when an engine is used)
- `rclc.backends`  the backend contract, for authors of a new engine backend

Everything else (modules whose names start with `_`, and the implementation modules
behind the names below) is private and may change without notice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors as _errors
from .errors import *  # noqa: F403  (the exception tree: every name in rclc.errors.__all__)

__version__ = "0.1.0"

# Torch-backed names -> the module that defines them, imported on first use.
_LAZY: dict[str, str] = {
    "Agent": "agent",
    "bind": "agent",
    "HFReceiver": "receiver",
    "sender_from_hf": "hf_senders",
    "transfer": "pipeline",
    "transfer_sync": "pipeline",
    "Delivery": "state",
    "Message": "state",
    "SenderState": "state",
    "Selection": "selection",
    "Span": "selection",
    "Exclusion": "exclusion",
    "latent_mass": "reasoning",
    "latent_mass_sync": "reasoning",
    "GenerationResult": "generation",
    "Sampling": "generation",
    "Batching": "generation",
    "Constraint": "constraints",
    "configure_batching": "backends.batching",
    "batching_report": "backends.batching",
    "model_identity": "snapshot",
    "run_in_worker": "_worker",
    "thread_safe": "user_code",
    "is_thread_safe": "user_code",
    "call_sync": "_sync",
    "check": "doctor",
    "Encoding": "literal",
    "encode_chat": "literal",
    "encode_literal": "literal",
}
_SUBMODULES = frozenset({"backends", "errors", "files", "models", "policy", "selectors", "testing", "vllm"})

__all__ = [
    # binding agents, sending and receiving
    "Agent",
    "HFReceiver",
    "bind",
    "sender_from_hf",
    "transfer",
    "transfer_sync",
    # what a handoff is made of
    "Delivery",
    "Message",
    "SenderState",
    "Selection",
    "Span",
    # receiver-aware selection
    "Exclusion",
    # reasoning
    "latent_mass",
    "latent_mass_sync",
    # native generation, and how concurrent generations share a model
    "Batching",
    "Constraint",
    "GenerationResult",
    "Sampling",
    "batching_report",
    "configure_batching",
    # tokenizing user text as literal text (never control tokens)
    "Encoding",
    "encode_chat",
    "encode_literal",
    # snapshots, concurrency and diagnostics
    "call_sync",
    "check",
    "model_identity",
    "run_in_worker",
    # user selectors and reasoning methods take turns unless declared thread-safe
    "is_thread_safe",
    "thread_safe",
    # the package
    "__version__",
]
__all__ += _errors.__all__  # the exception tree (rclc.errors), torch-free and imported eagerly


def __getattr__(name: str) -> Any:
    """Import a torch-backed name or a public submodule the first time it is used."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


if TYPE_CHECKING:  # what type checkers and IDEs see; at runtime these load lazily
    from . import backends, files, models, policy, selectors, testing, vllm  # noqa: F401
    from ._sync import call_sync
    from ._worker import run_in_worker
    from .agent import Agent, bind
    from .backends.batching import batching_report, configure_batching
    from .constraints import Constraint
    from .doctor import check
    from .exclusion import Exclusion
    from .generation import Batching, GenerationResult, Sampling
    from .hf_senders import sender_from_hf
    from .literal import Encoding, encode_chat, encode_literal
    from .pipeline import transfer, transfer_sync
    from .reasoning import latent_mass, latent_mass_sync
    from .receiver import HFReceiver
    from .selection import Selection, Span
    from .snapshot import model_identity
    from .state import Delivery, Message, SenderState
    from .user_code import is_thread_safe, thread_safe
