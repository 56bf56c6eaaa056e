"""Run directories: record contents, node files, read_record and finished_nodes (atomic writes: test_files.py)."""

from __future__ import annotations

import os

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rclc_graph import ModelSpec, ModelPool, LocalExecutor, load_graph_text, compile_plan, run_plan
from rclc_graph.run.record import RECORD_FILE, finished_nodes, read_node, read_record, safe_name
from rclc_graph.run import RecordingExecutor, run_recorded, run_recorded_sync
from rclc_graph.run import RunRecorder

from tests.helpers.graph_runs import CHAIN_INPUTS, CHAIN_YAML, FakeExecutor, cancelled_once_started


def chain_plan():
    return compile_plan(load_graph_text(CHAIN_YAML), CHAIN_INPUTS)


async def _recorded_run(tmp_path, executor, *, pool=None, run_id="r1"):
    plan = chain_plan()
    recorder = RunRecorder(tmp_path, plan, run_id=run_id, seed=5, topology_file="small.yaml", pool=pool)
    recorder.start()
    result = await run_plan(plan, executor=RecordingExecutor(executor, recorder), run_id=run_id, seed=5)
    return recorder, result, recorder.finish(result)


# -- small pieces ------------------------------------------------------------------------------


def test_safe_name_examples():
    assert safe_name("reader") == "reader"
    assert safe_name("worker[2]") == "worker.2"
    assert safe_name("a@3") == "a.r3"
    assert safe_name("worker[2]@3") == "worker.2.r3"
    assert safe_name("../etc/passwd").startswith(".x") and "/" not in safe_name("../etc/passwd")


names = st.builds(
    lambda base, index, round_: base + ("" if index is None else f"[{index}]") + ("" if round_ is None else f"@{round_}"),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True),
    st.none() | st.integers(0, 200),
    st.none() | st.integers(1, 40),
)


@given(st.lists(names | st.text(max_size=6), min_size=2, max_size=6, unique=True))
def test_safe_name_is_injective_and_path_free(values):
    encoded = [safe_name(value) for value in values]
    assert len(set(encoded)) == len(values)
    for name in encoded:
        assert "/" not in name and "\\" not in name and name not in ("", ".", "..")
        assert all(char.isalnum() or char in "._-" for char in name)


# -- records from a fake run -------------------------------------------------------------------


def test_record_of_a_finished_run(tmp_path):
    recorder, result, record = anyio.run(_recorded_run, tmp_path, FakeExecutor())
    run_dir = tmp_path / "r1"
    assert recorder.run_dir == run_dir
    assert record == read_record(run_dir)
    assert record["status"] == "finished" and record["error"] is None
    assert record["outputs"] == result.outputs and set(record["outputs"]) == {"final"}
    assert record["inputs"] == {"question": CHAIN_INPUTS["question"], "chunks": CHAIN_INPUTS["chunks"]}
    assert record["plan"]["fingerprint"] == chain_plan().fingerprint()
    assert record["topology"]["file"] == "small.yaml"
    assert record["topology"]["spec"]["name"] == "small_chain"
    assert record["seeds"]["run"] == 5 and set(record["seeds"]["nodes"]) == {"final"}
    assert set(record["versions"]) >= {"rclc", "torch", "transformers", "python"}
    assert record["models"][0]["name"] == "base" and record["models"][0]["fingerprint"] is None  # no pool given
    assert [hop["target"] for hop in record["hops"]] == ["reader_2", "final"]
    assert record["hops"][1]["kept_by_origin"] == result.hops[1].kept_by_origin
    assert record["lineage"]["final"] == result.nodes["final"].lineage.summary()
    assert record["unfinished"] == []
    assert set(record["timings"]["nodes"]) == {"reader_1", "reader_2", "final"}
    # node files: one JSON per node, no snapshot (the fake executor has no agents)
    for name in ("reader_1", "reader_2", "final"):
        node, snapshot = read_node(run_dir / "nodes" / f"{safe_name(name)}.json")
        assert node.to_dict() == result.nodes[name].to_dict()
        assert snapshot is None
    assert finished_nodes(run_dir) == {}  # without snapshots nothing counts as finished on disk
    assert (run_dir / "report.html").is_file()
    assert not [name for name in os.listdir(run_dir) if name.endswith(".tmp")]


def test_a_running_record_exists_from_the_start(tmp_path):
    plan = chain_plan()
    recorder = RunRecorder(tmp_path, plan, run_id="r2")
    recorder.start()
    record = read_record(tmp_path / "r2")
    assert record["status"] == "running" and record["nodes"] == {} and len(record["unfinished"]) == 3
    with pytest.raises(ValueError, match="already exists"):
        RunRecorder(tmp_path, plan, run_id="r2").start()


def test_failed_and_cancelled_runs_are_recorded(tmp_path):
    _, result, record = anyio.run(_recorded_run, tmp_path, FakeExecutor(fail="reader_2"))
    assert record["status"] == "failed" and record["failed_node"] == "reader_2"
    assert "reader_2" in record["error"] and record["unfinished"] == ["reader_2", "final"]

    async def cancelled():
        plan = chain_plan()
        recorder = RunRecorder(tmp_path, plan, run_id="c1")
        recorder.start()
        await cancelled_once_started("final", lambda events: run_plan(
            plan, executor=RecordingExecutor(FakeExecutor(hang="final"), recorder), run_id="c1", events=events))
        return recorder.finish(recorder.partial_result("cancelled", "stopped"))

    record = anyio.run(cancelled)
    assert record["status"] == "cancelled" and sorted(record["nodes"]) == ["reader_1", "reader_2"]
    assert record["unfinished"] == ["final"] and record["outputs"] == {}


@pytest.mark.parametrize(
    "content, message",
    [(None, "holds no record.json"), ("{not json", "not valid JSON"), ('{"format": "other"}', "not an rclc-graph"),
     ('{"format": "rclc-graph-run", "version": 99}', "version 99")],
)
def test_read_record_refuses_what_is_not_a_record(tmp_path, content, message):
    if content is not None:
        (tmp_path / RECORD_FILE).write_text(content)
    with pytest.raises(ValueError, match=message):
        read_record(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        read_record(tmp_path / "missing")


# -- real snapshots on a tiny model ------------------------------------------------------------


def test_snapshots_make_nodes_finished_on_disk(tmp_path, tiny_llama):
    model, tokenizer = tiny_llama
    pool = ModelPool()
    pool.add(ModelSpec(name="base", source="embedded"), model, tokenizer)
    recorder, result, record = anyio.run(
        lambda: _recorded_run(tmp_path, LocalExecutor(pool), pool=pool, run_id="t1")
    )
    assert record["status"] == "finished", record["error"]
    run_dir = tmp_path / "t1"
    on_disk = finished_nodes(run_dir)
    assert sorted(on_disk) == ["final", "reader_1", "reader_2"]
    assert on_disk["final"].to_dict() == result.nodes["final"].to_dict()
    fingerprint = pool.loaded()[0].fingerprint
    assert record["models"][0]["fingerprint"] == fingerprint
    for name, node in record["nodes"].items():
        assert node["snapshot"]["model_identity"] == fingerprint
        assert node["snapshot"]["positions"] == result.nodes[name].positions
    # a snapshot that no longer matches its JSON, or a missing JSON, is not finished
    with open(run_dir / "nodes" / "reader_2.safetensors", "ab") as handle:
        handle.write(b"\0")
    (run_dir / "nodes" / "final.json").unlink()
    assert sorted(finished_nodes(run_dir)) == ["reader_1"]


def test_run_recorded_returns_the_record_and_records_a_cancellation(tmp_path):
    result, record, run_dir = run_recorded_sync(chain_plan(), tmp_path, executor=FakeExecutor(), run_id="s1", seed=2)
    assert run_dir == tmp_path / "s1" and record == read_record(run_dir)
    assert record["status"] == result.status == "finished" and record["seeds"]["run"] == 2

    async def cancelled():
        return await cancelled_once_started("final", lambda events: run_recorded(
            chain_plan(), tmp_path, executor=FakeExecutor(hang="final"), run_id="s2", events=events))

    assert anyio.run(cancelled)  # the cancellation propagated out of run_recorded
    record = read_record(tmp_path / "s2")
    assert record["status"] == "cancelled" and sorted(record["nodes"]) == ["reader_1", "reader_2"]
    assert (tmp_path / "s2" / "report.html").is_file()
