"""Every `python` block of docs/vllm.md runs, in order, as one session on the embedded model.

The guide's YAML topology (the block starting `# vllm_pair.yaml`) is written to a scratch
directory first, because a later block plans and runs it from there.
"""

from __future__ import annotations

import contextlib
import re

import pytest

from rclc.vllm.capture import registry
from tests.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

GUIDE = ROOT / "docs" / "vllm.md"
PYTHON = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
YAML = re.compile(r"^```yaml\n(# (\S+\.yaml)\n.*?)^```", re.DOTALL | re.MULTILINE)


def test_guide_blocks_are_found():
    text = GUIDE.read_text(encoding="utf-8")
    assert len(PYTHON.findall(text)) >= 6
    assert [name for _, name in YAML.findall(text)] == ["vllm_pair.yaml"]


def _shutdown(namespace: dict) -> None:
    """Stop whatever engines the guide left running if a block failed half-way."""
    from rclc_graph.executors.vllm_engine import shutdown

    llm = namespace.get("llm")
    if llm is not None:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
    pool = namespace.get("pool")
    for loaded in pool.loaded() if pool is not None else []:
        if loaded.key.backend == "vllm":
            with contextlib.suppress(Exception):
                shutdown(loaded)


def test_guide_snippets_run(tmp_path, monkeypatch):
    text = GUIDE.read_text(encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for source, name in YAML.findall(text):
        (tmp_path / name).write_text(source, encoding="utf-8")
    namespace: dict[str, object] = {"__name__": "guide"}
    try:
        for number, source in enumerate(PYTHON.findall(text), start=1):
            code = compile(source, f"docs/vllm.md python block {number}", "exec")
            exec(code, namespace)  # noqa: S102 - our own documentation, run as a reader would
    finally:
        _shutdown(namespace)
    report, result = namespace["report"], namespace["result"]
    assert report["ok"] and report["engine"]["kv_connector"] == "RCLCCaptureConnector"
    assert result.status == "finished" and result.outputs
    writer = namespace["writer"]
    assert not writer.inspect()["pending_generation"] and len(writer) == 0
    assert len(namespace["agent"]) == 1  # the handoff from the hand-made capture
    assert registry.entries() == {}
