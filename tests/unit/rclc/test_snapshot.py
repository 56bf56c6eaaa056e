from __future__ import annotations

import copy
import gc
import re
import weakref
from pathlib import Path
import json
import os

import pytest
import safetensors
import safetensors.torch
import torch

import rclc.snapshot as snapshot
from rclc import testing
# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import cache_layers, prefill
from rclc.reasoning import latent_mass_sync
from rclc.snapshot import model_identity, read_snapshot, restore_state, write_snapshot
from rclc.state import SenderState

LIMIT = 2048


def make_state(model, tokenizer, *, length=10, with_ids=True, inherited=2, latent=2):
    weight = model.get_input_embeddings().weight
    ids = torch.randint(3, weight.shape[0], (length,), generator=torch.Generator().manual_seed(1))
    rows = weight[ids].detach().clone()
    state = SenderState(
        model=model,
        past_key_values=prefill(model, rows),
        input_embeds=rows,
        tokenizer=tokenizer,
        token_ids=ids if with_ids else None,
        inherited_positions=inherited,
    )
    return latent_mass_sync(state, steps=latent) if latent else state


def save(path, state):
    write_snapshot(path, state, model_identity(state.model, state.tokenizer))


def load(path, model, tokenizer, limit=LIMIT):
    return read_snapshot(path, model, tokenizer, context_limit=limit)


def rewrite(source, target, *, tensors=None, header=None, raw_metadata=None):
    """Copy a snapshot with edited tensors and/or metadata (the attacker's or bit-rot's view)."""
    with safetensors.safe_open(str(source), framework="pt") as reader:
        original = {key: reader.get_tensor(key) for key in reader.keys()}
        meta = json.loads(reader.metadata()["rclc"])
    if tensors is not None:
        original = tensors(original)
    if header is not None:
        meta = header(meta)
    metadata = raw_metadata if raw_metadata is not None else {"rclc": json.dumps(meta)}
    safetensors.torch.save_file(original, str(target), metadata=metadata)


@pytest.mark.parametrize("with_ids", [True, False])
def test_round_trip(tiny, tmp_path, with_ids):
    model, tokenizer = tiny
    state = make_state(model, tokenizer, with_ids=with_ids)
    path = tmp_path / "agent.safetensors"
    save(path, state)

    rows, ids, latent, inherited = load(path, model, tokenizer)
    assert torch.equal(rows, state.input_embeds)
    assert rows.dtype == state.input_embeds.dtype
    if with_ids:
        assert torch.equal(ids, state.token_ids)
    else:
        assert ids.tolist() == [-1] * state.positions
    assert (latent, inherited) == (2, 2)

    restored = restore_state(model, tokenizer, rows, ids, latent, inherited)
    assert restored.positions == state.positions
    assert (restored.latent_steps, restored.inherited_positions) == (2, 2)
    fresh = prefill(model, state.input_embeds)
    for (k, v), (k0, v0), (k1, v1) in zip(
        cache_layers(restored.past_key_values), cache_layers(fresh), cache_layers(state.past_key_values)
    ):
        assert torch.equal(k, k0) and torch.equal(v, v0)
        torch.testing.assert_close(k, k1, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(v, v1, atol=2e-5, rtol=1e-4)


def test_file_holds_only_rows_ids_and_counts(tiny_qwen3, tmp_path):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    path = tmp_path / "agent.safetensors"
    save(path, state)
    with safetensors.safe_open(str(path), framework="pt") as reader:
        assert set(reader.keys()) == {"rows", "ids"}
        assert set(reader.metadata()) == {"rclc"}
        header = json.loads(reader.metadata()["rclc"])
    assert header == {
        "format": 1,
        "layout": 1,
        "identity": model_identity(model, tokenizer),
        "latent_steps": 2,
        "inherited_positions": 2,
    }
    assert oct(path.stat().st_mode & 0o777) == "0o600"  # private model input


def test_write_replaces_atomically_and_cleans_up(tiny_qwen3, tmp_path, monkeypatch):
    model, tokenizer = tiny_qwen3
    path = tmp_path / "agent.safetensors"
    save(path, make_state(model, tokenizer, latent=0))
    previous = path.read_bytes()

    def torn_write(descriptor):  # the temporary file is written but never reaches the disk
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", torn_write)
    with pytest.raises(OSError, match="disk full"):
        save(path, make_state(model, tokenizer, latent=3))
    assert path.read_bytes() == previous
    assert sorted(os.listdir(tmp_path)) == ["agent.safetensors"]

    monkeypatch.undo()

    def fail_rename(source, target):
        raise OSError("rename refused")

    monkeypatch.setattr(os, "replace", fail_rename)
    with pytest.raises(OSError, match="rename refused"):
        save(path, make_state(model, tokenizer, latent=3))
    assert path.read_bytes() == previous
    assert sorted(os.listdir(tmp_path)) == ["agent.safetensors"]
    monkeypatch.undo()

    save(path, make_state(model, tokenizer, latent=3))
    assert load(path, model, tokenizer)[2] == 3
    assert sorted(os.listdir(tmp_path)) == ["agent.safetensors"]


def test_write_refuses_invalid_states(tiny_qwen3, tmp_path):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer, latent=0)
    path = tmp_path / "agent.safetensors"
    state.token_ids = state.token_ids.clone()
    state.token_ids[0] = 3 if int(state.token_ids[0]) != 3 else 4
    with pytest.raises(ValueError, match="reproduce"):
        save(path, state)
    state.latent_steps = 99
    with pytest.raises(ValueError, match="latent_steps"):
        save(path, state)
    assert os.listdir(tmp_path) == []


def test_missing_file_is_an_os_error(tiny_qwen3, tmp_path):
    model, tokenizer = tiny_qwen3
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent.safetensors", model, tokenizer)


@pytest.fixture
def saved(tiny_qwen3, tmp_path):
    model, tokenizer = tiny_qwen3
    path = tmp_path / "agent.safetensors"
    save(path, make_state(model, tokenizer))
    return path, model, tokenizer


def _truncate(path, target):
    target.write_bytes(path.read_bytes()[:-7])


def _plain_text(path, target):
    target.write_bytes(b"this is a chat log, not tensors")


def _no_metadata(path, target):
    safetensors.torch.save_file({"rows": torch.zeros(2, 64)}, str(target))


@pytest.mark.parametrize(
    "edit,match",
    [
        (_truncate, "not a snapshot"),
        (_plain_text, "not a snapshot"),
        (_no_metadata, "not a snapshot"),
        (lambda p, t: rewrite(p, t, raw_metadata={"rclc": "{not json"}), "not a snapshot"),
        (lambda p, t: rewrite(p, t, raw_metadata={"rclc": "[1, 2]"}), "not a snapshot"),
        (lambda p, t: rewrite(p, t, raw_metadata={"other": "{}"}), "not a snapshot"),
        # issue 16 item 5: 100k-deep metadata raised RecursionError instead of the documented ValueError
        (lambda p, t: rewrite(p, t, raw_metadata={"rclc": "[" * 100000 + "]" * 100000}), "not a snapshot"),
        (lambda p, t: rewrite(p, t, raw_metadata={"rclc": "[" * 1500 + "]" * 1500}), "not a snapshot"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "format": 2}), "unsupported"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "format": "1"}), "unsupported"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "layout": 2}), "unsupported"),
        (lambda p, t: rewrite(p, t, header=lambda h: {k: v for k, v in h.items() if k != "layout"}), "unsupported"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "weights": "x"}), "unsupported"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "identity": "0" * 64}), "identical weights"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "latent_steps": 12}), "latent_steps"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "latent_steps": True}), "latent_steps"),
        (lambda p, t: rewrite(p, t, header=lambda h: {**h, "inherited_positions": 11}), "inherited_positions"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "cache": torch.zeros(1)}), "unexpected tensor keys"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {"ids": d["ids"]}), "unexpected tensor keys"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "rows": d["rows"].double()}), "float64"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "rows": d["rows"][:, :32].contiguous()}), "rows"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "rows": d["rows"][None]}), "rows"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {"rows": d["rows"][:0].contiguous()}), "1 to"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "rows": _poison(d["rows"])}), "nonfinite"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "rows": _nudge(d["rows"])}), "reproduce"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "ids": d["ids"].int()}), "ids"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "ids": d["ids"][:-1].contiguous()}), "ids"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "ids": _edit_id(d["ids"], 0, 10**6)}), "token_ids"),
        (lambda p, t: rewrite(p, t, tensors=lambda d: {**d, "ids": _edit_id(d["ids"], -1, 5)}), "latent tail"),
    ],
)
def test_each_refusal(saved, tmp_path, edit, match):
    path, model, tokenizer = saved
    target = tmp_path / "edited.safetensors"
    edit(path, target)
    with pytest.raises(ValueError, match=match):
        load(target, model, tokenizer)


def _poison(rows):
    rows = rows.clone()
    rows[0, 0] = float("nan")
    return rows


def _nudge(rows):
    rows = rows.clone()
    rows[0, 0] += 1e-3
    return rows


def _edit_id(ids, index, value):
    ids = ids.clone()
    ids[index] = value
    return ids


def test_too_long_for_the_context(saved):
    path, model, tokenizer = saved
    load(path, model, tokenizer, limit=12)
    with pytest.raises(ValueError, match="context limit"):
        load(path, model, tokenizer, limit=11)


def test_wrong_model_or_vocabulary(saved, tiny_tokenizer):
    path, model, tokenizer = saved
    other_seed, _ = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, seed=1)
    with pytest.raises(ValueError, match="identical weights"):
        load(path, other_seed, tokenizer)
    other_config, _ = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer, max_positions=1024)
    with pytest.raises(ValueError, match="identical weights"):
        load(path, other_config, tokenizer)
    other_vocabulary = copy.deepcopy(tokenizer)
    other_vocabulary.add_tokens(["<|extra|>"])
    with pytest.raises(ValueError, match="identical weights"):
        load(path, model, other_vocabulary)


def test_model_checked_first(saved, tiny_tokenizer):
    path, _, tokenizer = saved
    model, _ = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer)
    model.train()
    with pytest.raises(ValueError, match="training"):
        load(path, model, tokenizer)


def test_identity_is_stable_and_distinguishes_models(tiny_qwen3, tiny_llama, tiny_tokenizer):
    model, tokenizer = tiny_qwen3
    first = model_identity(model, tokenizer)
    assert len(first) == 64 and int(first, 16) >= 0
    assert model_identity(model, tokenizer) == first
    twin, _ = testing.tiny_model("qwen3", tokenizer=tiny_tokenizer)
    assert model_identity(twin, tokenizer) == first  # same seed, same config: same identity
    assert model_identity(tiny_llama[0], tokenizer) != first
    assert model_identity(model, None) != first


def test_weight_digest_cache_and_invalidation(tiny_tokenizer, monkeypatch):
    model, tokenizer = testing.tiny_model("llama", tokenizer=tiny_tokenizer)
    hashed = []
    real = snapshot._hash_weights

    def counting(tensors):
        hashed.append(1)
        return real(tensors)

    monkeypatch.setattr(snapshot, "_hash_weights", counting)
    original = model_identity(model, tokenizer)
    assert model_identity(model, tokenizer) == original
    assert len(hashed) == 1  # cached while the fingerprint holds

    weight = model.model.layers[0].mlp.up_proj.weight
    saved_values = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(1.5)
    edited = model_identity(model, tokenizer)
    assert edited != original and len(hashed) == 2
    with torch.no_grad():
        weight.copy_(saved_values)
    assert model_identity(model, tokenizer) == original and len(hashed) == 3

    # A replaced parameter (new storage) also invalidates.
    model.model.norm.weight = torch.nn.Parameter(model.model.norm.weight.detach() + 1)
    assert model_identity(model, tokenizer) != original and len(hashed) == 4

    # The cache holds models weakly.
    alive = weakref.ref(model)
    del model, weight
    gc.collect()
    assert alive() is None


def test_restore_validates(tiny_qwen3):
    model, tokenizer = tiny_qwen3
    state = make_state(model, tokenizer)
    with pytest.raises(ValueError, match="latent_steps"):
        restore_state(model, tokenizer, state.input_embeds, state.token_ids, 12, 0)
    with pytest.raises(ValueError, match="inherited_positions"):
        restore_state(model, tokenizer, state.input_embeds, state.token_ids, 2, 11)


def test_snapshot_code_never_pickles():
    source = Path(snapshot.__file__).read_text()
    assert "pickle" not in source
    assert not re.search(r"(?<![\w.])torch\.(save|load)\(|\beval\(|\bexec\(", source)


def test_round_trip_bfloat16(tiny_tokenizer, tmp_path):
    model, tokenizer = testing.tiny_model("llama", tokenizer=tiny_tokenizer, dtype="bfloat16")
    state = make_state(model, tokenizer)
    path = tmp_path / "agent.safetensors"
    save(path, state)
    rows, ids, latent, inherited = load(path, model, tokenizer)
    assert rows.dtype == torch.bfloat16 and torch.equal(rows, state.input_embeds)
    restore_state(model, tokenizer, rows, ids, latent, inherited).validate()
    float_model, _ = testing.tiny_model("llama", tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match="bfloat16"):
        load(path, float_model, tokenizer)


@pytest.mark.integration
def test_round_trip_on_the_embedded_model(embedded, tmp_path):
    model, tokenizer = embedded
    ids = tokenizer("The Cedar project is owned by Alice.", add_special_tokens=False, return_tensors="pt")["input_ids"]
    rows = model.get_input_embeddings().weight[ids[0]].detach().clone()
    state = SenderState(model, prefill(model, rows), rows, tokenizer, ids[0].clone())
    state = latent_mass_sync(state, steps=3)
    path = tmp_path / "agent.safetensors"
    save(path, state)
    restored = restore_state(model, tokenizer, *load(path, model, tokenizer))
    assert torch.equal(restored.input_embeds, state.input_embeds)
    assert torch.equal(restored.token_ids, state.token_ids) and restored.latent_steps == 3
    for (k, v), (k0, v0) in zip(cache_layers(restored.past_key_values), cache_layers(state.past_key_values)):
        torch.testing.assert_close(k, k0, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, v0, atol=1e-4, rtol=1e-4)


def test_oversized_tensors_are_refused_before_loading(saved, tmp_path, monkeypatch):
    path, model, tokenizer = saved
    target = tmp_path / "huge.safetensors"
    rewrite(path, target, tensors=lambda d: {"rows": torch.zeros(64, 64)})
    loaded = []
    real = safetensors.safe_open

    class Spy:
        def __init__(self, *args, **kwargs):
            self.reader = real(*args, **kwargs)

        def __enter__(self):
            self.inner = self.reader.__enter__()
            return self

        def __exit__(self, *exc):
            return self.reader.__exit__(*exc)

        def get_tensor(self, key):
            loaded.append(key)
            return self.inner.get_tensor(key)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    with pytest.raises(ValueError, match="context limit"):
        load(target, model, tokenizer, limit=32)
    assert loaded == []
    load(path, model, tokenizer, limit=32)
    assert loaded == ["ids", "rows"]
