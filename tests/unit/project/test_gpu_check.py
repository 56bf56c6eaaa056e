"""The GPU check script (issue 28) runs on the CPU against itself, so it cannot rot before a
CUDA machine runs it: every check agrees and the report holds what docs/performance.md reads."""

from __future__ import annotations

import json

from tests.helpers.benchmarks import load_benchmark


def test_the_gpu_check_agrees_with_itself_on_the_cpu(tmp_path):
    module = load_benchmark("gpu_check")
    out = tmp_path / "gpu_check.json"
    assert module.main(["--device", "cpu", "--quick", "--families", "qwen3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    checks = report["checks"]["qwen3"]
    assert set(checks) == {"kept_positions", "delivered_rows", "snapshot_round_trip", "batched_greedy_tokens"}
    assert report["agree"] and all(check["agree"] for check in checks.values())
    assert set(report["timings"]["qwen3"]) == {"decode_tokens_per_second", "selection"}
