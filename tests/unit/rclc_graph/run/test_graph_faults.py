"""Faults (issue 6, item 3): an exception in a selector, a reasoning method, user code imported
with trust_code, a chat template, generation or a run observer fails its node with an error
naming node, edge and cause; the other branches are cancelled cleanly; the record says what
finished and what did not; a resume after the fault is removed runs only what did not finish
and reproduces the fault-free run."""

from __future__ import annotations

import functools
import threading
import time

import anyio
import pytest

from rclc import testing
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors._attention_capture import reachable_configs
from rclc_graph import LocalExecutor, ModelPool, ModelSpec, compile_plan, load_graph_text, resume_run_sync
from rclc_graph.run.record import NODES_DIR, read_record, safe_name
from rclc_graph.run import run_recorded_sync
from rclc_graph.run.scheduler import run_plan_sync
from tests.helpers import fault_plugins
from tests.helpers.cancelling import busy_threads
from tests.helpers.reliability import CURRENT_NODE, CURRENT_NODE_DEFAULT, CountingExecutor, assert_same_runs


FAULT_YAML = """\
version: 1
name: faults
inputs:
  question: str
  chunks: list[str]
models:
  - {name: base, source: embedded}
agents:
  - {name: reader, model: base, max_new_tokens: 4}
  - {name: writer, model: base, max_new_tokens: 24}
nodes:
  - {name: s1, agent: writer, prompt: "Long branch: {chunks[0]}"}
  - {name: s2, agent: writer, prompt: "Continue: {question}"}
  - {name: r, agent: reader, generate: false, prompt: "Question: {question} Part: {chunks[1]}"}
  - {name: f, agent: writer, prompt: "Question: {question} Draft MARK:"}
  - {name: g, agent: writer, prompt: "Question: {question} Check:"}
  - {name: final, agent: writer, output: true, prompt: "Question: {question} Answer:"}
edges:
  - {source: s1, target: s2, policy: {ratio: 2}}
  - {source: r, target: f, policy: {ratio: 2, selector: "tests.helpers.fault_plugins:flaky_selector",
                                    reasoning: {method: "tests.helpers.fault_plugins:flaky_reasoning"}}}
  - {source: r, target: g, policy: {budget: 8, selector: qsnap, reasoning: {steps: 2}}}
  - {source: s2, target: final, policy: {mode: text}}
  - {source: f, target: final, policy: {ratio: 2}}
  - {source: g, target: final, policy: {mode: text}}
"""
INPUTS = {"question": "Who owns Cedar?", "chunks": ["The Cedar project is owned by Alice.", "Launched in Oslo in 2021."]}
RAISING_TEMPLATE = (
    "{% for message in messages %}{% if 'MARK' in message['content'] %}"
    "{{ raise_exception('template fault injected') }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    model, tokenizer = testing.tiny_model("qwen3")
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    plan = compile_plan(load_graph_text(FAULT_YAML), INPUTS, trust_code=True)
    out = tmp_path_factory.mktemp("reference")
    result, record, run_dir = run_recorded_sync(plan, out, pool=pool, executor=LocalExecutor(pool))
    assert result.status == "finished", result.error
    return {"model": model, "tokenizer": tokenizer, "pool": pool, "plan": plan, "reference": run_dir}


@pytest.fixture
def slow_steps(world):
    """3 ms per forward, so a branch is still generating when another one fails."""
    handle = backbone(world["model"]).register_forward_pre_hook(lambda module, args: time.sleep(0.003))
    yield
    handle.remove()


def _raise_in_generation(world, node):
    """The decoder's forward, raising in the batching engine's prefill of `node`'s generation
    (the engine runs a sequence's prefill in the context of the node that submitted it;
    CountingExecutor names the node there)."""
    decoder = backbone(world["model"])
    original = decoder.forward

    def forward(*args, **kwargs):
        # The prefill thread runs a lone prefill in its submitter's context, and a batch of
        # prompts that arrived together in no node's context. Whether `node`'s prompt is
        # batched depends on timing, so a batched prefill fails too: the engine then
        # prefills each sequence alone in its own context, where only `node` raises.
        if threading.current_thread().name == "rclc-batching-prefill" and CURRENT_NODE.get() in (node, CURRENT_NODE_DEFAULT):
            raise RuntimeError("generation fault injected")
        return original(*args, **kwargs)

    return decoder, forward


def _raising(message):
    def method(*args, **kwargs):
        raise RuntimeError(message)

    return method


# fault -> (node that fails, edge text in the error or None, cause text)
FAULTS = {
    "custom selector": ("f", "'r' -> 'f'", "InjectedFault: selector fault injected"),
    "custom selector output": ("f", "'r' -> 'f'", "flaky_selector"),
    "custom reasoning": ("f", "'r' -> 'f'", "InjectedFault: reasoning fault injected"),
    "built-in selector": ("g", "'r' -> 'g'", "RuntimeError: qsnap fault injected"),
    "built-in reasoning": ("g", "'r' -> 'g'", "RuntimeError: latent_mass fault injected"),
    "chat template": ("f", None, "template fault injected"),
    "generation": ("f", None, "RuntimeError: generation fault injected"),
}


def _switch_on(fault, world, monkeypatch):
    import rclc
    from rclc import selectors

    if fault == "custom selector":
        monkeypatch.setattr(fault_plugins, "FAULTS", {"selector"})
    elif fault == "custom selector output":
        monkeypatch.setattr(fault_plugins, "FAULTS", {"selector_output"})
    elif fault == "custom reasoning":
        monkeypatch.setattr(fault_plugins, "FAULTS", {"reasoning"})
    elif fault == "built-in selector":
        monkeypatch.setitem(selectors.BUILTIN, "qsnap", _raising("qsnap fault injected"))
    elif fault == "built-in reasoning":
        monkeypatch.setattr(rclc, "latent_mass", _raising("latent_mass fault injected"))
    elif fault == "chat template":
        monkeypatch.setattr(world["tokenizer"], "chat_template",
                            RAISING_TEMPLATE + world["tokenizer"].chat_template)
    elif fault == "generation":
        decoder, forward = _raise_in_generation(world, "f")
        monkeypatch.setattr(decoder, "forward", forward)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_fails_its_node_and_a_resume_retries_only_what_did_not_finish(world, tmp_path, monkeypatch, fault,
                                                                              slow_steps):
    node, edge, cause = FAULTS[fault]
    with monkeypatch.context() as patch:
        _switch_on(fault, world, patch)
        result, record, run_dir = run_recorded_sync(world["plan"], tmp_path, pool=world["pool"],
                                                    executor=CountingExecutor(world["pool"]))
        assert busy_threads() == []  # the other branches stopped; nothing is left computing
    # the error names node, edge and cause, in the result and in the record
    assert result.status == "failed" and result.failed_node == node
    assert result.error.startswith(f"node {node!r}") and cause in result.error, result.error
    assert (edge is None and ", edge" not in result.error) or (edge is not None and f"edge {edge}" in result.error)
    assert record["status"] == "failed" and record["failed_node"] == node and record["error"] == result.error
    # what finished and what did not: a partition of the plan, each finished node with its files
    plan = world["plan"]
    finished, unfinished = list(record["nodes"]), record["unfinished"]
    assert sorted(finished + unfinished) == sorted(plan.order) and {node, "final"} <= set(unfinished)
    assert set(record["interrupted"]) <= set(unfinished) and node in record["interrupted"]
    for name in plan.order:
        has_files = (run_dir / NODES_DIR / f"{safe_name(name)}.json").exists()
        assert has_files == (name in finished), name
    for config in reachable_configs(world["model"]):
        assert config._attn_implementation == "sdpa"
    # the fault is gone (monkeypatch context left): a resume runs only what did not finish
    resumed, again, _ = resume_run_sync(run_dir, pool=world["pool"], executor=LocalExecutor(world["pool"]),
                                        trust_code=True)
    assert resumed.status == "finished", resumed.error
    assert sorted(again["attempts"][-1]["ran"]) == sorted(unfinished)
    assert again["attempts"][0]["status"] == "failed"
    assert_same_runs(world["reference"], run_dir)


def test_a_fault_cancels_a_branch_that_is_generating(world, tmp_path, monkeypatch, slow_steps):
    """The chat template fails f the moment it starts; the long branch is mid-generation then."""
    with monkeypatch.context() as patch:
        _switch_on("chat template", world, patch)
        result, record, run_dir = run_recorded_sync(world["plan"], tmp_path, pool=world["pool"],
                                                    executor=LocalExecutor(world["pool"]))
    assert result.failed_node == "f"
    assert set(record["interrupted"]) & {"s1", "s2", "g"}, record  # a branch was stopped mid-way
    resumed, _, _ = resume_run_sync(run_dir, pool=world["pool"], executor=LocalExecutor(world["pool"]),
                                    trust_code=True)
    assert resumed.status == "finished"
    assert_same_runs(world["reference"], run_dir)


def test_a_failing_observer_fails_the_run_naming_the_node(world):
    class Observer:
        def node_finished(self, run_id, result):
            if result.node == "r":
                raise RuntimeError("observer fault injected")

    result = run_plan_sync(world["plan"], pool=world["pool"], observer=Observer())
    assert result.status == "failed" and result.failed_node == "r"
    assert "node 'r'" in result.error and "Observer.node_finished raised RuntimeError: observer fault injected" in result.error
    assert busy_threads() == []
