"""Every shipped topology runs with its model on vLLM (`backend: vllm`), through the scheduler.

The pool loads one engine for the module (the real loader, not a test engine). Output
lengths are cut to keep CPU time down; the graph structure, policies and inputs are the
shipped ones. The chain of agents also runs on HF, and both backends must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rclc.vllm.capture import registry
from rclc_graph import ModelPool
from rclc_graph.spec.load import read_graph
from rclc_graph.plan.compile import compile_plan
from rclc_graph.run.scheduler import run_plan_sync
from rclc_graph.executors.vllm_engine import shutdown

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def pool():
    pool = ModelPool()
    yield pool
    for loaded in pool.loaded():
        if loaded.key.backend == "vllm":
            shutdown(loaded)


def _plan(path: Path, backend: str):
    spec = read_graph(path).spec
    spec = spec.model_copy(
        update={
            "models": [model.model_copy(update={"backend": backend}) for model in spec.models],
            "agents": [agent.model_copy(update={"max_new_tokens": MAX_NEW_TOKENS}) for agent in spec.agents],
        }
    )
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{path.stem}.json").read_text())
    return compile_plan(spec, inputs)


def _check(result, plan):
    assert result.status == "finished", result.error
    assert set(result.nodes) == {node.name for node in plan.nodes}
    for name, node in result.nodes.items():
        assert len(node.lineage) == node.positions, name
        if node.text is not None:
            assert 0 < node.generated_tokens <= MAX_NEW_TOKENS, name
    for hop in result.hops:
        if hop.mode != "text":
            assert sum(hop.kept_by_origin.values()) == hop.kept_positions <= hop.budget
    assert registry.entries() == {}


def test_topologies_are_shipped():
    assert {path.stem for path in TOPOLOGIES} >= {"chain_of_agents", "debate", "fanout_qa", "hierarchical"}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda path: path.stem)
def test_topology_runs_on_vllm(pool, path):
    plan = _plan(path, "vllm")
    result = run_plan_sync(plan, pool=pool, base_dir=path.parent)
    _check(result, plan)
    assert all(loaded.key.backend == "vllm" for loaded in pool.loaded())
    assert pool.loads == 1  # one engine serves every topology


def test_chain_of_agents_agrees_with_hf(pool):
    path = ROOT / "topologies" / "chain_of_agents.yaml"
    runs = {}
    for backend in ("vllm", "hf"):
        plan = _plan(path, backend)
        runs[backend] = run_plan_sync(plan, pool=pool, base_dir=path.parent)
        _check(runs[backend], plan)
    on_vllm, on_hf = runs["vllm"], runs["hf"]
    assert [hop.kept_positions for hop in on_vllm.hops] == [hop.kept_positions for hop in on_hf.hops]
    assert [hop.kept_by_origin for hop in on_vllm.hops] == [hop.kept_by_origin for hop in on_hf.hops]
    assert on_vllm.outputs == on_hf.outputs
    loaded = {entry.key.backend: entry for entry in pool.loaded()}
    assert loaded["vllm"].fingerprint == loaded["hf"].fingerprint


def test_one_engine_per_process(pool):
    from rclc_graph.spec.models import ModelSpec

    pool.get(ModelSpec(name="base", source="embedded", backend="vllm"))
    with pytest.raises(ValueError, match="one capture engine per process"):
        pool.get(ModelSpec(name="half", source="embedded", backend="vllm", dtype="bfloat16"))
