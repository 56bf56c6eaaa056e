"""Every `python` block of docs/api.md runs, in order, as one notebook session on the embedded model."""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import tempfile

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.integration

GUIDE = ROOT / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_guide_blocks_are_found():
    blocks = BLOCK.findall(GUIDE.read_text(encoding="utf-8"))
    assert len(blocks) >= 10


def test_guide_snippets_run(embedded, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    blocks = BLOCK.findall(GUIDE.read_text(encoding="utf-8"))
    namespace: dict[str, object] = {"__name__": "guide"}

    async def session():
        for number, source in enumerate(blocks, start=1):
            code = compile(source, f"docs/api.md block {number}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            result = eval(code, namespace)  # noqa: S307 - our own documentation, run as a notebook would
            if inspect.iscoroutine(result):
                await result

    asyncio.run(session())
    agent_y, restored = namespace["agent_y"], namespace["restored"]
    assert restored.inspect()["state_source"] == "retained"
    assert "<mark" in namespace["html"] and namespace["report"]["scope"] == "bound_agent"
    assert len(agent_y) == 3
