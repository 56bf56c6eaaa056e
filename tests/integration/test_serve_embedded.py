"""`rclc-graph serve` as a subprocess on the embedded model (issue 15, "Must show"): fanout_qa
started through HTTP, its SSE stream read to the end and checked against the record; then a
server SIGKILLed mid-run, started again, the run resumed, and the same outputs as an
uninterrupted run."""

from __future__ import annotations

import httpx
import pytest

from rclc_graph.results.run_events import HopDelivered, NodeFinished, event_from_dict
from rclc_graph.run.event_log import read_events

from tests.helpers.serve_process import ServeProcess, example_inputs, sse_messages

pytestmark = pytest.mark.integration

START = {"topology": "fanout_qa", "inputs": example_inputs("fanout_qa")}


def events_of(client: httpx.Client, run_id: str, after: int = 0) -> list[dict]:
    with client.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": str(after)}) as response:
        assert response.status_code == 200
        return list(sse_messages(response.iter_lines()))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    runs = tmp_path_factory.mktemp("serve") / "runs"
    with ServeProcess(runs) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        accepted = client.post("/runs", json=START)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        messages = events_of(client, run_id)
        detail = client.get(f"/runs/{run_id}").json()
    return {"run_id": run_id, "messages": messages, "record": detail["record"], "status": detail["status"],
            "runs": runs}


def test_fanout_qa_through_http_streams_the_events_of_its_record(uninterrupted):
    messages, record = uninterrupted["messages"], uninterrupted["record"]
    assert uninterrupted["status"] == record["status"] == "finished"
    assert messages[-1]["event"] == "end" and messages[-1]["data"]["status"] == "finished"
    events = [event_from_dict(message["data"]) for message in messages[:-1]]
    assert [int(message["id"]) for message in messages[:-1]] == list(range(1, len(events) + 1))
    assert events[0].type == "run.started" and events[-1].type == "run.finished"
    assert events[-1].outputs == record["outputs"] and record["outputs"]["final"]
    hops = [event for event in events if isinstance(event, HopDelivered)]
    assert [(hop.source, hop.target) for hop in hops] == [(row["source"], row["target"]) for row in record["hops"]]
    for hop, row in zip(hops, record["hops"]):
        wire = hop.to_dict()
        for key, value in row.items():
            if key != "generation_seconds":
                assert wire[key] == value, key
        assert sum(segment[4] for segment in hop.kept) == row["kept_positions"]
    finished = [event for event in events if isinstance(event, NodeFinished)]
    assert {event.node: event.positions for event in finished} == \
           {name: node["positions"] for name, node in record["nodes"].items()}
    # every hop into final arrives before final's first token
    first_token = next(index for index, event in enumerate(events) if event.type == "token")
    assert max(index for index, event in enumerate(events) if isinstance(event, HopDelivered)) < first_token
    text = "".join(event.text for event in events if event.type == "token")
    assert record["outputs"]["final"].strip() in text
    assert read_events(uninterrupted["runs"] / uninterrupted["run_id"]) == [message["data"] for message in messages[:-1]]


def test_a_server_killed_mid_run_restarts_resumes_and_gives_the_uninterrupted_outputs(uninterrupted, tmp_path):
    runs = tmp_path / "runs"
    server = ServeProcess(runs).start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            run_id = client.post("/runs", json=START).json()["run_id"]
            with client.stream("GET", f"/runs/{run_id}/events") as response:
                seen = []
                for message in sse_messages(response.iter_lines()):
                    seen.append(message)
                    if message["event"] == "token":  # final is generating: the readers are recorded
                        server.kill()
                        break
    finally:
        server.kill()
    logged = read_events(runs / run_id)
    assert [event["id"] for event in logged] == list(range(1, len(logged) + 1))
    assert len(logged) >= len(seen)  # nothing the client saw is missing from the log

    with ServeProcess(runs) as restarted, httpx.Client(base_url=restarted.url, timeout=120) as client:
        listed = {run["run_id"]: run["status"] for run in client.get("/runs").json()["runs"]}
        assert listed[run_id] == "interrupted"
        replay = events_of(client, run_id)
        assert replay[-1] == {"id": None, "event": "end", "data": {"run_id": run_id, "status": "interrupted"}}
        assert [message["data"] for message in replay[:-1]] == logged
        resumed = client.post(f"/runs/{run_id}/resume")
        assert resumed.status_code == 202, resumed.text
        after = events_of(client, run_id, after=len(logged))
        assert after[-1]["data"]["status"] == "finished"
        assert int(after[0]["id"]) == len(logged) + 1 and after[0]["data"]["resumed"] == 3
        record = client.get(f"/runs/{run_id}").json()["record"]
    assert record["outputs"] == uninterrupted["record"]["outputs"]
    assert record["attempts"][0]["status"] == "crashed" and record["attempts"][-1]["ran"] == ["final"]
    assert [hop["kept_positions"] for hop in record["hops"]] == \
           [hop["kept_positions"] for hop in uninterrupted["record"]["hops"]]
