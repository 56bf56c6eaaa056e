"""The server's runs over time (issue 15, item 2): bounded admission with 429 + Retry-After,
cancelling queued and running runs, resuming into the same event log, a server restarted
over the same directories, and the cap on open event streams."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from rclc_graph import read_record

from tests.helpers.holding import held_forwards, held_from_first_token
from tests.helpers.servers import PAIR_INPUTS, live_server, read_sse, tiny_pool, wait_status, write_topologies

START = {"topology": "pair", "inputs": PAIR_INPUTS}


@pytest.fixture
def slow(tiny_qwen3):
    """The tiny model with every forward taking 40 ms longer, so runs last long enough to
    watch (a decoder step of a real model takes that long on a CPU)."""
    model, tokenizer = tiny_qwen3
    handle = model.register_forward_pre_hook(lambda *_: time.sleep(0.04))
    yield model, tokenizer
    handle.remove()


def start(client, body=START):
    response = client.post("/runs", json=body)
    return response


def cancelled_at_first_hop(client, model) -> str:
    """A run started and cancelled once its first handoff was delivered (a resume has work
    left): its id, once the run is cancelled. The writer's forwards are held from its first
    token until the cancellation, so the run cannot finish first on any machine."""
    with held_from_first_token(model):
        run_id = start(client).json()["run_id"]
        with client.stream("GET", f"/runs/{run_id}/events") as response:
            for line in response.iter_lines():
                if line == "event: hop.delivered":
                    client.post(f"/runs/{run_id}/cancel")
                    break
        wait_status(client, run_id, ("cancelled",))
    return run_id


def with_error(client, run_id: str, detail: dict) -> dict:
    """The run's detail (from `detail` on) once a resume's background start has ended with an
    error, or after 60 s."""
    for _ in range(1200):
        if detail.get("error"):
            break
        threading.Event().wait(0.05)
        detail = client.get(f"/runs/{run_id}").json()
    return detail


def test_admission_runs_queues_then_refuses_with_retry_after(tmp_path, slow):
    write_topologies(tmp_path)
    with live_server(tmp_path, tiny_pool(slow), max_concurrent=1, max_queue=1) as (url, _), \
            held_forwards(slow[0]) as holding:
        with httpx.Client(base_url=url, timeout=60) as client:
            holding.set()  # the first run cannot finish (and free its slot) before the third is refused
            first, second, third = start(client), start(client), start(client)
            assert first.status_code == 202 and first.json()["status"] == "starting"
            assert second.status_code == 202 and second.json()["status"] == "queued"
            assert second.json()["position"] == 1
            assert third.status_code == 429 and third.json()["error"]["code"] == "E_BUSY"
            assert int(third.headers["retry-after"]) >= 1
            assert not (tmp_path / "runs" / ".serve" / "submissions" / f"{third.json().get('run_id')}.json").exists()
            holding.clear()
            for response in (first, second):
                wait_status(client, response.json()["run_id"], ("finished",))
            # a run finished, so Retry-After now comes from measured run times
            assert start(client).status_code == 202


def test_cancel_a_queued_and_a_running_run(tmp_path, slow):
    write_topologies(tmp_path)
    with live_server(tmp_path, tiny_pool(slow), max_concurrent=1) as (url, _), held_from_first_token(slow[0]):
        with httpx.Client(base_url=url, timeout=60) as client:  # the writer cannot finish before its cancel
            running = start(client).json()["run_id"]
            queued = start(client).json()["run_id"]
            assert client.post(f"/runs/{queued}/cancel").json() == {"run_id": queued, "status": "cancelled"}
            assert client.get(f"/runs/{queued}").json()["status"] == "cancelled"
            with client.stream("GET", f"/runs/{running}/events") as response:
                lines = response.iter_lines()
                for line in lines:  # cancel once the receiver is generating
                    if line == "event: token":
                        assert client.post(f"/runs/{running}/cancel").json()["status"] == "cancelling"
                        break
                messages = read_sse(lines)
            types = [message["event"] for message in messages]
            assert types[-2:] == ["run.cancelled", "end"] and messages[-1]["data"]["status"] == "cancelled"
            record = read_record(tmp_path / "runs" / running)
            assert record["status"] == "cancelled" and list(record["nodes"]) == ["read"]
            error = client.post(f"/runs/{running}/cancel").json()["error"]
            assert error["code"] == "E_STATE"


def test_a_resumed_run_appends_to_its_event_log_and_reproduces_the_run(tmp_path, slow):
    write_topologies(tmp_path)
    with live_server(tmp_path, tiny_pool(slow)) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as client:
            reference = start(client).json()["run_id"]
            wait_status(client, reference, ("finished",))
            stopped = cancelled_at_first_hop(client, slow[0])
            with client.stream("GET", f"/runs/{stopped}/events") as response:
                before = read_sse(response)[:-1]
            resumed = client.post(f"/runs/{stopped}/resume")
            assert resumed.status_code == 202 and resumed.json()["run_id"] == stopped
            with client.stream("GET", f"/runs/{stopped}/events", headers={"Last-Event-ID": before[-1]["id"]}) as response:
                after = read_sse(response)
            assert after[-1]["data"]["status"] == "finished"
            assert int(after[0]["id"]) == int(before[-1]["id"]) + 1
            assert after[0]["event"] == "run.started" and after[0]["data"]["resumed"] == 1
            outputs = [client.get(f"/runs/{run}").json()["record"]["outputs"] for run in (reference, stopped)]
            assert outputs[0] == outputs[1]
            assert client.post(f"/runs/{stopped}/resume").json()["error"]["code"] == "E_STATE"  # finished now


# issue 24 item 3: a resume sent at the same moment as another request returned 202, then failed
# only in the server log, leaving the run `interrupted` with no error in the API
def test_a_resume_that_fails_after_its_202_says_why_in_the_api(tmp_path, slow):
    from rclc_graph.run.directory_lock import DirectoryLock

    write_topologies(tmp_path)
    with live_server(tmp_path, tiny_pool(slow)) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as client:
            stopped = cancelled_at_first_hop(client, slow[0])
            held = DirectoryLock(tmp_path / "runs" / stopped)  # another writer appears after the checks
            held.acquire()
            try:
                assert client.post(f"/runs/{stopped}/resume").status_code == 202
                detail = with_error(client, stopped, wait_status(client, stopped, ("cancelled",)))
            finally:
                held.release()
            assert detail["status"] == "cancelled"
            assert detail["error"].startswith("resume failed: ") and "being written by another process" in detail["error"]
            listed = {run["run_id"]: run for run in client.get("/runs").json()["runs"]}
            assert listed[stopped]["error"] == detail["error"]
            resumed = client.post(f"/runs/{stopped}/resume")  # the next attempt starts: the error is gone
            assert resumed.status_code == 202
            assert wait_status(client, stopped, ("finished",)).get("error") is None


# issue 24 item 3: the failed attempt's error stayed the run's error after the run was resumed
# and finished by another process (`rclc-graph resume` on the same runs directory)
def test_a_failed_attempts_error_goes_once_the_run_is_resumed_elsewhere(tmp_path, slow):
    from rclc_graph import resume_run_sync
    from rclc_graph.run.directory_lock import DirectoryLock

    write_topologies(tmp_path)
    pool = tiny_pool(slow)
    with live_server(tmp_path, pool) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as client:
            stopped = cancelled_at_first_hop(client, slow[0])
            held = DirectoryLock(tmp_path / "runs" / stopped)  # the server's resume fails: another writer holds it
            held.acquire()
            try:
                assert client.post(f"/runs/{stopped}/resume").status_code == 202
                detail = with_error(client, stopped, client.get(f"/runs/{stopped}").json())
            finally:
                held.release()
            assert detail["error"].startswith("resume failed: ")
            result, _, _ = resume_run_sync(tmp_path / "runs" / stopped, pool=pool)  # the CLI's resume, elsewhere
            assert result.status == "finished"
            detail = client.get(f"/runs/{stopped}").json()
            assert detail["status"] == "finished" and detail["error"] is None
            listed = {run["run_id"]: run for run in client.get("/runs").json()["runs"]}
            assert listed[stopped]["status"] == "finished" and listed[stopped]["error"] is None


def test_a_restarted_server_lists_every_run_and_starts_what_was_queued(tmp_path, slow):
    write_topologies(tmp_path)
    pool = tiny_pool(slow)
    with held_forwards(slow[0]) as holding:
        with live_server(tmp_path, pool, max_concurrent=1) as (url, _):
            with httpx.Client(base_url=url, timeout=60) as client:
                done = start(client).json()["run_id"]
                wait_status(client, done, ("finished",))
                holding.set()  # the next run cannot finish before the server stops (no race with its end)
                running = start(client).json()["run_id"]
                queued = start(client).json()["run_id"]
                wait_status(client, running, ("running",))
        holding.clear()
    # the server stopped: the running run was cancelled (recorded), the queued one never started
    assert read_record(tmp_path / "runs" / running)["status"] == "cancelled"
    submission = json.loads((tmp_path / "runs" / ".serve" / "submissions" / f"{queued}.json").read_text())
    assert submission["status"] == "queued"
    with live_server(tmp_path, pool, max_concurrent=1) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as client:
            listed = {run["run_id"]: run["status"] for run in client.get("/runs").json()["runs"]}
            assert listed[done] == "finished" and listed[running] == "cancelled"
            assert listed[queued] in ("queued", "starting", "running", "finished")
            wait_status(client, queued, ("finished",))
            assert client.post(f"/runs/{running}/resume").status_code == 202
            wait_status(client, running, ("finished",))
    assert not (tmp_path / "runs" / ".serve" / "submissions" / f"{queued}.json").exists()


def test_open_event_streams_are_capped(tmp_path, slow):
    write_topologies(tmp_path)
    with live_server(tmp_path, tiny_pool(slow), max_streams=1) as (url, _), held_forwards(slow[0]) as holding:
        with httpx.Client(base_url=url, timeout=60) as client:
            holding.set()  # the run cannot end (closing the held stream) before the refusal
            run_id = start(client).json()["run_id"]
            opened = threading.Event()

            def hold():
                with httpx.Client(base_url=url, timeout=60) as other:
                    with other.stream("GET", f"/runs/{run_id}/events") as response:
                        opened.set()
                        read_sse(response)

            holder = threading.Thread(target=hold)
            holder.start()
            assert opened.wait(30)
            refused = client.get(f"/runs/{run_id}/events")
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "E_BUSY"
            holding.clear()
            holder.join(60)
            with client.stream("GET", f"/runs/{run_id}/events") as response:
                assert read_sse(response)[-1]["event"] == "end"
