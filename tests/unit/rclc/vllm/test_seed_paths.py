"""Every import path and configuration string the seed's API text shows keeps working
(issue 24 item 13): the seed configures vLLM with `kv_connector_module_path =
"rclc.capture.connector"`, a module the layout change had removed."""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.paths import ROOT


# What /work/shared/design/api.md imports or names, exactly as it writes it.
SEED_NAMES = [
    ("rclc", "HFReceiver"), ("rclc", "sender_from_hf"), ("rclc", "transfer"), ("rclc", "transfer_sync"),
    ("rclc", "SenderState"), ("rclc", "Agent"), ("rclc", "bind"), ("rclc", "check"), ("rclc", "latent_mass"),
    ("rclc.selectors", "chunkkv"), ("rclc.selectors", "qsnap"),
    ("rclc.vllm", "request_capture"), ("rclc.vllm", "sender_from_vllm"),
]  # and the connector's module path, which vLLM imports: the tests below


# issue 24 item 13
@pytest.mark.parametrize(("module", "name"), SEED_NAMES)
def test_the_seeds_imports_resolve(module, name):
    assert callable(getattr(importlib.import_module(module), name))


# issue 24 item 13: ModuleNotFoundError: No module named 'rclc.capture'
def test_the_seeds_connector_path_is_the_connector_module_itself():
    script = (
        "import importlib, sys\n"
        "old = importlib.import_module('rclc.capture.connector')\n"
        "new = importlib.import_module('rclc.vllm.capture.connector')\n"
        "assert old is new, (old, new)\n"
        "assert old.request_capture is new.request_capture\n"
        "assert 'vllm' not in sys.modules  # importing the path imports no vLLM\n"
        "assert 'RCCCaptureConnector' in old.__all__\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _engine_config(module_path: str, name: str = "RCCCaptureConnector", role: str = "kv_both"):
    transfer = SimpleNamespace(kv_connector=name, kv_connector_module_path=module_path, kv_role=role)
    return SimpleNamespace(kv_transfer_config=transfer)


# issue 24 item 13: the binding check accepted only the new path
@pytest.mark.parametrize("module_path", ["rclc.capture.connector", "rclc.vllm.capture.connector"])
def test_the_binding_check_accepts_both_connector_paths(module_path):
    from rclc.vllm.capture.engine_checks import connector_problems

    assert connector_problems(_engine_config(module_path)) == []
    assert connector_problems(_engine_config("elsewhere.connector")) != []
