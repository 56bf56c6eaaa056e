"""Every exception rclc raises on purpose, in one tree.

    ValueError
    └── RclcError                        bad input: the message starts with the field, then the fix
        ├── UnsupportedModelError        a model, engine or configuration rclc does not support
        ├── IncompatibleStateError       two parts of a handoff do not belong together
        ├── ContextLimitError            positions do not fit a context window
        ├── AgentStateError              an agent method called in the wrong lifecycle state
        ├── SnapshotError                a snapshot file rclc cannot or must not restore
        ├── SelectorError                a selector returned invalid positions
        ├── ReasoningError               a reasoning method returned an invalid state
        ├── ConstraintError              a generation constraint (JSON Schema, grammar) that cannot be used
        └── EmptyInboxError  (also IndexError)   popping more handoffs than are queued
    RuntimeError
    ├── EngineBusyError                  a vLLM engine has unfinished requests right now
    └── CaptureError                     capturing attention or KV pages failed

`RclcError` subclasses `ValueError`, so code written against the earlier bare `ValueError`s
keeps working; `EmptyInboxError` is also an `IndexError` for the same reason. `RclcError`
itself is raised for plain argument errors that no subclass describes better. The two
`RuntimeError`s are conditions of the moment, not bad input: retrying later (an idle engine)
or with another model can succeed. After any of these the caller's state is unchanged.

This module imports nothing heavy, so light callers (graph planning) can catch these
without importing torch.
"""

from __future__ import annotations

__all__ = [
    "AgentStateError",
    "CaptureError",
    "ConstraintError",
    "ContextLimitError",
    "EmptyInboxError",
    "EngineBusyError",
    "IncompatibleStateError",
    "RclcError",
    "ReasoningError",
    "SelectorError",
    "SnapshotError",
    "UnsupportedModelError",
]


class RclcError(ValueError):
    """Raised for invalid arguments; the base of every input error rclc raises."""


class UnsupportedModelError(RclcError):
    """Raised when a model, vLLM engine or its configuration is outside what rclc supports."""


class IncompatibleStateError(RclcError):
    """Raised when sender and receiver, or rows, IDs and cache, and the model do not match."""


class ContextLimitError(RclcError):
    """Raised when a state, prompt, handoff or output does not fit the context window."""


class AgentStateError(RclcError):
    """Raised when an agent is used out of order: a pending continuation, queued handoffs, no state."""


class SnapshotError(RclcError):
    """Raised when a snapshot is unreadable, tampered with, of another format or of another model."""


class SelectorError(RclcError):
    """Raised when a selector (built-in or custom) returns positions rclc cannot deliver."""


class ReasoningError(RclcError):
    """Raised when a reasoning method's result is not the sender plus consistent appended rows."""


class ConstraintError(RclcError):
    """Raised when a JSON Schema or grammar cannot be compiled by the constrained decoder, or an output broke it."""


class EmptyInboxError(RclcError, IndexError):
    """Raised when popping (or generating from) more handoffs than a receiver has queued."""


class EngineBusyError(RuntimeError):
    """Raised when a vLLM engine has unfinished requests while rclc needs it idle."""


class CaptureError(RuntimeError):
    """Raised when an attention capture (HF) or a KV page capture (vLLM) fails or is missing."""
