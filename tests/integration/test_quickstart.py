"""The quickstart runs on the embedded model and prints what it promises."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.paths import ROOT



@pytest.mark.integration
def test_quickstart_prints_answer_positions_and_bytes():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    # issue 26: the first run a newcomer makes answers right (the documents' owner of Cedar)
    assert re.search(r"^answer: .*Alice Moreno", out, re.M), out
    kept = re.findall(r"sender (\d): kept (\d+)/(\d+) positions, (\d+) payload bytes", out)
    assert [k[0] for k in kept] == ["0", "1"]
    for _, selected, total, nbytes in kept:
        # r4 keeps ceil(T / 4) rows of 576 float32 values each, each with its int64 token ID.
        assert int(selected) == -(-int(total) // 4)
        assert int(nbytes) == int(selected) * (576 * 4 + 8)
    assert "kept positions: [0," in out
    # progress on stderr, flushed as each slow step starts (issue 27: a log saw nothing for 50 s)
    steps = [line for line in done.stderr.splitlines() if line.endswith("...") or "loaded in" in line]
    assert [step.split(" ")[0] for step in steps] == ["loading", "", "prefilling", "answering"], done.stderr
