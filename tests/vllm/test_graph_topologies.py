"""Every shipped topology runs with its model on vLLM (`backend: vllm`), through the scheduler;
its token events and a stopped run behave as on HF.

The pool loads one engine for the module (the real loader, not a test engine). Output
lengths are cut to keep CPU time down; the graph structure, policies and inputs are the
shipped ones. The chain of agents also runs on HF, and both backends must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from rclc.backends import vllm as vllm_backend
from rclc.vllm.capture import registry
from rclc_graph import EventStream, Graph, LocalExecutor, ModelPool, RunContext
from rclc_graph.spec.load import read_graph
from rclc_graph.plan.compile import compile_plan
from rclc_graph.run.scheduler import run_plan, run_plan_sync
from rclc_graph.executors.vllm_engine import shutdown
from tests.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def pool():
    pool = ModelPool()
    yield pool
    for loaded in pool.loaded():
        if loaded.key.backend == "vllm":
            shutdown(loaded)


def _on_backend(spec, backend: str):
    """`spec` with every model on `backend` and short outputs, its subgraphs too (one name is one
    model across a topology and its subgraphs, so they switch together)."""
    return spec.model_copy(
        update={
            "models": [model.model_copy(update={"backend": backend}) for model in spec.models],
            "agents": [agent.model_copy(update={"max_new_tokens": MAX_NEW_TOKENS}) for agent in spec.agents],
            # a structured reply needs more than MAX_NEW_TOKENS tokens; structured outputs on vLLM are
            # tested in test_structured_outputs.py, the handoffs here
            "nodes": [
                node.model_copy(update={
                    "output_schema": None,
                    "graph": node.graph if node.graph is None else _on_backend(node.graph, backend),
                })
                for node in spec.nodes
            ],
        }
    )


def _plan(path: Path, backend: str):
    spec = _on_backend(read_graph(path).spec, backend)
    inputs = json.loads((ROOT / "examples" / "inputs" / f"{path.stem}.json").read_text())
    # a node that waits for a person (review_loop's final) gets its answer up front, so the run finishes
    answers = {node.name: "approved" for node in spec.nodes if node.interrupt is not None}
    # tool_agent's tools and plan_and_execute's function nodes are code the file names (examples/, importable
    # by the fixture below)
    names_code = any(agent.tools for agent in spec.agents) or any(node.call for node in spec.nodes)
    return compile_plan(spec, inputs, trust_code=names_code, answers=answers)


@pytest.fixture(autouse=True)
def _example_tools_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))


def _check(result, plan):
    assert result.status == "finished", result.error
    # routed topologies (triage, review_loop) skip nodes by design: every plan node ran or was skipped, not both
    assert set(result.nodes) | set(result.skipped) == {node.name for node in plan.nodes}
    assert not set(result.nodes) & set(result.skipped)
    for name, node in result.nodes.items():
        assert len(node.lineage) == node.positions, name
        if node.text is not None and node.kind != "function":  # a tool loop generates once more after each call
            assert 0 < node.generated_tokens <= MAX_NEW_TOKENS * (len(node.tool_calls) + 1), name
    for hop in result.hops:
        if hop.mode != "text":
            assert sum(hop.kept_by_origin.values()) == hop.kept_positions <= hop.budget
    assert registry.entries() == {}


def test_topologies_are_shipped():
    assert {path.stem for path in TOPOLOGIES} >= {"chain_of_agents", "debate", "fanout_qa", "hierarchical", "tool_agent"}


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


def test_vllm_token_events_follow_generation_in_order(pool):
    # vLLM reports tokens once llm.generate returns; the graph publishes them after recording
    # the continuation, one event per generated token, before the node's finished event.
    path = ROOT / "topologies" / "chain_of_agents.yaml"
    plan = _plan(path, "vllm")
    events = EventStream(max_events=10_000)

    async def main():
        result = await run_plan(plan, pool=pool, base_dir=path.parent, events=events)
        events.close()
        return result, [event async for event in events]

    result, seen = anyio.run(main)
    _check(result, plan)
    for name, node in result.nodes.items():
        tokens = [event.payload for event in seen if event.kind == "token" and event.payload["node"] == name]
        assert [token["index"] for token in tokens] == list(range(node.generated_tokens)), name
        if tokens:
            last_token = max(i for i, event in enumerate(seen) if event.kind == "token" and event.payload["node"] == name)
            finished = next(i for i, event in enumerate(seen) if event.kind == "node" and event.payload["node"] == name
                            and event.payload["status"] == "finished")
            assert last_token < finished, name


def test_a_run_stopped_during_vllm_generation_records_nothing(pool, monkeypatch):
    plan = Graph("stopped").input("question").model("base", backend="vllm").agent(
        "talker", model="base", max_new_tokens=MAX_NEW_TOKENS
    ).node("a", agent="talker", prompt="{question}", output=True).plan({"question": "Say something."})
    pool.get(plan.node("a").model)
    executor = LocalExecutor(pool)
    bound, published = [], []
    original_bind, original_generate = executor.bind, vllm_backend.run_request
    executor.bind = lambda ctx, node: bound.append(original_bind(ctx, node)) or bound[-1]

    async def publish(kind, payload):
        published.append((kind, payload))

    ctx = RunContext(run_id="stopped-run", plan=plan, publish=publish)

    def generate(*args, **kwargs):  # the run is cancelled while the engine generates
        output = original_generate(*args, **kwargs)
        ctx.stop.set()
        return output

    # the vLLM backend's generation request, through the engine's submission loop
    monkeypatch.setattr(vllm_backend, "run_request", generate)

    async def main():
        with pytest.raises(anyio.get_cancelled_exc_class()):
            await executor.run_node(ctx, plan.node("a"), [])

    anyio.run(main)
    assert published == []  # no token event: they are published only after recording
    report = bound[0].inspect()
    assert report["state_source"] == "messages" and report["cached_positions"] == 0  # nothing recorded
    assert registry.entries() == {}  # no capture prefill was started for the continuation
