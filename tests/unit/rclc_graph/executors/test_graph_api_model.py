"""`backend: openai` models against a loopback OpenAI-compatible stub (tests/helpers/openai_stub.py).

An API agent reads text only: it ends a chain of local state-passing readers through a text
edge. Its answer streams in as token events; it leaves no state or snapshot; its key comes
from the environment variable the spec names and appears nowhere in records, events or the
report; a server that is down, slow or failing fails the node clearly, and the run resumes
once the server is back. (The vLLM tier runs the same against `vllm serve`.)
"""

from __future__ import annotations

import json

import anyio
import pytest

from rclc_graph import ApiModelFailed, Graph, ModelPool, Policy, PlanError, SpecError, read_record
from rclc_graph import load_graph, load_graph_text, resume_run_sync, run_recorded
from rclc_graph.spec.models import ModelSpec
from tests.helpers.event_runs import run_consumed
from tests.helpers.openai_stub import ChatStub, free_port
from tests.paths import ROOT

KEY_VARIABLE = "RCLC_TEST_API_KEY"
SECRET = "sk-test-5ecret-never-stored"


@pytest.fixture
def pool(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    return pool


@pytest.fixture
def stub():
    with ChatStub("The owner is Alice.") as server:
        yield server


def api_graph(base_url: str, *, timeout: float = 5.0, max_retries: int = 0, key: bool = True):
    options = {"api_key_env": KEY_VARIABLE} if key else {}
    graph = Graph("api_chain").input("question").input("chunks", "list[str]")
    graph.model("base")
    graph.model("remote", backend="openai", base_url=base_url, model="smol", timeout=timeout,
                max_retries=max_retries, **options)
    graph.agent("reader", model="base", max_new_tokens=3)
    graph.agent("local", model="base", max_new_tokens=4)
    graph.agent("hosted", model="remote", system="Answer in one sentence.", max_new_tokens=32)
    graph.node("r0", agent="reader", prompt="Part: {chunks[0]}", generate=False)
    graph.node("r1", agent="reader", prompt="Part: {chunks[1]}", generate=False)
    graph.node("draft", agent="local", prompt="{question}")
    graph.node("final", agent="hosted", prompt="Question: {question}", output=True)
    graph.edge("r0", "r1", Policy(ratio=2))
    graph.edge("r1", "draft", Policy(budget=8))
    graph.edge("draft", "final", Policy(mode="text"))
    return graph.plan({"question": "Who owns Cedar?", "chunks": ["Cedar is owned by Alice.", "Birch is Bob's."]})


def run(plan, pool, out, events=None):
    return anyio.run(lambda: run_recorded(plan, out, pool=pool, events=events))


def test_an_api_model_ends_a_chain_of_local_readers(stub, pool, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    (result, record, run_dir), seen = run_consumed(
        lambda events: run_recorded(api_graph(stub.base_url), tmp_path, pool=pool, events=events))
    assert result.status == "finished", result.error
    assert result.outputs == {"final": "The owner is Alice."}
    [request] = stub.requests
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    body = request["body"]
    assert body["model"] == "smol" and body["max_tokens"] == 32 and body["temperature"] == 0.0
    assert body["messages"][0] == {"role": "system", "content": "Answer in one sentence."}
    draft = result.nodes["draft"].text or ""
    assert body["messages"][1]["content"] == f"Message from draft:\n{draft.strip()}\n\nQuestion: Who owns Cedar?"
    # Streamed: one token event per piece, in order; no state and no snapshot.
    tokens = [event.payload["text"] for event in seen if event.kind == "token" and event.payload["node"] == "final"]
    assert "".join(tokens) == "The owner is Alice." and len(tokens) == 4
    # The text hop is published when the request holds it: before the server's first token.
    order = [(event.kind, event.payload.get("target", event.payload.get("node"))) for event in seen
             if event.kind in ("hop", "token")]
    assert order.index(("hop", "final")) < order.index(("token", "final"))
    [hop_event] = [event.payload for event in seen if event.kind == "hop" and event.payload["target"] == "final"]
    assert {key: hop_event[key] for key in ("source", "mode", "payload_bytes")} == {
        "source": "draft", "mode": "text", "payload_bytes": record["hops"][-1]["payload_bytes"]}
    final = result.nodes["final"]
    assert (final.positions, final.generated_tokens, len(final.lineage)) == (0, 4, 0)
    assert record["nodes"]["final"]["snapshot"] is None
    assert [hop.mode for hop in final.hops] == ["text"]
    [remote] = [model for model in record["models"] if model["name"] == "remote"]
    assert remote["backend"] == "openai" and remote["resolved_source"] == stub.base_url
    # The key is named, never stored: not in the record, node files, report or events.
    assert record["topology"]["spec"]["models"][1]["api_key_env"] == KEY_VARIABLE
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in json.dumps([event.payload for event in seen], default=str)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("down", "cannot connect"),
        ("500", "the server answered 500 after 1 retries: stub error 500; see the server's log"),
        ("404", "the server answered 404"),
        ("slow", "no answer within the 2 s timeout"),
    ],
)
def test_a_failing_server_fails_the_node_and_the_run_resumes_once_it_is_back(
    stub, pool, tmp_path, setup, message
):
    base_url = f"http://127.0.0.1:{free_port()}/v1" if setup == "down" else stub.base_url
    if setup in ("500", "404"):
        stub.status = int(setup)
    if setup == "slow":
        stub.delay = 30.0  # far beyond the timeout, however slow the machine
    # Only "slow" is meant to time out: the others' answers (and every resume's) get 30 s, so a
    # loaded machine's late answer cannot turn their expected errors into a timeout.
    timeout = 2.0 if setup == "slow" else 30.0
    plan = api_graph(base_url, timeout=timeout, max_retries=1 if setup == "500" else 0, key=False)
    result, record, run_dir = run(plan, pool, tmp_path)
    assert result.status == "failed" and result.failed_node == "final"
    assert "ApiModelFailed" in result.error and message in result.error, result.error
    assert "model 'remote' (smol at" in result.error
    assert sorted(record["nodes"]) == ["draft", "r0", "r1"]
    if setup == "500":
        assert len(stub.requests) == 2  # one retry, then the failure
    if setup == "down":
        return  # nothing to bring back at that address
    stub.status, stub.delay = 200, 0.0
    resumed, record, _ = resume_run_sync(run_dir, pool=pool)
    assert resumed.status == "finished" and resumed.outputs == {"final": "The owner is Alice."}
    assert record["attempts"][-1]["ran"] == ["final"]
    assert record["attempts"][-1]["reused"] == ["r0", "r1", "draft"]


def test_a_finished_api_node_is_not_called_again_on_resume(stub, pool, tmp_path):
    graph = Graph("api_then_local").input("question")
    graph.model("base").model("remote", backend="openai", base_url=stub.base_url, model="smol")
    graph.agent("hosted", model="remote").agent("local", model="base", max_new_tokens=3)
    graph.node("ask", agent="hosted", prompt="{question}")
    graph.node("final", agent="local", prompt="{question}", output=True)
    graph.edge("ask", "final", Policy(mode="text"))
    plan = graph.plan({"question": "Who owns Cedar?"})
    result, record, run_dir = run(plan, pool, tmp_path)
    assert result.status == "finished"
    # Make it look as if the run died before `final` was recorded.
    (run_dir / "nodes" / "final.json").unlink()
    (run_dir / "nodes" / "final.safetensors").unlink()
    data = json.loads((run_dir / "record.json").read_text())
    data["status"] = "running"
    (run_dir / "record.json").write_text(json.dumps(data))
    resumed, record, _ = resume_run_sync(run_dir, pool=pool)
    assert resumed.outputs == result.outputs
    assert len(stub.requests) == 1 and record["attempts"][-1]["reused"] == ["ask"]
    assert read_record(run_dir)["status"] == "finished"


def test_a_missing_key_variable_fails_the_node_naming_the_variable(stub, pool, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    result, _, _ = run(api_graph(stub.base_url), pool, tmp_path)
    assert result.status == "failed" and f"environment variable {KEY_VARIABLE} (api_key_env) is not set" in result.error
    assert stub.requests == []
    assert issubclass(ApiModelFailed, RuntimeError)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "openai"}, "backend openai needs base_url and model"),
        ({"backend": "openai", "base_url": "http://h/v1"}, "needs model"),
        ({"backend": "openai", "base_url": "ftp://h", "model": "m"}, "not an http(s) URL"),
        ({"backend": "openai", "base_url": "http://h/v1", "model": "m", "source": "./weights"}, "does not use source"),
        ({"backend": "openai", "base_url": "http://h/v1", "model": "m", "dtype": "float16"}, "does not use dtype"),
        ({"backend": "openai", "base_url": "http://h/v1", "model": "m", "api_key_env": "sk-123"},
         "not an environment variable name"),
        ({"base_url": "http://h/v1"}, "apply to backend openai only"),
        ({"timeout": 3.0}, "apply to backend openai only"),
        ({"backend": "openai", "base_url": "http://h/v1", "model": "m", "timeout": 0}, "greater than 0"),
    ],
)
def test_model_fields_are_checked(fields, message):
    with pytest.raises(SpecError, match="E_FIELD") as caught:
        Graph("g").model("remote", **fields)
    assert message in str(caught.value)


def test_local_state_around_an_api_model_is_refused_at_plan_time():
    graph = Graph("g").input("q")
    graph.model("base").model("remote", backend="openai", base_url="http://127.0.0.1:9/v1", model="m")
    graph.agent("local", model="base")
    graph.agent("hosted", model="remote", context_limit=512)
    graph.node("a", agent="local", prompt="{q}")
    graph.node("b", agent="hosted", prompt="{q}")
    graph.node("c", agent="hosted", prompt="{q}", generate=False)
    graph.node("d", agent="local", prompt="{q}", output=True)
    graph.edge("a", "b", Policy(budget=8)).edge("b", "d", Policy(mode="full")).edge("c", "d", Policy(mode="text"))
    with pytest.raises(PlanError) as caught:
        graph.validate()
    problems = {(str(problem.code), ".".join(map(str, problem.path))) for problem in caught.value.problems}
    assert problems >= {
        ("E_API_MODEL", "agents.1.context_limit"),
        ("E_API_MODEL", "nodes.2.generate"),
        ("E_API_MODEL", "edges.0.policy"),
        ("E_API_MODEL", "edges.1.policy"),
    }
    assert "E_CROSS_MODEL" not in caught.value.codes()  # one clear problem per edge, with its fix
    assert all("mode: text" in problem.fix for problem in caught.value.problems
               if problem.path[0] == "edges" and problem.code == "E_API_MODEL")


def test_remote_executors_ask_the_server_from_the_scheduler_side(stub, pool, tmp_path):
    """Replicas hold local models only: an API node runs where the scheduler runs, starts no
    replica, keeps no agent, and its record has no snapshot, like in-process."""
    from rclc_graph.testing import InProcessReplicasExecutor

    plan = api_graph(stub.base_url, key=False)
    local, _, _ = run(plan, pool, tmp_path / "local")
    executor = InProcessReplicasExecutor(pool, replicas={"base": 2}, pins={"draft": 1})
    try:
        remote, record, _ = anyio.run(lambda: run_recorded(plan, tmp_path / "remote", pool=pool, executor=executor))
        fingerprints = anyio.run(lambda: executor.fingerprints(plan))
    finally:
        executor.close()
    assert remote.status == "finished", remote.error
    assert remote.outputs == local.outputs == {"final": "The owner is Alice."}
    assert remote.nodes["final"].placement is None and record["nodes"]["final"]["snapshot"] is None
    assert executor.started == 2  # the two replicas of base; none for the API model
    assert fingerprints["remote"] != fingerprints["base"] and len(fingerprints["remote"]) == 64


def test_the_shipped_api_example_is_incident_review_with_a_served_editor(stub, pool, tmp_path):
    """examples/topologies/incident_review_api.yaml (docs/graphs.md's example) differs from the
    walk-through's incident_review.yaml only in the editor's model, and runs: local readers and
    drafter (the tiny model stands in for the embedded one), the editor asked over the API."""
    path = ROOT / "examples" / "topologies" / "incident_review_api.yaml"
    shipped, walkthrough = load_graph(path), load_graph(ROOT / "examples" / "topologies" / "incident_review.yaml")
    assert (shipped.nodes, shipped.edges, shipped.inputs, shipped.policies) == (
        walkthrough.nodes, walkthrough.edges, walkthrough.inputs, walkthrough.policies)
    editor = next(agent for agent in shipped.agents if agent.name == "editor")
    assert [agent for agent in shipped.agents if agent.name != "editor"] == [
        agent for agent in walkthrough.agents if agent.name != "editor"]
    served = next(model for model in shipped.models if model.name == editor.model)
    assert served.is_api and served.base_url == "http://127.0.0.1:8000/v1" and served.api_key_env is None
    text = path.read_text(encoding="utf-8").replace("http://127.0.0.1:8000/v1", stub.base_url)
    inputs = json.loads((ROOT / "examples" / "inputs" / "incident_review.json").read_text(encoding="utf-8"))
    plan = Graph.from_spec(load_graph_text(text)).plan(inputs)
    result, record, _ = run(plan, pool, tmp_path)
    assert result.status == "finished", result.error
    assert result.outputs == {"editor": "The owner is Alice."}
    [request] = stub.requests
    drafted = (result.nodes["drafter"].text or "").strip()
    assert request["body"]["messages"][1]["content"].startswith(f"Message from drafter:\n{drafted}\n\nQuestion: ")
    assert record["nodes"]["editor"]["snapshot"] is None and record["nodes"]["drafter"]["snapshot"] is not None


def test_an_api_nodes_output_schema_goes_as_response_format_and_is_checked(pool, tmp_path):
    """The server is asked for strict json_schema output; a reply that does not match fails the node."""
    schema = {"type": "object", "properties": {"owner": {"type": "string"}}, "required": ["owner"]}
    with ChatStub('{"owner": "Alice"}') as server:
        graph = Graph("api_json").input("question")
        graph.model("remote", backend="openai", base_url=server.base_url, model="smol", max_retries=0)
        graph.agent("hosted", model="remote", max_new_tokens=32)
        graph.node("final", agent="hosted", prompt="Question: {question}", output=True, output_schema=schema)
        result, _, _ = run(graph.plan({"question": "Who owns Cedar?"}), pool, tmp_path / "ok")
        assert result.status == "finished", result.error
        assert result.nodes["final"].json() == {"owner": "Alice"}
        [body] = [request["body"] for request in server.requests if request["body"].get("response_format")]
        assert body["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "final", "schema": {**schema, "additionalProperties": False}, "strict": True}}
    with ChatStub("Alice owns it.") as server:
        graph = Graph("api_json").input("question")
        graph.model("remote", backend="openai", base_url=server.base_url, model="smol", max_retries=0)
        graph.agent("hosted", model="remote", max_new_tokens=32)
        graph.node("final", agent="hosted", prompt="Question: {question}", output=True, output_schema=schema)
        result, _, _ = run(graph.plan({"question": "Who owns Cedar?"}), pool, tmp_path / "bad")
    assert result.status == "failed" and "OutputSchemaFailed" in str(result.error)
