"""Save and restore bound agents: round trip, refusals that keep the previous state, cancellation."""

from __future__ import annotations

import functools
import json
import os
import struct

import threading

import anyio
import pytest
import safetensors.torch
import torch

import rclc
from rclc import latent_mass_sync, transfer_sync
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import prefill
from rclc.testing import tiny_model
from rclc.snapshot import model_identity, write_snapshot
from tests.helpers.agents import (
    DOC,
    HISTORY_A,
    HISTORY_B,
    QUESTION,
    assert_unchanged,
    counted_forwards,
    generate,
    history,
    same_cache,
    view,
)


def _continued(model, tokenizer):
    """Agent B holding received rows (-1 IDs, inherited count), a generated answer and a tool result."""
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), max_new_tokens=6)
    transfer_sync(a, b, QUESTION)
    inputs = b.pop()
    b.update(inputs=inputs, generation=generate(model, tokenizer, inputs))
    anyio.run(b.append, "<|im_start|>tool\nCedar: owner Alice<|im_end|>\n")
    return b


def _save(agent, path):
    anyio.run(agent.save, path)


def _load(agent, path):
    anyio.run(agent.load, path)


def _greedy(agent, model, tokenizer, tokens=8):
    inputs = anyio.run(functools.partial(agent.inputs, max_new_tokens=tokens))
    output = generate(model, tokenizer, inputs)
    agent.update(inputs=inputs, generation=output)
    return output.sequences[0]


def test_round_trip_generates_the_same_greedy_tokens(tiny, tmp_path):
    model, tokenizer = tiny
    original = _continued(model, tokenizer)
    path = tmp_path / "agent.safetensors"
    _save(original, path)
    state = original.sender_state()
    restored = rclc.bind(model, tokenizer, max_new_tokens=64)
    with counted_forwards(model) as calls:
        _load(restored, path)
    assert calls == [state.positions], "load re-prefills the rows once"
    loaded = restored.sender_state()
    assert torch.equal(loaded.input_embeds, state.input_embeds)
    assert torch.equal(loaded.token_ids, state.token_ids)
    assert (loaded.inherited_positions, loaded.latent_steps) == (state.inherited_positions, 0)
    # the inherited rows round-trip with the IDs their sender gave them
    assert state.inherited_positions > 0 and bool((state.token_ids[: state.inherited_positions] >= 0).all())
    assert same_cache(loaded.past_key_values, prefill(model, state.input_embeds))
    report = restored.inspect()
    assert report["state_source"] == "retained" and report["cached_positions"] == state.positions
    assert torch.equal(_greedy(original, model, tokenizer), _greedy(restored, model, tokenizer))
    # And the restored agent sends what the original sends.
    got = []
    transfer_sync([original, restored], got.append, QUESTION, ratio=1)
    first, second = got[0].messages
    assert torch.equal(first.continuous_rows, second.continuous_rows)


def test_history_state_and_latent_tail_round_trip(tiny, tmp_path):
    model, tokenizer = tiny
    agent = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    path = tmp_path / "history.safetensors"
    _save(agent, path)
    restored = rclc.bind(model, tokenizer)
    _load(restored, path)
    assert torch.equal(restored.sender_state().token_ids, agent.sender_state().token_ids)

    latent = latent_mass_sync(agent.sender_state(), steps=3)
    write_snapshot(tmp_path / "latent.safetensors", latent, model_identity(model, tokenizer))
    _load(restored, tmp_path / "latent.safetensors")
    state = restored.sender_state()
    assert state.latent_steps == 3 and torch.equal(state.input_embeds, latent.input_embeds)
    got = []
    transfer_sync(restored, got.append, QUESTION, budget=8, record_selection=True)
    indices = got[0].messages[0].selection.indices
    assert set(range(state.positions - 3, state.positions)) <= set(indices), "the restored latent tail is kept"


@pytest.fixture
def saved(tiny, tmp_path):
    model, tokenizer = tiny
    agent = _continued(model, tokenizer)
    path = tmp_path / "agent.safetensors"
    _save(agent, path)
    target = rclc.bind(model, tokenizer, prompt=DOC)
    return model, tokenizer, path, target


def _edited(path, tmp_path, edit):
    data = bytearray(path.read_bytes())
    edit(data)
    out = tmp_path / "edited.safetensors"
    out.write_bytes(bytes(data))
    return out


def _header(data):
    length = struct.unpack("<Q", bytes(data[:8]))[0]
    return length, json.loads(bytes(data[8 : 8 + length]))


def _rewrite_header(data, change):
    length, header = _header(data)
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text = text.ljust(length, b" ")
    assert len(text) == length, "the test keeps the header length so offsets stay valid"
    data[8 : 8 + length] = text


def _flip_token_row(data):
    length, header = _header(data)
    start = 8 + length + header["rows"]["data_offsets"][1] - 4  # the last row is a token row
    data[start : start + 4] = struct.pack("<f", 123.0)


def _bump_metadata(field, value):
    def change(header):
        meta = json.loads(header["__metadata__"]["rclc"])
        meta[field] = value
        header["__metadata__"]["rclc"] = json.dumps(meta, separators=(",", ":"))

    return lambda data: _rewrite_header(data, change)


def _nan_row(data):
    length, header = _header(data)
    start = 8 + length + header["rows"]["data_offsets"][0]
    data[start : start + 4] = struct.pack("<f", float("nan"))


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda data: data.__delitem__(slice(len(data) // 2, None)), "not a snapshot"),
        (_flip_token_row, "reproduce"),
        (_nan_row, "nonfinite"),
        (_bump_metadata("format", 2), "unsupported"),
        (_bump_metadata("inherited_positions", 10**4), "inherited_positions"),
        (_bump_metadata("identity", "0" * 64), "identical weights"),
    ],
)
def test_bad_files_keep_the_previous_state(saved, tmp_path, edit, match):
    model, tokenizer, path, target = saved
    bad = _edited(path, tmp_path, edit)
    before = view(target)
    with pytest.raises(ValueError, match=match):
        _load(target, bad)
    assert_unchanged(target, before)


def test_foreign_files_keep_the_previous_state(saved, tmp_path):
    model, tokenizer, path, target = saved
    plain = tmp_path / "plain.safetensors"
    safetensors.torch.save_file({"rows": torch.zeros(2, 64)}, str(plain))
    before = view(target)
    with pytest.raises(ValueError, match="not a snapshot"):
        _load(target, plain)
    with pytest.raises(OSError):
        _load(target, tmp_path / "missing.safetensors")
    assert_unchanged(target, before)


def _rewritten(path, tmp_path, change):
    """A copy of the snapshot at `path` with its tensors replaced by `change(tensors)`, metadata kept."""
    with safetensors.safe_open(str(path), framework="pt") as reader:
        metadata = reader.metadata()
        tensors = {key: reader.get_tensor(key) for key in reader.keys()}
    out = tmp_path / "rewritten.safetensors"
    safetensors.torch.save_file(change(tensors), str(out), metadata=metadata)
    return out


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda t: {**t, "extra": torch.zeros(1)}, "unexpected tensor keys"),
        (lambda t: {"ids": t["ids"]}, "unexpected tensor keys"),
        (lambda t: {**t, "rows": t["rows"].double()}, "same checkpoint and dtype"),
        (lambda t: {**t, "rows": t["rows"][:, :32].contiguous()}, "same checkpoint and dtype"),
        (lambda t: {"rows": t["rows"][:0].contiguous()}, "1 to"),
        (lambda t: {**t, "ids": t["ids"][:-1].contiguous()}, "aligned"),
        (lambda t: {**t, "ids": t["ids"].int()}, "aligned"),
    ],
)
def test_bad_tensors_keep_the_previous_state(saved, tmp_path, change, match):
    model, tokenizer, path, target = saved
    bad = _rewritten(path, tmp_path, change)
    before = view(target)
    with pytest.raises(ValueError, match=match):
        _load(target, bad)
    assert_unchanged(target, before)


def test_snapshot_longer_than_the_agent_context(saved):
    model, tokenizer, path, _ = saved
    with safetensors.safe_open(str(path), framework="pt") as reader:
        rows = reader.get_slice("rows").get_shape()[0]
    target = rclc.bind(model, tokenizer, prompt=DOC, context_limit=rows - 1)
    before = view(target)
    with pytest.raises(ValueError, match="context limit"):
        _load(target, path)
    assert_unchanged(target, before)


def test_mismatched_model_keeps_the_previous_state(saved, tiny_tokenizer):
    model, tokenizer, path, _ = saved
    family = model.config.model_type
    other_weights, _ = tiny_model(family, tokenizer=tiny_tokenizer, seed=1)
    other_family, _ = tiny_model("llama" if family == "qwen3" else "qwen3", tokenizer=tiny_tokenizer)
    for other in (other_weights, other_family):
        target = rclc.bind(other, tokenizer, prompt=DOC)
        before = view(target)
        with pytest.raises(ValueError, match="identical weights"):
            _load(target, path)
        assert_unchanged(target, before)


def test_save_and_load_refused_with_pending_work_or_queued_handoffs(tiny, tmp_path):
    model, tokenizer = tiny
    a = rclc.bind(model, tokenizer, messages=history(HISTORY_A))
    b = rclc.bind(model, tokenizer, messages=history(HISTORY_B), prompt=DOC)
    good = tmp_path / "good.safetensors"
    _save(b, good)
    transfer_sync(a, b, QUESTION)
    path = tmp_path / "refused.safetensors"
    before = view(b)
    with pytest.raises(ValueError, match="queued"):
        _save(b, path)
    with pytest.raises(ValueError, match="queued"):
        _load(b, good)
    assert_unchanged(b, before)
    b.pop()
    before = view(b)
    with pytest.raises(ValueError, match="pending"):
        _save(b, path)
    with pytest.raises(ValueError, match="pending"):
        _load(b, good)
    assert_unchanged(b, before)
    assert not path.exists()
    empty = rclc.bind(model, tokenizer)
    with pytest.raises(ValueError, match="no state"):
        _save(empty, path)
    assert not path.exists() and os.listdir(tmp_path) == ["good.safetensors"]


def test_cancelled_load_keeps_the_previous_state(tiny, tmp_path):
    model, tokenizer = tiny
    path = tmp_path / "agent.safetensors"
    _save(_continued(model, tokenizer), path)
    target = rclc.bind(model, tokenizer, prompt=DOC)
    before = view(target)
    observed = {}

    async def main():
        cancelled = threading.Event()
        with counted_forwards(model, held_until=cancelled) as calls:  # the operation cannot end first
            async with anyio.create_task_group() as group:
                group.start_soon(target.load, path)
                while not calls:
                    await anyio.sleep(0.001)
                group.cancel_scope.cancel()
                cancelled.set()
            observed["forwards"] = len(calls)

    anyio.run(main)
    assert observed["forwards"] == 1, "the re-prefill finished before cancellation returned"
    assert_unchanged(target, before)
    _load(target, path)
    assert target.sender_state() is not before.state
