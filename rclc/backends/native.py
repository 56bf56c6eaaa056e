"""One native generation, recorded: what `Agent.generate` runs in its worker thread.

Backend-neutral: given where generation starts (the backend's inputs, the IDs of those
positions and how many of them were inherited), it asks the backend to generate, builds
the continuation state, re-prefills it when a refresh is asked for, and decodes the text.
It commits nothing: the caller switches the agent to the returned state, so a failure
anywhere leaves the agent as it was.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from .._locks import preparation_lock
from ..generation import GenerationResult, Sampling
from ..state import SenderState
from .contract import Backend, TokenCallback


def generate_continuation(
    backend: Backend,
    inputs: dict[str, Any],
    known_ids: torch.Tensor,
    inherited: int,
    *,
    sampling: Sampling,
    on_token: TokenCallback | None,
    stop: threading.Event | None,
    refresh: bool,
) -> tuple[SenderState, GenerationResult]:
    """Generate from `inputs`, then return (the continuation state, the result). Blocking.

    `seconds` covers the backend's generation only (waiting for the model included). The
    refresh is skipped where the backend's continuation already is one prefill of its rows.
    """
    began = time.perf_counter()
    native = backend.generate(inputs, sampling, on_token=on_token, stop=stop)
    seconds = time.perf_counter() - began
    with preparation_lock:
        state = backend.continuation(inputs, known_ids, inherited, native.output)
    if refresh and not backend.records_by_prefill:
        # A prefill of rows this call owns (HF: under its model's forward slot): outside the
        # process-wide lock, so other runs' selections and prefills go on meanwhile.
        state = backend.restore(state.input_embeds, state.token_ids, state.latent_steps, state.inherited_positions)
    tokens = native.token_ids.tolist()
    text = backend.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return state, GenerationResult(tuple(tokens), text, seconds, native.stopped)
