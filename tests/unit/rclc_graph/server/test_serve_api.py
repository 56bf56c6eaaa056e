"""`rclc-graph serve`'s HTTP API on a real loopback server over tiny models (issue 15, item 2):
a run through HTTP whose SSE events match its record, resumable streams, JSON errors with
the CLI's codes, uploads' limits, the guards, and an OpenAPI document equal to the routes."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from rclc_graph import compile_plan, load_graph_text, run_recorded_sync
from rclc_graph.results.run_events import HopDelivered, NodeFinished, event_from_dict
from rclc_graph.server import ServerSettings
from rclc_graph.server.openapi import OPERATIONS
from rclc_graph.server.schemas import ErrorBody, RunAccepted, RunDetail, RunList, ServerState, TopologyList
from starlette.routing import Mount, Route

from tests.helpers.servers import PAIR_INPUTS, PAIR_YAML, live_server, read_sse, tiny_pool, write_topologies


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_qwen3):
    directory = tmp_path_factory.mktemp("serve")
    write_topologies(directory)
    with live_server(directory, tiny_pool(tiny_qwen3)) as (url, app):
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client, app, directory


def run_to_end(client, body=None):
    accepted = client.post("/runs", json=body or {"topology": "pair", "inputs": PAIR_INPUTS})
    assert accepted.status_code == 202, accepted.text
    RunAccepted.model_validate(accepted.json())
    run_id = accepted.json()["run_id"]
    with client.stream("GET", f"/runs/{run_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = read_sse(response)
    return run_id, messages


def test_a_run_through_http_streams_events_that_match_its_record(server):
    client, _, directory = server
    run_id, messages = run_to_end(client)
    assert messages[-1]["event"] == "end" and messages[-1]["data"]["status"] == "finished"
    logged = messages[:-1]
    assert [int(message["id"]) for message in logged] == list(range(1, len(logged) + 1))
    events = [event_from_dict(message["data"]) for message in logged]
    assert [message["event"] for message in logged] == [event.type for event in events]
    detail = client.get(f"/runs/{run_id}").json()
    RunDetail.model_validate(detail)
    record = detail["record"]
    assert detail["status"] == record["status"] == "finished"
    assert events[0].type == "run.started" and events[-1].type == "run.finished"
    assert events[-1].outputs == record["outputs"]
    hops = [event for event in events if isinstance(event, HopDelivered)]
    assert len(hops) == len(record["hops"])
    for hop, row in zip(hops, record["hops"]):
        wire = hop.to_dict()
        assert {key: wire[key] for key in row if key != "generation_seconds"} == \
               {key: value for key, value in row.items() if key != "generation_seconds"}
    finished = {event.node: event for event in events if isinstance(event, NodeFinished)}
    assert {name: event.positions for name, event in finished.items()} == \
           {name: node["positions"] for name, node in record["nodes"].items()}
    tokens = "".join(event.text for event in events if event.type == "token")
    answer = record["outputs"]["answer"]  # the streamed pieces are its text (issue 24 defect D2) but for a
    assert answer.startswith(tokens.strip())  # character the generation ended in the middle of
    assert answer[len(tokens.strip()):].replace("\ufffd", "").strip() == ""
    assert (directory / "runs" / run_id / "events.jsonl").is_file()


def test_a_stream_resumes_after_last_event_id_and_after_query(server):
    client, _, _ = server
    run_id, messages = run_to_end(client)
    total = len(messages) - 1
    with client.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": "4"}) as response:
        again = read_sse(response)
    assert [int(message["id"]) for message in again[:-1]] == list(range(5, total + 1))
    assert [message["data"] for message in again[:-1]] == [message["data"] for message in messages[4:-1]]
    with client.stream("GET", f"/runs/{run_id}/events?after={total}") as response:
        assert [message["event"] for message in read_sse(response)] == ["end"]


def test_lists_topologies_runs_nodes_drawings_and_reports(server):
    client, _, _ = server
    run_id, _ = run_to_end(client)
    topologies = client.get("/topologies").json()
    TopologyList.model_validate(topologies)
    pair = topologies["topologies"][0]
    assert pair["name"] == "pair" and pair["inputs"]["question"]["type"] == "str"
    assert pair["example_inputs"] == PAIR_INPUTS
    assert 'data-node="read"' in client.get("/topologies/pair/graph.svg").text
    runs = client.get("/runs").json()
    RunList.model_validate(runs)
    assert run_id in [run["run_id"] for run in runs["runs"]]
    svg = client.get(f"/runs/{run_id}/graph.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml") and 'data-node="answer"' in svg.text
    node = client.get(f"/runs/{run_id}/nodes/read").json()
    assert node["node"] == "read" and len(node["prompt_offsets"]) > 0
    report = client.get(f"/runs/{run_id}/report.html")
    assert report.status_code == 200 and "default-src 'none'" in report.headers["content-security-policy"]
    ServerState.model_validate(client.get("/server").json())
    page = client.get("/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/ui/app.js").status_code == 200


def error_of(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    ErrorBody.model_validate(body)
    return body["error"]


def test_errors_are_json_with_the_clis_codes_and_fixes(server):
    client, _, _ = server
    error = error_of(client.post("/runs", json={"topology": "pair", "inputs": {"question": "Q"}}), 422)
    assert error["code"] == "E_INPUT" and error["fix"] and error["problems"][0]["location"]["file"].endswith("pair.yaml")
    error = error_of(client.post("/runs", json={"topology": "pair", "yaml": "x", "inputs": {}}), 422)
    assert error["code"] == "E_REQUEST" and "exactly one of topology" in error["message"]
    error = error_of(client.post("/runs", json={"topology": "pair", "inputs": PAIR_INPUTS, "colour": 1}), 422)
    assert error["code"] == "E_REQUEST" and "colour" in error["message"]
    assert error_of(client.post("/runs", content=b"{nope", headers={"content-type": "application/json"}),
                    400)["code"] == "E_REQUEST"
    assert error_of(client.post("/runs", json={"topology": "nope", "inputs": {}}), 404)["code"] == "E_NOT_FOUND"
    assert error_of(client.get("/runs/no-such-run"), 404)["code"] == "E_NOT_FOUND"
    assert error_of(client.get("/runs/..%2F..%2Fetc"), 404)["code"] == "E_NOT_FOUND"
    assert error_of(client.get("/runs/.serve"), 400)["code"] == "E_REQUEST"
    assert error_of(client.get("/nowhere"), 404)["code"] == "E_NOT_FOUND"
    assert error_of(client.delete("/runs"), 405)["code"] == "E_REQUEST"
    assert error_of(client.post("/runs", content=b"topology=pair",
                                headers={"content-type": "application/x-www-form-urlencoded"}), 415)["code"] == "E_MEDIA_TYPE"


def test_bodies_over_the_limit_are_refused_announced_or_streamed(server):
    client, app, _ = server
    limit = app.state.settings.max_body_bytes
    big = b'{"yaml": "' + b"x" * limit + b'"}'
    assert error_of(client.post("/runs", content=big, headers={"content-type": "application/json"}),
                    413)["code"] == "E_BODY_SIZE"

    def chunks():
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    assert error_of(client.post("/runs", content=chunks(), headers={"content-type": "application/json"}),
                    413)["code"] == "E_BODY_SIZE"


def test_uploaded_topologies_run_but_get_no_paths_other_models_or_code(server):
    client, _, _ = server
    run_id, messages = run_to_end(client, {"yaml": PAIR_YAML, "inputs": PAIR_INPUTS})
    assert messages[-1]["data"]["status"] == "finished"
    assert client.get(f"/runs/{run_id}").json()["record"]["topology"]["file"] is None
    by_path = PAIR_YAML.replace("- {name: reader, model: base, max_new_tokens: 4}", "- ../../etc/agents.yaml")
    error = error_of(client.post("/runs", json={"yaml": by_path, "inputs": PAIR_INPUTS}), 422)
    assert error["code"] == "E_UNKNOWN_REF" and "may name profiles only by name" in error["message"]
    other_model = PAIR_YAML.replace("source: embedded", "source: /tmp/some-checkpoint")
    error = error_of(client.post("/runs", json={"yaml": other_model, "inputs": PAIR_INPUTS}), 422)
    assert error["code"] == "E_UNKNOWN_REF" and "not one this server offers" in error["message"]
    code = PAIR_YAML.replace("{mode: state, ratio: 2}", "{mode: state, ratio: 2, selector: 'os:system'}")
    assert error_of(client.post("/runs", json={"yaml": code, "inputs": PAIR_INPUTS}), 422)["code"] == "E_TRUST_CODE"
    assert error_of(client.post("/runs", json={"yaml": "name: [", "inputs": {}}), 422)["code"] == "E_YAML_SYNTAX"


def test_the_host_header_of_a_loopback_server_must_be_loopback(server):
    client, _, _ = server
    assert error_of(client.get("/runs", headers={"host": "evil.example:80"}), 421)["code"] == "E_HOST"
    assert client.get("/runs", headers={"host": "localhost"}).status_code == 200


def test_answers_need_a_waiting_run(server):
    client, _, _ = server
    run_id, _ = run_to_end(client)
    error = error_of(client.post(f"/runs/{run_id}/answer", json={"answers": {"answer": "yes"}}), 409)
    assert error["code"] == "E_STATE"
    assert error_of(client.post(f"/runs/{run_id}/answer", json={"answers": "yes"}), 422)["code"] == "E_REQUEST"


GATED_YAML = """\
version: 1
name: gated
description: a person's notes before the first node, a person's review after the draft
inputs:
  brief: {type: str, description: what to write about}
models:
  - {name: base, source: embedded}
agents:
  - {name: a, model: base, max_new_tokens: 5}
nodes:
  - {name: notes, agent: a, prompt: "Brief: {brief}. Editor's notes: {answer}", interrupt: before,
     question: "Any notes about {brief}?"}
  - {name: draft, agent: a, prompt: "Draft:", interrupt: after, question: "Is this draft fine?"}
  - {name: final, agent: a, prompt: "Final:", output: true}
edges:
  - {source: notes, target: draft, policy: {mode: state, ratio: 2}}
  - {source: draft, target: final, policy: {mode: state, ratio: 2}}
"""
GATED_INPUTS = {"brief": "Cedar works offline"}
GATED_ANSWERS = {"notes": "keep it short", "draft": "Looks fine."}


def events_after(client, run_id, last_id):
    with client.stream("GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": str(last_id)}) as response:
        return read_sse(response)


def test_a_waiting_run_is_answered_through_http_and_ends_as_answering_up_front(server, tiny_qwen3):
    client, app, directory = server
    accepted = client.post("/runs", json={"yaml": GATED_YAML, "inputs": GATED_INPUTS})
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    first = events_after(client, run_id, 0)
    assert first[-1]["event"] == "end" and first[-1]["data"]["status"] == "waiting"
    assert [message["event"] for message in first[:-1]] == ["run.started", "node.waiting", "run.waiting"]
    assert first[1]["data"]["node"] == "notes" and first[1]["data"]["question"] == "Any notes about Cedar works offline?"
    detail = client.get(f"/runs/{run_id}").json()
    assert detail["status"] == detail["record"]["status"] == "waiting"
    assert detail["record"]["waiting"][0]["node"] == "notes"
    record_file = directory / "runs" / run_id / "record.json"
    before = record_file.read_text()

    assert error_of(client.post(f"/runs/{run_id}/resume"), 409)["code"] == "E_STATE"  # it needs an answer
    wrong = error_of(client.post(f"/runs/{run_id}/answer", json={"answers": {"final": "x"}}), 409)
    assert wrong["code"] == "E_RESUME" and "final" in wrong["message"]
    missing = error_of(client.post(f"/runs/{run_id}/answer", json={"answers": {"draft": "ok"}}), 409)
    assert missing["code"] == "E_RESUME" and "notes" in missing["message"]  # the node asked now is named
    assert record_file.read_text() == before  # refusals leave the run as it was

    answered = client.post(f"/runs/{run_id}/answer", json={"answers": {"notes": GATED_ANSWERS["notes"]}})
    assert answered.status_code == 202, answered.text
    assert answered.json()["run_id"] == run_id
    second = events_after(client, run_id, first[-2]["id"])
    assert int(second[0]["id"]) == int(first[-2]["id"]) + 1  # the same event log, continued
    assert second[-1]["data"]["status"] == "waiting"
    kinds = [(message["event"], message["data"].get("node")) for message in second[:-1]]
    assert kinds[0] == ("run.started", None)
    assert ("node.finished", "notes") in kinds and ("node.finished", "draft") in kinds
    assert kinds[-2:] == [("node.waiting", "draft"), ("run.waiting", "draft")]
    assert ("node.started", "final") not in kinds

    answered = client.post(f"/runs/{run_id}/answer", json={"answers": {"draft": GATED_ANSWERS["draft"]}})
    assert answered.status_code == 202, answered.text
    third = events_after(client, run_id, second[-2]["id"])
    assert third[-1]["data"]["status"] == "finished"
    assert [message["event"] for message in third[-3:-1]] == ["node.finished", "run.finished"]
    record = client.get(f"/runs/{run_id}").json()["record"]
    assert record["status"] == "finished" and record["answers"] == GATED_ANSWERS
    assert error_of(client.post(f"/runs/{run_id}/answer", json={"answers": {"draft": "ok"}}), 409)["code"] == "E_STATE"

    plan = compile_plan(load_graph_text(GATED_YAML), GATED_INPUTS, answers=GATED_ANSWERS)
    upfront, _, _ = run_recorded_sync(plan, directory / "upfront", pool=tiny_pool(tiny_qwen3))
    assert upfront.status == "finished"
    assert record["outputs"] == upfront.outputs


def test_the_openapi_document_lists_exactly_the_routes(server):
    client, app, _ = server
    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    routes = set()
    for route in app.routes:
        if isinstance(route, Route):
            path = route.path.replace(":path}", "}")  # a node of a subgraph is named with "/": research/notes
            routes.update((method.lower(), path) for method in route.methods if method != "HEAD")
        else:
            assert isinstance(route, Mount) and route.path == "/ui"  # static files, not API
    assert routes == {(method, path) for method, path, *_ in OPERATIONS}
    assert {(method, path) for path, item in document["paths"].items() for method in item} == routes
    for path, item in document["paths"].items():
        for operation in item.values():
            for response in operation["responses"].values():
                for media in response["content"].values():
                    reference = media["schema"].get("$ref")
                    if reference:
                        assert reference.rsplit("/", 1)[1] in document["components"]["schemas"], (path, reference)


def test_a_token_guards_every_api_route_but_the_ui(tmp_path, tiny_qwen3):
    write_topologies(tmp_path)
    token = "s3cret-token-of-enough-length"
    with live_server(tmp_path, tiny_pool(tiny_qwen3), token=token) as (url, _):
        with httpx.Client(base_url=url, timeout=30) as client:
            error = error_of(client.get("/runs"), 401)
            assert error["code"] == "E_AUTH"
            assert error_of(client.get("/runs", headers={"authorization": "Bearer wrong-token-of-some-length"}),
                            401)["code"] == "E_AUTH"
            assert client.get("/runs", headers={"authorization": f"Bearer {token}"}).status_code == 200
            assert client.get("/").status_code == 200 and client.get("/ui/app.css").status_code == 200
            assert client.get("/openapi.json").json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_binding_beyond_loopback_needs_a_token(tmp_path):
    with pytest.raises(ValueError, match="host: 0.0.0.0 accepts connections from other machines; .*--token"):
        ServerSettings(runs_dir=tmp_path / "runs", topologies_dir=tmp_path, host="0.0.0.0")
    with pytest.raises(ValueError, match="token: use at least 16 characters"):
        ServerSettings(runs_dir=tmp_path / "runs", topologies_dir=tmp_path, host="0.0.0.0", token="short")
    assert not ServerSettings(runs_dir=tmp_path / "runs", topologies_dir=tmp_path, host="0.0.0.0",
                              token="x" * 16).loopback
    assert ServerSettings(runs_dir=tmp_path / "runs", topologies_dir=tmp_path, host="::1").loopback


# issue 24 item 7: `POST /runs/{id}/cancel` with `Origin: http://evil.example` and no body was
# accepted (202) on a server without --token
@pytest.mark.parametrize("headers", [
    {"origin": "http://evil.example"},
    {"origin": "null"},
    {"origin": "http://127.0.0.1.evil.example"},
    {"origin": "http://127.0.0.1"},  # another port is another origin
    {"origin": "file://"},
    {"sec-fetch-site": "cross-site"},
    {"origin": "http://evil.example", "content-type": "application/json"},
])
def test_state_changing_requests_from_another_sites_page_are_refused(server, headers):
    client, _, _ = server
    run_id, _ = run_to_end(client)
    for path in (f"/runs/{run_id}/cancel", f"/runs/{run_id}/resume", f"/runs/{run_id}/answer", "/runs"):
        error = error_of(client.post(path, headers=headers), 403)
        assert error["code"] == "E_ORIGIN" and error["fix"]
    assert client.get(f"/runs/{run_id}", headers=headers).status_code == 200  # reading is not a forgery


# issue 24 item 7: the server's own page, and clients that are not browsers, still work
def test_the_servers_own_origin_and_clients_without_one_may_post(server):
    client, _, _ = server
    run_id, _ = run_to_end(client)
    own = {"origin": str(client.base_url).rstrip("/"), "sec-fetch-site": "same-origin"}
    alias = {"origin": str(client.base_url).rstrip("/").replace("127.0.0.1", "localhost")}  # a loopback name
    proxied = {"origin": str(client.base_url).rstrip("/").replace("http://", "https://")}  # behind a TLS proxy
    for headers in (own, alias, proxied, {}):
        assert error_of(client.post(f"/runs/{run_id}/cancel", headers=headers), 409)["code"] == "E_STATE"


# issue 24 item 6: a 100,000-deep JSON body gave 500 RecursionError (plain json.loads)
@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 70 + b"1" + b"}" * 70,
                                  b'{"topology": "pair", "topology": "pair"}'])
def test_bodies_that_break_json_limits_are_refused_with_400(server, body):
    client, _, _ = server
    error = error_of(client.post("/runs", content=body, headers={"content-type": "application/json"}), 400)
    assert error["code"] == "E_REQUEST" and "JSON limit" in error["message"] and error["fix"]


WAITING_YAML = PAIR_YAML.replace(
    '- {name: answer, agent: writer, output: true, prompt: "Question: {question} Answer:"}',
    '- {name: answer, agent: writer, output: true, prompt: "Question: {question} Notes: {answer} Answer:", '
    'interrupt: before, question: "Any notes?"}')


# issue 24 items 4 and 5: a 1.9 MB answer (under the body limit) was accepted with 202, then failed
# the run and every resume of it; a lone surrogate was accepted, then dropped with only a log line
@pytest.mark.parametrize("answer, words", [("x" * 1_900_000, "more than the 1048576 an answer may hold"),
                                           ("\ud800", "lone surrogate")])
def test_answers_a_run_cannot_carry_are_refused_before_it_changes(server, answer, words):
    client, _, _ = server
    assert WAITING_YAML != PAIR_YAML
    accepted = client.post("/runs", json={"yaml": WAITING_YAML, "inputs": PAIR_INPUTS})
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    with client.stream("GET", f"/runs/{run_id}/events") as response:
        assert read_sse(response)[-1]["data"]["status"] == "waiting"
    body = json.dumps({"answers": {"answer": answer}}).encode()  # json.dumps escapes the surrogate
    error = error_of(client.post(f"/runs/{run_id}/answer", content=body, headers={"content-type": "application/json"}), 422)
    assert error["code"] == "E_REQUEST" and words in error["message"] and "answers" in error["message"]
    assert client.get(f"/runs/{run_id}").json()["status"] == "waiting"  # nothing changed: still answerable
    assert client.post(f"/runs/{run_id}/answer", json={"answers": {"answer": "keep it short"}}).status_code == 202
    with client.stream("GET", f"/runs/{run_id}/events") as response:
        assert read_sse(response)[-1]["data"]["status"] == "finished"


# issue 24 item 10: a 5000-digit Last-Event-ID or ?limit=² got a 400 with Python's raw int() message
# (the docs say a value that is not a count means 0)
def test_counts_that_are_not_ascii_counts_are_handled_as_documented(server):
    client, _, _ = server
    run_id, full = run_to_end(client)
    for header in ("9" * 5000, "²", "١٢", "-1", "3x"):
        with client.stream("GET", f"/runs/{run_id}/events", headers={"last-event-id": header.encode()}) as response:
            assert response.status_code == 200
            assert [message["id"] for message in read_sse(response)] == [message["id"] for message in full]
    for limit in ("²", "9" * 5000, "-1"):
        error = error_of(client.get("/runs", params={"limit": limit}), 400)
        assert error["code"] == "E_REQUEST" and "is not a count (ASCII digits)" in error["message"]
        assert "invalid literal" not in error["message"] and len(error["message"]) < 200
    assert len(client.get("/runs", params={"limit": "1"}).json()["runs"]) == 1


# issue 24 item 10: runs started in the same second listed in random order
def test_run_ids_sort_in_the_order_runs_started():
    from rclc_graph.run import new_run_id

    ids = [new_run_id() for _ in range(200)]
    assert all(len(run_id) == 22 for run_id in ids)
    seconds = {}
    for run_id in ids:
        seconds.setdefault(run_id[:15], []).append(run_id)
    for same_second in seconds.values():
        fractions = [run_id[16:20] for run_id in same_second]
        assert fractions == sorted(fractions)  # later in the second: a later (or equal) id


NESTED_YAML = """\
version: 1
name: nested
description: the pair topology run as a subgraph node, then read by a checker
inputs:
  question: str
  document: str
models:
  - {name: base, source: embedded}
agents:
  - {name: checker, model: base, max_new_tokens: 4}
nodes:
  - name: pair
    graph:
""" + "".join(f"      {line}\n" for line in PAIR_YAML.splitlines()) + """\
  - {name: check, agent: checker, output: true, prompt: "Check: {question}"}
edges:
  - {source: pair, target: check, policy: {mode: state, ratio: 2}}
"""


def test_a_run_with_a_subgraph_serves_its_nested_nodes(server):
    """issue 27: a subgraph's nodes are named pair/read, pair/answer; the API serves each node's
    file by that path (encoded or not), and the drawing frames them."""
    client, _, _ = server
    run_id, messages = run_to_end(client, {"yaml": NESTED_YAML, "inputs": PAIR_INPUTS})
    assert messages[-1]["data"]["status"] == "finished", messages[-1]
    record = client.get(f"/runs/{run_id}").json()["record"]
    assert [node["scope"] for node in record["plan"]["nodes"]] == ["pair", "pair", ""]
    assert record["plan"]["subgraphs"][0]["returns"] == "pair/answer"
    for path in ("pair/answer", "pair%2Fanswer"):
        node = client.get(f"/runs/{run_id}/nodes/{path}")
        assert node.status_code == 200 and node.json()["node"] == "pair/answer", path
    assert client.get(f"/runs/{run_id}/nodes/pair/nothing").status_code == 404
    drawing = client.get(f"/runs/{run_id}/graph.svg").text
    assert 'data-scope="pair"' in drawing and 'data-node="pair/answer"' in drawing
