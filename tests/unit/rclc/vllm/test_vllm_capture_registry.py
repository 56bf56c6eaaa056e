"""The capture registry's lifecycle: register, claim, store or fail, take, discard (no vLLM needed)."""

from __future__ import annotations

import sys

import pytest
import torch

from rclc.vllm.capture import registry


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    for request_id in list(registry.entries()):
        registry.discard_capture(request_id)


def _capture(request_id: str) -> registry.Capture:
    layer = (torch.zeros(1, 1, 3, 4), torch.ones(1, 1, 3, 4))
    return registry.Capture(request_id, 3, (layer,))


def test_lifecycle_success():
    registry.request_capture("a")
    assert registry.entries() == {"a": "registered"}
    with pytest.raises(RuntimeError, match="not finished"):
        registry.get_capture("a")
    assert registry.take_registration("a") and not registry.take_registration("a")
    assert registry.entries() == {"a": "pending"} and registry.is_tracked("a")
    capture = _capture("a")
    registry.store_capture(capture)
    assert registry.get_capture("a") is capture
    registry.release_capture("a", _capture("a"))  # a different object: kept
    assert registry.entries() == {"a": "captured"}
    registry.release_capture("a", capture)
    assert registry.entries() == {}


def test_failures_are_data_until_discarded():
    registry.request_capture("b")
    registry.take_registration("b")
    registry.store_failure("b", "pages were not registered")
    assert registry.entries() == {"b": "failed"}
    with pytest.raises(RuntimeError, match="pages were not registered"):
        registry.get_capture("b")
    registry.discard_capture("b")
    assert registry.entries() == {}


def test_duplicates_and_unknown_ids():
    registry.request_capture("c")
    with pytest.raises(RuntimeError, match="already registered"):
        registry.request_capture("c")
    registry.take_registration("c")
    registry.store_capture(_capture("c"))
    with pytest.raises(RuntimeError, match="already holds"):
        registry.request_capture("c")
    with pytest.raises(RuntimeError, match="no capture"):
        registry.get_capture("never")
    for bad in ("", 3, None):
        with pytest.raises(ValueError, match="request_id"):
            registry.request_capture(bad)
    registry.discard_capture("never")  # silent


def test_discard_while_pending_drops_late_results():
    registry.request_capture("d")
    registry.take_registration("d")
    registry.discard_capture("d")
    assert not registry.is_tracked("d")
    registry.store_capture(_capture("d"))
    registry.store_failure("d", "late")
    assert registry.entries() == {}


def test_importing_the_connector_module_does_not_import_vllm():
    before = {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}
    import rclc.vllm.capture.connector as connector
    import rclc.vllm  # noqa: F401

    after = {name for name in sys.modules if name == "vllm" or name.startswith("vllm.")}
    assert after == before
    assert connector.request_capture is registry.request_capture
    with pytest.raises(AttributeError):
        connector.NoSuchThing  # noqa: B018
