"""Function nodes (executors/function_node.py): a Python callable between agents. What it
receives, what its results become, that it runs in a worker thread (sync or async), how it
fails, and that records and resume treat it like a node without state. Agents run on a tiny
random model; the functions are real."""

from __future__ import annotations

import json
import sys
import threading
import types

import anyio
import pytest

from rclc_graph import (
    EventStream,
    GraphError,
    Graph,
    Interrupt,
    LocalExecutor,
    ModelPool,
    Policy,
    ResumeError,
    finished_nodes,
    read_resume_point,
    resume_run_sync,
    run_plan_sync,
    run_recorded_sync,
)
from rclc_graph.executors.function_node import canonical_text
from rclc_graph.spec.models import ModelSpec
from rclc_graph.testing import FakeExecutor, InProcessReplicasExecutor
from tests.paths import ROOT

TEXT = Policy(mode="text")
SEEN: list[tuple] = []


def lookup(inputs, senders):
    """A lookup between two agents: reads an input and a sender's text, answers JSON."""
    SEEN.append(("lookup", dict(inputs), dict(senders), threading.current_thread().name))
    return {"order": inputs["order"], "status": "shipped", "noted": len(senders["reader"]) > 0}


async def shout(inputs, senders):
    """An async function: reads every sender's text."""
    await anyio.sleep(0)
    SEEN.append(("shout", threading.current_thread().name))
    return " | ".join(f"{name}={text.upper()}" for name, text in senders.items())


def per_item(inputs, senders):
    return f"{inputs['index']}:{inputs['doc']}"


@pytest.fixture
def pool(tiny):
    model, tokenizer = tiny
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


def mixed() -> Graph:
    graph = Graph("mixed").input("order").input("question")
    graph.model("base").agent("a", model="base", max_new_tokens=4)
    graph.node("reader", agent="a", prompt="Order {order}: {question}")
    graph.function("lookup", lookup)
    graph.function("shout", shout)
    graph.node("answer", agent="a", prompt="Answer:", output=True)
    graph.edge("reader", "lookup", TEXT).edge("lookup", "shout", TEXT).edge("reader", "shout", TEXT)
    graph.edge("shout", "answer", TEXT).edge("lookup", "answer", TEXT)
    return graph


def test_a_function_reads_inputs_and_fired_senders_and_its_json_is_canonical(pool):
    SEEN.clear()
    result = run_plan_sync(mixed().plan({"order": "A-17", "question": "where?"}), pool=pool)
    assert result.status == "finished", result.error
    reader = result.nodes["reader"].text
    assert result.nodes["lookup"].text == '{"noted":true,"order":"A-17","status":"shipped"}'
    assert result.nodes["shout"].text == f'lookup={result.nodes["lookup"].text.upper()} | reader={reader.upper()}'
    kind, inputs, senders, thread = SEEN[0]
    assert inputs == {"order": "A-17", "question": "where?"} and senders == {"reader": reader}
    assert thread != threading.main_thread().name and SEEN[1][1] != threading.main_thread().name
    answer = result.nodes["answer"]
    assert f"Message from lookup:\n{result.nodes['lookup'].text}" in answer.prompt_text  # text edges read it
    lookup_result = result.nodes["lookup"]
    assert lookup_result.kind == "function" and lookup_result.positions == 0 and len(lookup_result.lineage) == 0
    assert [hop.source for hop in lookup_result.hops] == ["reader"] and lookup_result.hops[0].mode == "text"
    assert answer.inherited_positions == 0  # functions pass text, never positions


def test_foreach_copies_of_a_function_get_their_item_and_index():
    graph = Graph("each").input("docs", "list[str]")
    graph.function("f", per_item, foreach="docs", item="doc", output=True)
    result = run_plan_sync(graph.plan({"docs": ["x", "y"]}), executor=FakeExecutor())
    assert result.outputs == {"f[0]": "0:x", "f[1]": "1:y"}


@pytest.mark.parametrize(
    "value, text",
    [("plain", "plain"), ({"b": 1, "a": [True, None]}, '{"a":[true,null],"b":1}'), ([1.5, "é"], '[1.5,"é"]'),
     (3, "3"), (False, "false")],
)
def test_canonical_text(value, text):
    assert canonical_text(value, "f") == text


@pytest.mark.parametrize(
    "value, words", [(None, "returned NoneType"), ({"x": {1, 2}}, "not JSON"), (float("nan"), "not JSON"),
                     (b"bytes", "returned bytes")],
)
def test_results_that_are_not_text_or_json_fail_the_node(monkeypatch, value, words):
    module = types.ModuleType("bad_returns")
    module.give = lambda inputs, senders: value
    monkeypatch.setitem(sys.modules, "bad_returns", module)
    graph = Graph("bad").input("q").function("f", "bad_returns:give", output=True)
    result = run_plan_sync(graph.plan({"q": "q"}, trust_code=True), executor=FakeExecutor())
    assert result.status == "failed" and result.failed_node == "f" and words in result.error


def raises(inputs, senders):
    raise KeyError("no such order")


def test_a_raising_function_fails_its_node_and_the_run_names_it():
    graph = Graph("bad").input("q").function("f", raises, output=True)
    result = run_plan_sync(graph.plan({"q": "q"}), executor=FakeExecutor())
    assert result.status == "failed" and result.error == "node 'f': KeyError: 'no such order'"


BLOCKING_STARTED, LOOP_RAN = threading.Event(), threading.Event()


def blocking(inputs, senders):
    # it blocks until the event loop has run another task meanwhile: run on the loop's own
    # thread it would wait out the bound and say so (a count of ticks could not tell)
    BLOCKING_STARTED.set()
    return "slept" if LOOP_RAN.wait(30) else "the event loop did not run"


def test_a_blocking_function_does_not_block_the_event_loop():
    BLOCKING_STARTED.clear()
    LOOP_RAN.clear()
    graph = Graph("slow").input("q")
    graph.function("slow", blocking, output=True)
    graph.model("base").agent("a", model="base")
    graph.node("quick", agent="a", prompt="{q}", output=True)

    async def main():
        async def tick():
            while not BLOCKING_STARTED.is_set():
                await anyio.sleep(0.005)
            LOOP_RAN.set()

        from rclc_graph import run_plan

        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            result = await run_plan(graph.plan({"q": "q"}), executor=FakeExecutor())
        return result

    result = anyio.run(main)
    assert result.outputs["slow"] == "slept"


def asks(inputs, senders):
    raise Interrupt("Ship it?")


def test_a_function_nodes_text_hops_are_published_when_it_is_called():
    """The senders' texts are its arguments: their hop events come before the function runs,
    so a function that stops the run for a person still shows what it was handed."""
    graph = Graph("ask").input("q")
    graph.model("base").agent("a", model="base")
    graph.node("quick", agent="a", prompt="{q}")
    graph.function("gate", asks, output=True)
    graph.edge("quick", "gate", TEXT)
    events = EventStream()
    seen = []

    async def main():
        from rclc_graph import run_plan

        async def consume():
            async for event in events:
                seen.append(event)

        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            result = await run_plan(graph.plan({"q": "q"}), executor=FakeExecutor(), events=events)
            events.close()
        return result

    result = anyio.run(main)
    assert result.status == "waiting" and "gate" not in result.nodes
    gate = [(event.kind, event.payload) for event in seen
            if event.kind in ("hop", "node") and event.payload.get("target", event.payload.get("node")) == "gate"]
    assert [(kind, payload.get("status")) for kind, payload in gate] == [
        ("node", "started"), ("hop", None), ("node", "waiting")]
    hop, waiting = gate[1][1], gate[2][1]
    assert (hop["source"], hop["mode"]) == ("quick", "text")
    assert hop["payload_bytes"] == len(result.nodes["quick"].text.encode("utf-8"))
    assert waiting == {"node": "gate", "status": "waiting", "question": "Ship it?"}


def test_a_function_node_is_recorded_without_a_snapshot_and_a_resume_skips_it(pool, tmp_path):
    SEEN.clear()
    graph = mixed()
    plan = graph.plan({"order": "A-17", "question": "where?"})
    reference, record, run_dir = run_recorded_sync(plan, tmp_path / "ref", pool=pool)
    assert reference.status == "finished" and record["nodes"]["lookup"]["snapshot"] is None
    assert not (run_dir / "nodes" / "lookup.safetensors").exists()
    assert set(finished_nodes(run_dir)) == set(plan.order)
    # a crash after reader and lookup: the run directory as it would be
    crashed = tmp_path / "crashed" / run_dir.name
    crashed.parent.mkdir()
    import shutil

    shutil.copytree(run_dir, crashed)
    for name in ("shout", "answer"):
        for path in (crashed / "nodes").glob(f"{name}.*"):
            path.unlink()
    record["status"] = "running"
    (crashed / "record.json").write_text(json.dumps(record))
    point = read_resume_point(crashed, functions=graph.functions)
    assert set(point.finished) == {"reader", "lookup"} and point.restore == ()
    SEEN.clear()
    resumed, record2, _ = resume_run_sync(crashed, pool=pool, functions=graph.functions)
    assert resumed.status == "finished" and resumed.outputs == reference.outputs
    assert [entry[0] for entry in SEEN] == ["shout"]  # lookup did not run again
    assert record2["attempts"][-1]["ran"] == ["shout", "answer"]


def test_a_resume_finds_builder_functions_by_reference_with_trust_code(pool, tmp_path):
    plan = mixed().plan({"order": "A-1", "question": "q"})
    _, record, run_dir = run_recorded_sync(plan, tmp_path, pool=pool)
    record["status"] = "running"
    (run_dir / "record.json").write_text(json.dumps(record))
    for path in (run_dir / "nodes").glob("answer.*"):
        path.unlink()
    with pytest.raises(ResumeError) as caught:
        read_resume_point(run_dir)
    assert "pass functions=graph.functions to resume_run, astream_resume or stream_resume, or trust_code=True" in str(caught.value)
    resumed, _, _ = resume_run_sync(run_dir, pool=pool, trust_code=True)  # imports this module's functions
    assert resumed.status == "finished"


def test_hosted_replicas_run_function_nodes_on_the_schedulers_side(pool):
    plan = mixed().plan({"order": "A-17", "question": "where?"})
    local = run_plan_sync(plan, executor=LocalExecutor(pool))
    executor = InProcessReplicasExecutor(pool)
    try:
        hosted = run_plan_sync(plan, executor=executor)
    finally:
        executor.close()
    assert hosted.status == "finished", hosted.error
    assert hosted.outputs == local.outputs
    assert hosted.nodes["lookup"].placement is None and hosted.nodes["reader"].placement is not None
    assert {name: node.text for name, node in hosted.nodes.items()} == {name: n.text for name, n in local.nodes.items()}


def test_pins_naming_a_function_node_are_refused(pool):
    plan = mixed().plan({"order": "A", "question": "q"})
    executor = InProcessReplicasExecutor(pool, pins={"lookup": 0})
    try:
        result = run_plan_sync(plan, executor=executor)
    finally:
        executor.close()
    assert result.status == "failed" and "function node, which runs where the scheduler runs" in result.error


RELEASE = threading.Event()  # released at teardown: a hanging function's thread then ends
ENTERED = threading.Event()


@pytest.fixture
def hanging():
    RELEASE.clear()
    ENTERED.clear()
    yield
    RELEASE.set()


def hangs(inputs, senders):
    ENTERED.set()
    RELEASE.wait(3600)
    return "too late"


# issue 24 item 9: function nodes had no timeout
def test_a_function_past_its_timeout_fails_its_node_and_the_run_goes_on(hanging, tmp_path):
    from rclc_graph.spec.models import DEFAULT_FUNCTION_TIMEOUT, NodeSpec

    assert NodeSpec(name="f", call="m:f").timeout is None and DEFAULT_FUNCTION_TIMEOUT == 300.0
    graph = Graph("slow").input("q").function("f", hangs, output=True, timeout=0.2)
    result, record, _ = run_recorded_sync(graph.plan({"q": "q"}), tmp_path, executor=FakeExecutor())
    assert result.status == "failed"
    assert result.error.startswith("node 'f': TimeoutError: function node 'f' did not return within 0.2 s")
    assert "timeout" in result.error and record["status"] == "failed"
    assert not RELEASE.is_set()  # the thread is still blocked: the run did not wait for it


# issue 24 item 9
def test_timeout_is_a_function_node_field():
    with pytest.raises(GraphError, match="sets timeout, which only function nodes use"):
        Graph("g").input("q").model("base").agent("a", model="base").node("n", agent="a", prompt="{q}", timeout=3)
    with pytest.raises(GraphError, match="greater than 0"):
        Graph("g").input("q").function("f", hangs, timeout=0)


# issue 24 item 9: Ctrl-C while a function node hung waited for it (the CLI exited 39 s later);
# a cancelled run stops waiting at once and records the node as not finished
def test_cancelling_a_run_stops_waiting_for_a_hanging_function(hanging, tmp_path):
    from rclc_graph import run_recorded

    graph = Graph("hang").input("q").function("f", hangs, output=True).function("g", lookup_free, output=True)
    plan = graph.plan({"q": "q"})

    async def main():
        async with anyio.create_task_group() as group:
            async def run():
                return await run_recorded(plan, tmp_path, executor=FakeExecutor())

            outcome = {}

            async def keep(): outcome["run"] = await run()

            group.start_soon(keep)
            await anyio.to_thread.run_sync(ENTERED.wait, 60)
            group.cancel_scope.cancel()
        return outcome

    anyio.run(main)
    assert not RELEASE.is_set()  # cancelled while the function still hangs
    run_dir = next(path for path in tmp_path.iterdir() if path.is_dir())
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "cancelled"
    assert "f" not in record["nodes"] and "f" in record["unfinished"]


def lookup_free(inputs, senders):
    return "free"


HANGING_MODULE = '''
import pathlib, sys, time

def hangs(inputs, senders):
    pathlib.Path(inputs["marker"]).write_text("entered")
    time.sleep(3600)
    return "too late"
'''

HANGING_TOPOLOGY = '''
version: 1
name: hang
inputs: {marker: str}
nodes:
  - {name: f, call: hanging_function:hangs, output: true}
'''


# issue 24 item 9: Ctrl-C at 6 s while a function node hung; the CLI exited 39 s later (the
# interpreter waited for the function's worker thread). Now it exits at once, the run recorded.
def test_ctrl_c_on_the_cli_does_not_wait_for_a_hanging_function(tmp_path):
    import os
    import signal
    import subprocess

    (tmp_path / "hanging_function.py").write_text(HANGING_MODULE)
    (tmp_path / "hang.yaml").write_text(HANGING_TOPOLOGY)
    marker = tmp_path / "entered"
    (tmp_path / "inputs.json").write_text(json.dumps({"marker": str(marker)}))
    root = ROOT
    environment = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{tmp_path}", PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "rclc_graph", "run", str(tmp_path / "hang.yaml"), "--input", str(tmp_path / "inputs.json"),
         "--out", str(tmp_path / "runs"), "--trust-code", "--json"],
        cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # the function entered (at most 120 s: a loaded machine starts slowly)
            if marker.exists() or process.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert marker.exists(), process.communicate(timeout=10)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)  # the function sleeps an hour: waiting for it would time out
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] in ("cancelled", "interrupted") and record["unfinished"] == ["f"]


def floods(inputs, senders):
    return "x" * (3 << 20)  # 3 MiB of text


# issue 24 item 4: a function node returning a huge output crashed the CLI with an ExceptionGroup
# traceback ("unhandled errors in a TaskGroup") and wrote a 125 MB record.json and report.html
def test_an_output_over_the_node_limit_fails_its_node_and_keeps_the_record_small(tmp_path):
    from rclc_graph.spec.models import MAX_NODE_TEXT_BYTES

    graph = Graph("flood").input("q").function("f", floods, output=True)
    result, record, run_dir = run_recorded_sync(graph.plan({"q": "q"}), tmp_path, executor=FakeExecutor())
    assert result.status == "failed" and result.failed_node == "f"
    assert result.error.startswith("node 'f': OutputTooLarge: the node's output is 3145728 bytes of text, more than "
                                   f"the {MAX_NODE_TEXT_BYTES}")
    assert (run_dir / "record.json").stat().st_size < 100_000 and (run_dir / "report.html").stat().st_size < 200_000


FLOOD_TOPOLOGY = '''
version: 1
name: flood
inputs: {q: str}
nodes:
  - {name: f, call: flooding:floods, output: true}
'''


# issue 24 item 4: the same from the CLI: a clear error and exit code 1, no traceback
def test_the_cli_reports_an_oversized_output_as_the_nodes_failure(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rclc_graph.views.cli import app

    (tmp_path / "flooding.py").write_text("def floods(inputs, senders):\n    return 'x' * (3 << 20)\n")
    (tmp_path / "flood.yaml").write_text(FLOOD_TOPOLOGY)
    (tmp_path / "in.json").write_text('{"q": "q"}')
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "flood.yaml"), "--input", str(tmp_path / "in.json"),
                                      "--out", str(tmp_path / "runs"), "--trust-code"])
    assert result.exit_code == 1, result.output
    assert "OutputTooLarge" in result.output and "Traceback" not in result.output
    assert "ExceptionGroup" not in result.output and "TaskGroup" not in result.output


# issue 24 item 5: an --answer that is not UTF-8 gave a misleading E_TEMPLATE
def test_an_answer_that_is_not_utf8_is_named_as_such(tmp_path):
    import os
    import subprocess

    (tmp_path / "gatefn.py").write_text(
        "from rclc_graph import Interrupt\n"
        "def gate(inputs, senders):\n"
        "    if 'answer' not in inputs:\n"
        "        raise Interrupt('ok?')\n"
        "    return inputs['answer']\n")
    (tmp_path / "w.yaml").write_text("version: 1\nname: w\ninputs: {q: str}\nnodes:\n"
                                     "  - {name: gate, call: gatefn:gate, output: true}\n")
    (tmp_path / "in.json").write_text('{"q": "x"}')
    root = ROOT
    environment = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{tmp_path}")
    base = [sys.executable, "-m", "rclc_graph"]
    waited = subprocess.run(base + ["run", "w.yaml", "--input", "in.json", "--out", "runs", "--trust-code"],
                            cwd=tmp_path, env=environment, capture_output=True, timeout=300)
    assert waited.returncode == 3, waited.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    answered = subprocess.run([os.fsencode(part) for part in base] + [b"resume", os.fsencode(run_dir), b"--answer",
                                                                      b"gate=caf\xe9", b"--trust-code"],
                              cwd=tmp_path, env=environment, capture_output=True, timeout=300)
    message = answered.stderr.decode("utf-8", "replace")
    assert answered.returncode == 2 and "E_ENCODING" in message and "not valid Unicode" in message, message
    assert "E_TEMPLATE" not in message
