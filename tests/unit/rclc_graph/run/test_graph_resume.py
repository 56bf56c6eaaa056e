"""Crash and resume in-process (issue 6, item 1): every state a crash can leave in a run
directory of a six-node graph, resumed; outputs, lineage, hops and snapshots bit-identical to
the uninterrupted run, and no finished node recomputed (forwards counted per node). Plus the
refusals: a resume that could not reproduce the run changes nothing on disk.

The subprocess SIGKILL variant is tests/integration/test_crash_resume.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from rclc import testing
from rclc_graph import ModelPool, plan_file, read_resume_point, resume_run_sync, run_recorded_sync
from rclc_graph.run.directory_lock import DirectoryLock
from rclc_graph.run.record import RECORD_FILE
from rclc_graph.errors import ResumeError
from rclc_graph.testing import FakeExecutor

from tests.helpers.reliability import (
    SIX_INPUTS,
    CountingExecutor,
    ForwardCounter,
    assert_same_runs,
    crash_copy,
    finished_sets,
    save_tiny,
    write_six,
)

OUTSIDE = "(outside nodes)"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the six-node graph, with forwards counted per node."""
    directory = tmp_path_factory.mktemp("six")
    source = save_tiny(directory / "tiny")
    topology, _ = write_six(directory, source)
    plan = plan_file(topology, SIX_INPUTS)
    pool = ModelPool()
    loaded = pool.get(plan.models()[0], topology.parent)
    with ForwardCounter(loaded.model) as counter:
        result, record, run_dir = run_recorded_sync(plan, directory / "runs", pool=pool, executor=CountingExecutor(pool),
                                                    base_dir=topology.parent)
    assert result.status == "finished", result.error
    return {"plan": plan, "pool": pool, "model": loaded.model, "run_dir": run_dir, "counts": dict(counter.counts),
            "record": record}


def resume_counted(reference, run_dir, **options):
    with ForwardCounter(reference["model"]) as counter:
        result, record, _ = resume_run_sync(run_dir, pool=reference["pool"],
                                            executor=CountingExecutor(reference["pool"]), **options)
    return result, record, dict(counter.counts)


def digest_tree(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def test_every_node_does_model_work(reference):
    assert set(reference["counts"]) == {"a", "b", "c", "d", "e", "final"}


@pytest.mark.parametrize("finished", finished_sets(), ids=lambda s: "+".join(sorted(s)) or "nothing")
def test_resume_after_a_crash_reproduces_the_run(reference, tmp_path, finished):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "crashed", finished)
    point = read_resume_point(run_dir)
    assert set(point.finished) == finished
    result, record, counts = resume_counted(reference, run_dir)
    assert result.status == "finished", result.error
    assert_same_runs(reference["run_dir"], run_dir)
    remaining = [name for name in reference["plan"].order if name not in finished]
    attempt = record["attempts"][-1]
    assert sorted(attempt["ran"]) == sorted(remaining) and attempt["reused"] == sorted(finished, key=point.plan.order.index)
    assert record["attempts"][0]["status"] == "crashed" and len(record["attempts"]) == 2
    # Finished nodes do no model work; the rest do exactly what they did uninterrupted; the only
    # other forwards are one prefill per restored agent (a sender an unfinished node reads).
    for name in reference["plan"].order:
        assert counts.get(name, 0) == (0 if name in finished else reference["counts"][name]), name
    assert counts.get(OUTSIDE, 0) == len(point.restore)
    assert set(point.restore) == {name for name in finished
                                  if any(e.target not in finished and e.policy.mode != "text"
                                         for e in point.plan.outgoing(name))}


def test_a_snapshot_without_its_node_file_is_a_node_that_runs_again(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "torn", frozenset({"a", "b"}), orphan="d")
    assert set(read_resume_point(run_dir).finished) == {"a", "b"}
    result, record, counts = resume_counted(reference, run_dir)
    assert result.status == "finished"
    assert counts["d"] == reference["counts"]["d"]
    assert_same_runs(reference["run_dir"], run_dir)


def test_resume_run_sync_works_inside_a_running_event_loop(reference, tmp_path):
    # issue 15 item 1: a notebook cell runs inside asyncio; the sync twin gets a loop of its own
    run_dir = crash_copy(reference["run_dir"], tmp_path / "in-loop", frozenset({"a", "b"}))

    async def cell():
        return resume_counted(reference, run_dir)

    result, record, _ = asyncio.run(cell())
    assert result.status == "finished", result.error
    assert_same_runs(reference["run_dir"], run_dir)


def test_resuming_a_finished_run_runs_nothing(reference, tmp_path):
    run_dir = tmp_path / "done"
    shutil.copytree(reference["run_dir"], run_dir)
    result, record, counts = resume_counted(reference, run_dir)
    assert result.status == "finished" and record["outputs"] == reference["record"]["outputs"]
    assert sum(counts.values()) == 0 and record["attempts"][-1]["ran"] == []


# -- refusals: nothing on disk changes ---------------------------------------------------------


def _edit_record(run_dir: Path, edit) -> None:
    record = json.loads((run_dir / RECORD_FILE).read_text())
    edit(record)
    (run_dir / RECORD_FILE).write_text(json.dumps(record))


def _rewrite_snapshot(path: Path, *, tensors=None, header_edit=None) -> None:
    with safetensors.safe_open(str(path), framework="pt") as reader:
        metadata = dict(reader.metadata())
        loaded = {key: reader.get_tensor(key) for key in reader.keys()}
    if header_edit is not None:
        header = json.loads(metadata["rclc"])
        header_edit(header)
        metadata["rclc"] = json.dumps(header)
    safetensors.torch.save_file(tensors(loaded) if tensors else loaded, str(path), metadata=metadata)


def _rehash(run_dir: Path, node: str, **changes) -> None:
    """Make node's JSON name its (edited) snapshot's SHA-256, as a careful editor would."""
    path = run_dir / "nodes" / f"{node}.json"
    data = json.loads(path.read_text())
    data["snapshot"]["sha256"] = hashlib.sha256((run_dir / "nodes" / f"{node}.safetensors").read_bytes()).hexdigest()
    data["snapshot"].update(changes)
    path.write_text(json.dumps(data))


def _other_model_snapshot(run_dir: Path, node: str, tmp_path: Path) -> None:
    import anyio

    import rclc

    other, tokenizer = testing.tiny_model("qwen3", seed=1)
    with safetensors.safe_open(str(run_dir / "nodes" / f"{node}.safetensors"), framework="pt") as reader:
        ids = reader.get_tensor("ids")
    agent = rclc.bind(other, tokenizer)
    agent.update(ids.unsqueeze(0))
    anyio.run(agent.save, run_dir / "nodes" / f"{node}.safetensors")


REFUSALS = {
    "edited inputs": (lambda d, t: _edit_record(d, lambda r: r["inputs"].update(question="another question")),
                      "fingerprint"),
    "other code": (lambda d, t: _edit_record(d, lambda r: r["code"].update(fingerprint="0" * 64)), "source changed"),
    "other torch": (lambda d, t: _edit_record(d, lambda r: r["versions"].update(torch="1.0")), "torch 1.0"),
    "truncated snapshot": (lambda d, t: (d / "nodes" / "a.safetensors").write_bytes(
        (d / "nodes" / "a.safetensors").read_bytes()[:200]), "SHA-256"),
    "missing snapshot": (lambda d, t: (d / "nodes" / "b.safetensors").unlink(), "missing"),
    "truncated and rehashed": (lambda d, t: ((d / "nodes" / "a.safetensors").write_bytes(
        (d / "nodes" / "a.safetensors").read_bytes()[:300]), _rehash(d, "a")), "cannot be restored"),
    "edited rows": (lambda d, t: (_rewrite_snapshot(d / "nodes" / "b.safetensors",
                                                    tensors=lambda x: {**x, "rows": x["rows"] + 1e-3}),
                                  _rehash(d, "b")), "cannot be restored"),
    "other layout": (lambda d, t: (_rewrite_snapshot(d / "nodes" / "a.safetensors",
                                                     header_edit=lambda h: h.update(layout=2)),
                                   _rehash(d, "a")), "layout 2"),
    "other model, named": (lambda d, t: (_other_model_snapshot(d, "b", t), _rehash(d, "b", model_identity="f" * 64)),
                           "another model"),
    "other model, hidden": (lambda d, t: (_other_model_snapshot(d, "b", t), _rehash(d, "b")), "different model"),
    "node of another run": (lambda d, t: (d / "nodes" / "a.json").write_text(
        (d / "nodes" / "a.json").read_text().replace(d.name, "someone-else")), "belongs to run"),
    "damaged node file": (lambda d, t: (d / "nodes" / "b.json").write_text("{not json"), "damaged"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_resumes_change_nothing(reference, tmp_path, case):
    run_dir = crash_copy(reference["run_dir"], tmp_path / reference["run_dir"].name, frozenset({"a", "b"}))
    damage, message = REFUSALS[case]
    damage(run_dir, tmp_path)
    before = digest_tree(run_dir)
    with pytest.raises(ResumeError, match=message):
        resume_counted(reference, run_dir)
    assert digest_tree(run_dir) == before
    lock = DirectoryLock(run_dir)
    lock.acquire()  # a refusal leaves the directory unlocked
    lock.release()


def test_an_executor_that_keeps_no_state_is_refused_and_changes_nothing(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "crashed", frozenset({"a", "b"}))
    before = digest_tree(run_dir)
    with pytest.raises(ResumeError, match="'fake' cannot adopt restored agents"):
        resume_run_sync(run_dir, pool=reference["pool"], executor=FakeExecutor())
    assert digest_tree(run_dir) == before
    lock = DirectoryLock(run_dir)
    lock.acquire()  # the refusal left the directory unlocked
    lock.release()


def test_a_different_model_is_refused(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "crashed", frozenset({"a"}))
    pool = ModelPool()
    other, tokenizer = testing.tiny_model("qwen3", seed=1)
    plan = reference["plan"]
    pool.add(plan.models()[0], other, tokenizer)  # same declaration, other weights
    before = digest_tree(run_dir)
    with pytest.raises(ResumeError, match="not the one the run used"):
        resume_run_sync(run_dir, pool=pool)
    assert digest_tree(run_dir) == before


def test_a_directory_in_use_is_refused(reference, tmp_path):
    run_dir = crash_copy(reference["run_dir"], tmp_path / "crashed", frozenset({"a"}))
    holder = DirectoryLock(run_dir)
    holder.acquire()  # as a run still going would
    try:
        with pytest.raises(ValueError, match="another process"):
            resume_counted(reference, run_dir)
    finally:
        holder.release()
    result, _, _ = resume_counted(reference, run_dir)
    assert result.status == "finished"


def test_the_record_must_be_a_run_record(tmp_path):
    with pytest.raises(ResumeError, match="record.json"):
        read_resume_point(tmp_path)
    with pytest.raises(ResumeError, match="not a directory"):
        resume_run_sync(tmp_path / "nowhere")


def test_every_sending_agent_holds_the_cache_its_snapshot_restores(reference, tmp_path):
    """Why resumed runs select exactly what uninterrupted runs select: a generating sender's
    cache is rebuilt from its rows after generation (Agent.refresh), so it is bit for bit the
    cache `load()` builds from its snapshot. Bit for bit needs every prompt prefilled alone
    and whole (`shared_prefixes: false, prefill_batch: 1`); with the defaults a prompt
    prefilled over a stored prefix or in a batch agrees to float32 rounding (next test)."""
    from tests.helpers.agents import prompts_alone
    # private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
    from rclc._cache import cache_layers, prefill

    from rclc_graph import run_plan_sync

    executor = CountingExecutor(reference["pool"])
    with prompts_alone(reference["model"]):
        result = run_plan_sync(reference["plan"], pool=reference["pool"], executor=executor)  # keeps its agents
    assert result.status == "finished"
    senders = {edge.source for edge in reference["plan"].edges if edge.policy.mode != "text"}
    assert {"a", "b", "d", "e"} <= senders and reference["plan"].node("b").generate
    for name in senders:
        state = executor.agent(result.run_id, name).sender_state()
        rebuilt = prefill(state.model, state.input_embeds)
        for (keys, values), (keys2, values2) in zip(cache_layers(state.past_key_values), cache_layers(rebuilt)):
            assert torch.equal(keys, keys2) and torch.equal(values, values2), name


def test_with_shared_prefixes_sending_agents_hold_their_snapshots_cache_to_float32_rounding(reference):
    """Issue 28: with shared prefixes and batched prefills on (the defaults), every sender's
    cache agrees with the one `load()` rebuilds to float32 rounding, and the run's outputs
    are the reference run's."""
    from rclc._cache import cache_layers, prefill

    from rclc_graph import run_plan_sync

    executor = CountingExecutor(reference["pool"])
    result = run_plan_sync(reference["plan"], pool=reference["pool"], executor=executor)
    assert result.status == "finished" and result.outputs == reference["record"]["outputs"]
    for name in {edge.source for edge in reference["plan"].edges if edge.policy.mode != "text"}:
        state = executor.agent(result.run_id, name).sender_state()
        rebuilt = prefill(state.model, state.input_embeds)
        for (keys, values), (keys2, values2) in zip(cache_layers(state.past_key_values), cache_layers(rebuilt)):
            torch.testing.assert_close(keys, keys2, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(values, values2, rtol=1e-5, atol=1e-5)


