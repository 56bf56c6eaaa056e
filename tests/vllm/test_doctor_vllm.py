"""`rclc.check` and `python -m rclc doctor --backend vllm` in the real vLLM environment.

The unit tests fake the installed distributions; here the tested build itself must pass,
and a wrong multiprocessing setting must still be reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rclc.vllm.capture.engine_checks import TESTED_VLLM
from rclc.doctor import check
from tests.paths import ROOT

pytestmark = pytest.mark.vllm



def test_tested_environment_passes(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    report = check(backend="vllm")
    assert report["ok"], report["issues"]
    assert report["versions"]["vllm"].split("+")[0] in TESTED_VLLM
    assert report["scope"] == "environment" and "engine" not in report


def test_doctor_cli_reports_the_multiprocessing_setting():
    environment = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CONFIGURE_LOGGING="0")
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "rclc", "doctor", "--backend", "vllm"],
        capture_output=True, text=True, env=environment, cwd=ROOT, timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert not report["ok"] and report["backend"] == "vllm"
    problems = [issue["problem"] for issue in report["issues"]]
    assert problems == ["VLLM_ENABLE_V1_MULTIPROCESSING is '1'; capture needs the engine in this process"]
    assert report["issues"][0]["fix"] == "export VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vllm"
