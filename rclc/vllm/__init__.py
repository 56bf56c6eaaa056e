"""The vLLM adapter: capture registry, sender states from captures, the shared-weight view.

Importing this package does not import vLLM; only functions that need an engine touch
it. Engines must be in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), eager, without prefix
caching, with one full-attention KV cache group and the capture connector configured:

    kv_transfer_config={"kv_connector": "RCLCCaptureConnector",
                        "kv_connector_module_path": "rclc.vllm.capture.connector",
                        "kv_role": "kv_both"}      # = rclc.vllm.kv_transfer_config()

Low-level use (your own submission loop):

    internal_id = llm.llm_engine.add_request(request_id, prompt, sampling_params)
    request_capture(internal_id)          # after submission, before the first step()
    ... step until the prompt is prefilled ...
    sender = sender_from_vllm(llm, internal_id, prompt_token_ids)

vLLM 0.30.0 returns a randomized internal request ID from add_request; that ID is the
capture ID. Call discard_capture for cancelled or unused captures.
"""

from .capture.engine_checks import kv_transfer_config
from .capture.registry import Capture, discard_capture, get_capture, request_capture
from .engine import check_engine, engine_context_limit, engine_tokenizer, require_idle
from .senders import prefill_state, sender_from_vllm, shared_view, state_from_capture
from .view import EngineProjection, model_from_vllm, view_state_dict

__all__ = [
    "Capture",
    "EngineProjection",
    "check_engine",
    "discard_capture",
    "engine_context_limit",
    "engine_tokenizer",
    "get_capture",
    "kv_transfer_config",
    "model_from_vllm",
    "prefill_state",
    "request_capture",
    "require_idle",
    "sender_from_vllm",
    "shared_view",
    "state_from_capture",
    "view_state_dict",
]
