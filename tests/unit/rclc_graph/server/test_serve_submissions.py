"""What a restarted server makes of the submissions an earlier one left (server/submissions.py):
queued ones are planned again oldest first, one whose run had started is dropped (its run
directory speaks for it), one that no longer plans is marked failed with the reason, and a
damaged file is skipped; trust_code needs both the submission and the new server."""

from __future__ import annotations

import json

import yaml

from rclc_graph.server.submissions import SubmissionStore

from tests.helpers.servers import PAIR_INPUTS, PAIR_YAML

SPEC = yaml.safe_load(PAIR_YAML)
INPUTS = PAIR_INPUTS


def write(store: SubmissionStore, run_id: str, **fields) -> None:
    data = {"run_id": run_id, "kind": "new", "status": "queued", "error": None, "submitted_at": 0.0,
            "graph": "pair", "topology": "pair", "topology_file": None, "base_dir": None, "spec": SPEC,
            "inputs": INPUTS, "trust_code": False, "seed": 0, **fields}
    store.path(run_id).write_text(json.dumps(data), encoding="utf-8")


def test_pending_plans_queued_submissions_oldest_first_and_settles_the_rest(tmp_path):
    runs = tmp_path / "runs"
    store = SubmissionStore(runs / ".serve" / "submissions")
    store.directory.mkdir(parents=True)
    write(store, "late", submitted_at=2.0, seed=7)
    write(store, "early", submitted_at=1.0, trust_code=True)
    write(store, "started")
    (runs / "started").mkdir()
    (runs / "started" / "record.json").write_text("{}", encoding="utf-8")
    write(store, "broken", spec={**SPEC, "nodes": [{**SPEC["nodes"][0], "agent": "nobody"}, SPEC["nodes"][1]]})
    write(store, "cancelled", status="cancelled")
    store.path("damaged").write_text("{not json", encoding="utf-8")

    pending = store.pending(runs, trust_code=False)

    assert [(item.run_id, item.seed) for item in pending] == [("early", 0), ("late", 7)]
    assert all(item.kind == "new" and item.plan is not None and item.plan.name == "pair" for item in pending)
    assert not pending[0].plan.trust_code  # the submission asked for it, this server does not grant it
    assert not store.path("started").exists()
    broken = store.read("broken")
    assert broken["status"] == "failed" and "no longer plans" in broken["error"] and "nobody" in broken["error"]
    assert store.read("cancelled")["status"] == "cancelled" and store.read("damaged") is None
    assert store.run_ids() == {"late", "early", "broken", "cancelled", "damaged"}
    # a server started with --trust-code grants it to the submission that had it only
    assert [item.plan.trust_code for item in store.pending(runs, trust_code=True)] == [True, False]
