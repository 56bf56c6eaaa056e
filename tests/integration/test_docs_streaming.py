"""Every `python` block of docs/streaming.md runs, in order, as one notebook session (inside a
running asyncio loop, as Jupyter runs cells) on the embedded model."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import shutil

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.integration

GUIDE = ROOT / "docs" / "streaming.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_streaming_guide_blocks_run(embedded, tmp_path, monkeypatch, capsys):
    for folder in ("topologies", "agents"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    shutil.copytree(ROOT / "examples" / "inputs", tmp_path / "examples" / "inputs")
    monkeypatch.chdir(tmp_path)
    blocks = BLOCK.findall(GUIDE.read_text(encoding="utf-8"))
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "guide"}

    async def session():
        for number, source in enumerate(blocks, start=1):
            code = compile(source, f"docs/streaming.md block {number}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(code, namespace)  # noqa: S307 - our own documentation, run as a notebook would
            if inspect.iscoroutine(result):
                await result

    asyncio.run(session())
    printed = capsys.readouterr().out
    assert "reader[0] -> final: kept" in printed and "answer:" in printed
    assert namespace["stopped"]["status"] == "cancelled"
    assert namespace["events"].record["status"] == "finished"
    assert namespace["stats"].high_water_events <= 4
    # people in the loop while streaming (issue 27): waits, answered with answers=, streamed to the end
    assert "approve asks: Refund" in printed and "finished {'approve': 'refunded'}" in printed
    assert "Refund {\"order\":\"B-2\",\"refund\":40.0}? (yes/no) -> refused" in printed
