"""examples/existing_agents.py runs as a user runs it and prints a consistent story."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.integration



def test_existing_agents_example_runs(embedded):
    # The fixture converts the embedded model once; the script then loads it from the cache.
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "existing_agents.py")],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=environment, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    out = completed.stdout
    head, _, tail = out.partition("inspect():\n")
    reports = json.loads(tail)
    lines = head.splitlines()
    first = next(line for line in lines if line.startswith("researcher -> analyst:"))
    back = next(line for line in lines if line.startswith("analyst -> researcher:"))
    sent_forward = int(first.split(":")[1].split()[0])
    sent_back = int(back.split(":")[1].split()[0])
    assert any(line.startswith("analyst answers: '") and len(line) > len("analyst answers: ''") for line in lines)
    assert any(line.startswith("analyst after the tool result: ") for line in lines)
    assert any(line.startswith("researcher replies: ") for line in lines)
    assert "restored analyst generates the same tokens: True" in out

    analyst, restored, researcher = reports["analyst"], reports["restored"], reports["researcher"]
    assert analyst == restored, "the restored agent holds what the original holds"
    assert analyst["inherited_positions"] == sent_forward, "the first handoff is the analyst's inherited prefix"
    assert researcher["inherited_positions"] == sent_back
    assert sent_forward < sent_back, "the continuation carries inherited rows plus compressed new rows"
    for report in reports.values():
        assert report["state_source"] == "retained" and not report["pending_generation"]
        assert report["queued_requests"] == 0 and report["deliveries"] == []
        assert report["cached_positions"] > report["inherited_positions"]
