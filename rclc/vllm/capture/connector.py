"""Where vLLM finds the capture connector: `kv_connector_module_path="rclc.vllm.capture.connector"`.

vLLM imports this module and looks up the class by the configured name. The class is
built in `_engine_connector`, which imports vLLM, and is only loaded when that lookup
happens; importing this module alone (for the registry functions, in an environment
without vLLM) never imports vLLM.
"""

from __future__ import annotations

from typing import Any

from .registry import Capture, discard_capture, get_capture, request_capture

_LAZY = ("RCLCCaptureConnector", "RCCCaptureConnector", "RCLCCaptureMetadata", "CaptureSpec")

__all__ = ["Capture", "discard_capture", "get_capture", "request_capture", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import _engine_connector  # imports vLLM (the optional extra): only when vLLM asks


        return getattr(_engine_connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
