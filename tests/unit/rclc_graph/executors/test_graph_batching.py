"""Batching options in the graph layer (issue 14): `models[].batching` in YAML and the
builder, `ModelPool.set_max_batch` (`rclc-graph run --max-batch`), validation with the
field's location, and concurrent runs on one pool decoding in shared batches."""

from __future__ import annotations

import anyio
import pytest
from typer.testing import CliRunner

import rclc
from rclc import testing
from rclc_graph import Graph, ModelPool, ModelSpec, load_graph_text, run_plan
from rclc_graph.errors import GraphError
from rclc_graph.views.cli import app

YAML = """\
version: 1
name: batched
inputs: {question: str}
models:
  - name: base
    source: embedded
    batching: {max_batch: 6, wait_ms: 0}
agents:
  - {name: talker, model: base, max_new_tokens: 6}
nodes:
  - {name: a, agent: talker, prompt: "Answer briefly: {question}", output: true}
"""


def test_yaml_batching_is_read_and_checked_with_its_location():
    spec = load_graph_text(YAML)
    batching = spec.models[0].batching
    assert (batching.enabled, batching.max_batch, batching.wait_ms) == (True, 6, 0.0)
    assert load_graph_text(YAML.replace("    batching: {max_batch: 6, wait_ms: 0}\n", "")).models[0].batching is None
    for bad, field in (("{max_batch: 0}", "max_batch"), ("{wait_ms: -2}", "wait_ms"), ("{size: 3}", "size"),
                       ("{enabled: maybe}", "enabled"), ("{prefill_first_ms: -1}", "prefill_first_ms"),
                       ("{prefill_first_ms: .inf}", "prefill_first_ms")):
        with pytest.raises(GraphError) as caught:
            load_graph_text(YAML.replace("{max_batch: 6, wait_ms: 0}", bad))
        problem = caught.value.problems[0]
        assert problem.path[:3] == ("models", 0, "batching") and field in ".".join(map(str, problem.path)), problem


def test_the_pool_applies_a_declarations_batching_and_its_own_max_batch():
    model, tokenizer = testing.tiny_model("llama", seed=11)
    pool = ModelPool()
    spec = ModelSpec.model_validate({"name": "base", "source": "embedded",
                                     "batching": {"max_batch": 3, "wait_ms": 2, "prefill_first_ms": 250}})
    pool.add(spec, model, tokenizer)
    report = rclc.batching_report(model)
    assert (report["enabled"], report["max_batch"], report["wait_ms"], report["prefill_first_ms"]) == (True, 3, 2.0, 250.0)
    pool.set_max_batch(5)
    pool.get(spec)
    assert rclc.batching_report(model)["max_batch"] == 5 and rclc.batching_report(model)["wait_ms"] == 2.0
    pool.get(ModelSpec(name="base", source="embedded"))  # no batching declared: the pool's cap alone
    assert rclc.batching_report(model)["max_batch"] == 5
    with pytest.raises(ValueError, match="max_batch"):
        pool.set_max_batch(0)


def test_yaml_prompt_options_reach_the_model():
    # Issue 28: shared_prefixes, prefill_batch, prefix_cache_mib and capture_batch are declared per model,
    # checked with their location, and applied by the pool.
    model, tokenizer = testing.tiny_model("llama", seed=12)
    pool = ModelPool()
    spec = ModelSpec.model_validate({"name": "base", "source": "embedded", "batching": {
        "shared_prefixes": False, "prefill_batch": 1, "prefix_cache_mib": 16, "capture_batch": 2}})
    pool.add(spec, model, tokenizer)
    report = rclc.batching_report(model)
    assert (report["shared_prefixes"], report["prefill_batch"], report["prefix_cache_mib"]) == (False, 1, 16)
    assert report["capture_batch"] == 2 and report["request_captures"]["capture_batch"] == 2
    assert report["prompt_prefills"]["prefix_cache"]["max_bytes"] == 0  # nothing shared: nothing stored
    for bad, field in (("{prefill_batch: 0}", "prefill_batch"), ("{prefix_cache_mib: -1}", "prefix_cache_mib"),
                       ("{shared_prefixes: sometimes}", "shared_prefixes"), ("{capture_batch: 0}", "capture_batch")):
        with pytest.raises(GraphError) as caught:
            load_graph_text(YAML.replace("{max_batch: 6, wait_ms: 0}", bad))
        problem = caught.value.problems[0]
        assert problem.path[:3] == ("models", 0, "batching") and field in ".".join(map(str, problem.path)), problem


def test_concurrent_runs_on_one_pool_decode_in_shared_batches():
    model, tokenizer = testing.tiny_model("qwen3", seed=12)
    pool = ModelPool()
    graph = Graph("talk").input("question").model("base", batching={"max_batch": 4, "wait_ms": 1})
    graph.agent("talker", model="base", max_new_tokens=8).node("a", agent="talker", prompt="{question}", output=True)
    plans = [graph.plan({"question": f"Question number {index}?"}) for index in range(6)]
    pool.add(plans[0].models()[0], model, tokenizer)
    sequential = [anyio.run(lambda plan=plan: run_plan(plan, pool=pool)).outputs for plan in plans]
    before = dict(rclc.batching_report(model)["batch_sizes"])
    outputs = [None] * len(plans)

    async def main():
        async with anyio.create_task_group() as group:
            for index, plan in enumerate(plans):
                async def one(index=index, plan=plan):
                    outputs[index] = (await run_plan(plan, pool=pool)).outputs
                group.start_soon(one)

    anyio.run(main)
    after = rclc.batching_report(model)["batch_sizes"]
    grown = {int(size): count - before.get(size, 0) for size, count in after.items()}
    assert max(size for size, count in grown.items() if count) > 1 and max(grown) <= 4
    assert outputs == sequential


def test_run_refuses_max_batch_with_another_executor(tmp_path):
    topology = tmp_path / "t.yaml"
    topology.write_text(YAML)
    inputs = tmp_path / "i.json"
    inputs.write_text('{"question": "Why?"}')
    result = CliRunner().invoke(app, ["run", str(topology), "--input", str(inputs), "--executor", "ray",
                                      "--max-batch", "4"])
    assert result.exit_code == 2 and "--max-batch" in result.output
    result = CliRunner().invoke(app, ["run", str(topology), "--input", str(inputs), "--max-batch", "0"])
    assert result.exit_code == 2


API_MODEL = {"name": "remote", "backend": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "m"}


def test_an_api_model_takes_no_batching_and_the_pools_cap_leaves_it_alone():
    """An API model's server batches its own requests: `batching:` on it is refused with the
    fix, and `--max-batch` (the pool's cap) applies only to the local models beside it."""
    with pytest.raises(ValueError, match="backend openai does not use batching"):
        ModelSpec.model_validate({**API_MODEL, "batching": {"max_batch": 4}})
    pool = ModelPool()
    pool.set_max_batch(4)
    loaded = pool.get(ModelSpec.model_validate(API_MODEL))
    assert loaded.model is None
