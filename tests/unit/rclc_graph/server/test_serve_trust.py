"""A server started without --trust-code imports no code, whoever started the run (issue 27):
a run started with trust_code carries its user's seal, so `rclc-graph resume` needs no
--trust-code for it, but the server still refuses to resume it unless it was started with
--trust-code itself."""

from __future__ import annotations

import httpx

from rclc_graph import plan_file, run_recorded_sync

from tests.helpers.servers import PAIR_INPUTS, PAIR_YAML, live_server, tiny_pool, wait_status, write_topologies

ASKING = PAIR_YAML.replace(
    '{name: answer, agent: writer, output: true, prompt: "Question: {question} Answer:"}',
    '{name: answer, agent: writer, output: true, prompt: "Question: {question} Notes: {answer}", '
    'interrupt: before}')


def test_an_untrusted_server_refuses_to_resume_a_trusted_run(tmp_path, tiny_qwen3):
    pool = tiny_pool(tiny_qwen3)
    folder = write_topologies(tmp_path)
    (folder / "ask.yaml").write_text(ASKING)
    plan = plan_file(folder / "ask.yaml", PAIR_INPUTS, trust_code=True)
    _, record, run_dir = run_recorded_sync(plan, tmp_path / "runs", pool=pool, base_dir=folder)
    assert record["status"] == "waiting" and record["plan"]["trust_seal"]
    with live_server(tmp_path, pool) as (url, _):
        refused = httpx.post(f"{url}/runs/{run_dir.name}/answer", json={"answers": {"answer": "short"}})
        assert refused.status_code == 422, refused.text
        assert "start the server with --trust-code" in refused.json()["error"]["fix"]
    with live_server(tmp_path, pool, trust_code=True) as (url, _):
        accepted = httpx.post(f"{url}/runs/{run_dir.name}/answer", json={"answers": {"answer": "short"}})
        assert accepted.status_code == 202, accepted.text
        with httpx.Client(base_url=url) as client:
            assert wait_status(client, run_dir.name, ("finished", "failed"))["status"] == "finished"
