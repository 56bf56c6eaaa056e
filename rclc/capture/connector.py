"""Alias: `rclc.capture.connector` is `rclc.vllm.capture.connector`, the same module object.

Not a copy or a re-export: a second module would hold a second capture registry, and a
capture requested through one would never be seen by a connector loaded through the other.
Binding the name to the real module in `sys.modules` makes every import of either path (vLLM's
`importlib.import_module(kv_connector_module_path)` among them) return that one module.
Importing it imports no vLLM, as the real module does not.
"""

from __future__ import annotations

import sys

from ..vllm.capture import connector as _connector

sys.modules[__name__] = _connector
