"""Copying a vLLM request's prompt KV: the registry API and the connector vLLM loads by name.

Nothing in this package imports vLLM until vLLM itself resolves the connector class.
"""

from .registry import Capture, discard_capture, get_capture, request_capture

__all__ = ["Capture", "discard_capture", "get_capture", "request_capture"]
