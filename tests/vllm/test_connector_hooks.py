"""The connector's hooks driven directly: chunked prefill, preemption and resumption, both layouts.

Real engines rarely preempt on a test machine, so the scheduler side is fed scheduler
outputs shaped like vLLM 0.30.0's; the worker side copies from synthetic pools in the
FlashAttention and CPU layouts.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rclc.vllm.capture import registry
from rclc.vllm.capture.pages import PageGeometry, scatter_prompt
from tests.helpers.vllm_engines import engine_arguments, save_tiny

pytestmark = pytest.mark.vllm

BLOCK = 4


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    from vllm.engine.arg_utils import EngineArgs

    directory = tmp_path_factory.mktemp("tiny-llama-h64-hooks")
    save_tiny(directory, "llama")
    return EngineArgs(**engine_arguments(directory)).create_engine_config()


@pytest.fixture(autouse=True)
def _clean():
    yield
    for request_id in list(registry.entries()):
        registry.discard_capture(request_id)


def _connector(config, role_name):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from rclc.vllm.capture.connector import RCLCCaptureConnector

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float32)
    names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    cache = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    return RCLCCaptureConnector(config, getattr(KVConnectorRole, role_name), cache)


def _new(request_id, length, blocks, computed=0):
    return SimpleNamespace(req_id=request_id, prompt_len=length, block_ids=(list(blocks),), num_computed_tokens=computed)


def _step(new=(), cached=(), scheduled=None, resumed=()):
    cached_data = SimpleNamespace(
        req_ids=[c[0] for c in cached],
        new_block_ids=[None if c[1] is None else (list(c[1]),) for c in cached],
        num_computed_tokens=[c[2] for c in cached],
        resumed_req_ids=set(resumed),
    )
    return SimpleNamespace(
        scheduled_new_reqs=list(new),
        scheduled_cached_reqs=cached_data,
        num_scheduled_tokens=dict(scheduled or {}),
        kv_connector_block_state=None,
    )


def test_chunked_prefill_emits_once_with_every_block(config):
    scheduler = _connector(config, "SCHEDULER")
    registry.request_capture("r")
    registry.request_capture("other-registered")
    meta = scheduler.build_connector_meta(_step(new=[_new("r", 10, [3, 7])], scheduled={"r": 6}))
    assert meta.specs == []
    meta = scheduler.build_connector_meta(_step(cached=[("r", [5], 6)], scheduled={"r": 4}))
    assert [(s.request_id, s.length, s.block_ids) for s in meta.specs] == [("r", 10, (3, 7, 5))]
    # Decode steps after the prompt emit nothing more.
    assert scheduler.build_connector_meta(_step(cached=[("r", None, 10)], scheduled={"r": 1})).specs == []
    # Unregistered requests are ignored.
    assert scheduler.build_connector_meta(_step(new=[_new("x", 3, [9])], scheduled={"x": 3})).specs == []
    assert registry.entries() == {"r": "pending", "other-registered": "registered"}


def test_resumed_request_restarts_with_its_new_blocks(config):
    scheduler = _connector(config, "SCHEDULER")
    registry.request_capture("p")
    scheduler.build_connector_meta(_step(new=[_new("p", 12, [2, 4])], scheduled={"p": 8}))
    # Preempted (blocks freed), then resumed from scratch with other blocks.
    meta = scheduler.build_connector_meta(_step(cached=[("p", [9, 1], 0)], resumed=["p"], scheduled={"p": 8}))
    assert meta.specs == []
    meta = scheduler.build_connector_meta(_step(cached=[("p", [6], 8)], scheduled={"p": 4}))
    assert [s.block_ids for s in meta.specs] == [(9, 1, 6)]


def test_request_finished_early_is_a_failure_entry(config):
    scheduler = _connector(config, "SCHEDULER")
    registry.request_capture("f")
    registry.request_capture("never-scheduled")
    scheduler.build_connector_meta(_step(new=[_new("f", 12, [2])], scheduled={"f": 4}))
    assert scheduler.request_finished_all_groups(SimpleNamespace(request_id="f"), ([2],)) == (False, None)
    assert scheduler.request_finished(SimpleNamespace(request_id="never-scheduled"), []) == (False, None)
    assert registry.entries() == {"f": "failed", "never-scheduled": "failed"}
    with pytest.raises(RuntimeError, match="before it was ever scheduled"):
        registry.get_capture("never-scheduled")


def test_discard_stops_tracking(config):
    scheduler = _connector(config, "SCHEDULER")
    registry.request_capture("d")
    scheduler.build_connector_meta(_step(new=[_new("d", 12, [2])], scheduled={"d": 4}))
    registry.discard_capture("d")
    assert scheduler.build_connector_meta(_step(cached=[("d", [3, 5], 4)], scheduled={"d": 8})).specs == []
    assert scheduler._tracked == {}


@pytest.mark.parametrize("layout", ["flash", "cpu"])
def test_worker_copies_pages_into_the_registry(config, layout):
    # private on purpose: the vLLM connector's internals under test, without an engine
    from rclc.vllm.capture._engine_connector import CaptureSpec, RCLCCaptureMetadata

    worker = _connector(config, "WORKER")
    geometry = PageGeometry(layout, 2, 8, BLOCK, torch.float32)
    shape = (16, 2, BLOCK, 16) if layout == "cpu" else (2, 16, BLOCK, 2, 8)
    pages = [torch.randn(shape) for _ in range(2)]
    generator = torch.Generator().manual_seed(0)
    expected = []
    for pool in pages:
        keys, values = torch.randn(2, 1, 2, 7, 8, generator=generator)
        scatter_prompt(pool, geometry, [5, 11], keys, values)
        expected.append((keys, values))
    before = [p.clone() for p in pages]
    worker._pages, worker._geometry = pages, geometry  # what register_kv_caches would set
    for request_id in ("ok", "bad"):
        registry.request_capture(request_id)
        registry.take_registration(request_id)
    worker.bind_connector_metadata(
        RCLCCaptureMetadata([CaptureSpec("ok", 7, (5, 11)), CaptureSpec("bad", 7, (0, 11))])
    )
    worker.wait_for_save()
    worker.clear_connector_metadata()
    capture = registry.get_capture("ok")
    for (keys, values), (want_keys, want_values) in zip(capture.layers, expected):
        assert torch.equal(keys, want_keys) and torch.equal(values, want_values)
    with pytest.raises(RuntimeError, match="null block"):
        registry.get_capture("bad")
    assert all(torch.equal(p, b) for p, b in zip(pages, before))


def test_worker_without_pages_reports_failure(config):
    # private on purpose: the vLLM connector's internals under test, without an engine
    from rclc.vllm.capture._engine_connector import CaptureSpec, RCLCCaptureMetadata

    worker = _connector(config, "WORKER")
    registry.request_capture("early")
    registry.take_registration("early")
    worker.bind_connector_metadata(RCLCCaptureMetadata([CaptureSpec("early", 3, (1,))]))
    worker.wait_for_save()
    with pytest.raises(RuntimeError, match="never registered"):
        registry.get_capture("early")


def test_register_kv_caches_refuses_foreign_layers(config):
    worker = _connector(config, "WORKER")
    with pytest.raises(ValueError, match="not a decoder self-attention layer"):
        worker.register_kv_caches({"model.layers.0.mlp": torch.zeros(4, 2, BLOCK, 16)})
    with pytest.raises(ValueError, match="outside the single cache group"):
        worker.register_kv_caches({"model.layers.7.self_attn.attn": torch.zeros(4, 2, BLOCK, 16)})
    with pytest.raises(ValueError, match="not contiguous"):
        worker.register_kv_caches({"model.layers.1.self_attn.attn": torch.zeros(4, 2, BLOCK, 16)})


def _forward_context(monkeypatch, config, backend_name, kernel="vec"):
    """Attention layers as the worker sees them: their backend's name and CPU kernel."""
    backend = SimpleNamespace(get_name=lambda: backend_name)
    layers = {
        name: SimpleNamespace(get_attn_backend=lambda: backend, isa=kernel)
        for name in ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
    }
    monkeypatch.setattr(config.compilation_config, "static_forward_context", layers)


def _cpu_pages():
    return {f"model.layers.{i}.self_attn.attn": torch.zeros(16, 2, BLOCK, 16) for i in range(2)}


def test_register_kv_caches_accepts_cpu_pages_and_refuses_a_second_pool(config, monkeypatch):
    _forward_context(monkeypatch, config, "CPU_ATTN")
    worker = _connector(config, "WORKER")
    first = _cpu_pages()
    worker.register_kv_caches(first)
    assert worker._geometry.layout == "cpu" and len(worker._pages) == 2
    worker.register_kv_caches(first)  # the same pool again is fine
    with pytest.raises(ValueError, match="another engine's KV pages are already registered"):
        worker.register_kv_caches(_cpu_pages())
    assert all(page is first[name] for page, name in zip(worker._pages, sorted(first)))


@pytest.mark.parametrize(
    ("backend", "kernel", "message"),
    [
        ("TRITON_ATTN", "vec", "attention backend 'TRITON_ATTN' is unsupported"),
        ("CPU_ATTN", "amx", "has not verified"),
    ],
)
def test_register_kv_caches_refuses_unverified_page_layouts(config, monkeypatch, backend, kernel, message):
    _forward_context(monkeypatch, config, backend, kernel)
    worker = _connector(config, "WORKER")
    with pytest.raises(ValueError, match=message):
        worker.register_kv_caches(_cpu_pages())
    assert worker._pages is None
