"""One status vocabulary (issue 27): the web UI names a run's status with exactly the words
the API uses (server/schemas.py RunStatus), in the run list and the run view alike."""

from __future__ import annotations

import re
from typing import get_args

from rclc_graph.server.schemas import RunStatus

from tests.paths import ROOT

UI = ROOT / "rclc_graph" / "server" / "ui"


def test_the_ui_knows_every_run_status_and_no_other():
    script = (UI / "app.js").read_text(encoding="utf-8")
    table = re.search(r"const RUN_STATUS = \{(.*?)\n\};", script, re.S).group(1)
    names = re.findall(r"^\s+(\w+):", table, re.M)
    assert len(names) == len(set(names)) and set(names) == set(get_args(RunStatus))
    # both places paint their badge through the same function
    assert script.count("paintBadge(") >= 3 and 'class: "badge " + run.status' not in script
