"""results.jsonl: append-only rows, resume, torn last line recovery, damage and locking."""

from __future__ import annotations

import json
import os

import pytest

from rclc_graph.experiments.store import RESULTS, ResultStore, StoreError, read_rows


def _row(case: str, arm: str, **extra) -> dict:
    return {"case": case, "arm": arm, "status": "finished", "answer": "x", **extra}


def test_append_and_reopen(tmp_path):
    with ResultStore(tmp_path / "out") as store:
        assert len(store) == 0 and store.recovered_bytes == 0
        store.append(_row("c1", "r4"))
        store.append(_row("c1", "text"))
        store.append(_row("c1", "r4", answer="newer"))
    text = (tmp_path / "out" / RESULTS).read_text()
    assert text.count("\n") == 3 and text.endswith("\n")
    with ResultStore(tmp_path / "out") as store:
        assert len(store) == 3
        latest = store.latest()
        assert set(latest) == {("c1", "r4"), ("c1", "text")} and latest[("c1", "r4")]["answer"] == "newer"
        rows = store.rows()
        rows[0]["answer"] = "changed"
        assert store.rows()[0]["answer"] == "x"  # copies
    assert [row["answer"] for row in read_rows(tmp_path / "out")] == ["x", "x", "newer"]


def test_torn_last_line_is_dropped_and_the_next_row_starts_clean(tmp_path):
    with ResultStore(tmp_path) as store:
        store.append(_row("c1", "a"))
        store.append(_row("c2", "a"))
    path = tmp_path / RESULTS
    whole = path.read_bytes()
    torn = whole[: len(whole) - 15]  # a crash in the middle of writing the second row
    path.write_bytes(torn)
    assert [row["case"] for row in read_rows(tmp_path)] == ["c1"]  # readers skip it without repairing
    assert path.read_bytes() == torn
    with ResultStore(tmp_path) as store:
        assert store.recovered_bytes == len(torn) - torn.rfind(b"\n") - 1
        assert list(store.latest()) == [("c1", "a")]
        store.append(_row("c2", "a", answer="again"))
    lines = path.read_text().splitlines()
    assert [json.loads(line)["case"] for line in lines] == ["c1", "c2"]


def test_complete_last_row_without_newline_is_kept(tmp_path):
    path = tmp_path / RESULTS
    path.write_text(json.dumps(_row("c1", "a")) + "\n" + json.dumps(_row("c2", "a")))
    with ResultStore(tmp_path) as store:
        assert store.recovered_bytes == 0 and len(store) == 2
        store.append(_row("c3", "a"))
    assert [json.loads(line)["case"] for line in path.read_text().splitlines()] == ["c1", "c2", "c3"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"case": "c1", "arm": "a"}\nnot json\n{"case": "c2", "arm": "a"}\n', ":2: not a JSON row"),
        ('[1, 2]\n', ":1: expected a JSON object"),
        ('{"case": "c1"}\n', "field 'arm'"),
        ('{"case": "", "arm": "a"}\n', "field 'case'"),
    ],
)
def test_damaged_lines_are_errors_not_skipped(tmp_path, content, message):
    (tmp_path / RESULTS).write_text(content)
    with pytest.raises(StoreError, match=message):
        ResultStore(tmp_path)
    ResultStore(tmp_path / "other").close()  # a failed open released its lock


def test_append_checks_rows_and_the_store_is_locked(tmp_path):
    with ResultStore(tmp_path) as store:
        with pytest.raises(StoreError, match="case"):
            store.append({"arm": "a"})
        with pytest.raises(ValueError):
            store.append({"case": "c", "arm": "a", "latency_s": float("nan")})
        assert len(store) == 0
        with pytest.raises(StoreError, match="another experiment"):
            ResultStore(tmp_path)
    with ResultStore(tmp_path):  # released on close
        pass
    with pytest.raises(StoreError, match="no results file"):
        read_rows(tmp_path / "nowhere")


# issue 16 item 17: `--out` problems (a dangling link read as "File exists") were OSError tracebacks;
# issue 16 item 12's rule for the store's own file: a FIFO in place of results.jsonl would block forever
def test_unusable_out_directories_and_non_regular_results_are_refused(tmp_path):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(StoreError, match="symbolic link to .*which does not exist"):
        ResultStore(dangling)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(StoreError, match="is a file, not a directory"):
        ResultStore(afile)
    with pytest.raises(StoreError, match="cannot be created"):
        ResultStore(afile / "sub")
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / RESULTS)
    with pytest.raises(ValueError, match="is a FIFO"):
        ResultStore(fifo_dir)
    ResultStore(fifo_dir / "other").close()  # the refused open released its lock
