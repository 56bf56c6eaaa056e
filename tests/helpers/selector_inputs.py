"""Shared builders and independent references for the selector tests.

The references recompute the spec's formulas from eager attention weights with plain
loops and explicit padding, sharing no code with `rclc.selectors`.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM

# private on purpose: builds and reads the KV caches the test checks (rclc has no public cache API)
from rclc._cache import backbone, cache_keyword, cache_layers, clone_cache, crop_cache, prefill
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors import _attention_capture as _capture
# private on purpose: the attention-capture internals under test (dispatch restored, captures, configs)
from rclc.selectors._attention_capture import reachable_configs
from rclc.state import SenderState

DOCUMENT = (
    "The Cedar project is owned by Alice and launched on 3 May 2021 in Oslo. "
    "The Birch project is owned by Bob and launched on 9 June 2019 in Lima. "
    "Find the owner and launch date of each project in the document summary."
)


def make_sender(model, tokenizer, text: str = DOCUMENT, *, latent_steps: int = 0) -> SenderState:
    """Rows = embedding lookup of the text's IDs (latent rows: perturbed embeddings marked -1)."""
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        rows = model.get_input_embeddings().weight[ids].clone()
        if latent_steps:
            generator = torch.Generator().manual_seed(7)
            rows[-latent_steps:] += 0.01 * torch.randn(latent_steps, rows.shape[1], generator=generator)
            ids = ids.clone()
            ids[-latent_steps:] = -1
    return SenderState(
        model, prefill(model, rows), rows, tokenizer=tokenizer, token_ids=ids, latent_steps=latent_steps
    )


def request(tokenizer, text: str = "Who owns Cedar and when did it launch?") -> torch.Tensor:
    return tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]


def eager_copy(model):
    """The same weights behind eager attention (so attention weights can be returned)."""
    config = copy.deepcopy(model.config)
    config._attn_implementation = "eager"
    eager = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=model.dtype)
    eager.load_state_dict(model.state_dict())
    eager.eval()
    return eager


def eager_attentions(eager, cache, memory, *, input_ids=None, inputs_embeds=None) -> list[torch.Tensor]:
    """Per-layer attention weights `[H, rows, memory + rows]` of rows forwarded after `memory` positions."""
    decoder = backbone(eager)
    private = clone_cache(eager, cache)
    if private.get_seq_length() != memory:
        private = crop_cache(eager, private, memory)
    rows = (input_ids if input_ids is not None else inputs_embeds).shape[1]
    kwargs = {
        cache_keyword(decoder): private,
        "position_ids": torch.arange(memory, memory + rows).unsqueeze(0),
        "attention_mask": torch.ones(1, memory + rows, dtype=torch.long),
        "use_cache": True,
        "output_attentions": True,
    }
    if input_ids is not None:
        kwargs["input_ids"] = input_ids
    else:
        kwargs["inputs_embeds"] = inputs_embeds
    with torch.no_grad():
        output = decoder(**kwargs)
    return [layer[0].float() for layer in output.attentions]


def max_pool_reference(values: torch.Tensor, width: int = 7) -> torch.Tensor:
    """Centred max pool along the last axis; out-of-range neighbours ignored (-inf padding)."""
    half = width // 2
    padded = torch.nn.functional.pad(values, (half, half), value=float("-inf"))
    return padded.unfold(-1, width, 1).amax(-1)


def support_reference(attentions: list[torch.Tensor], kv_heads: int, memory: int) -> dict[str, torch.Tensor]:
    """Spec 4.3's eager reference: snap, energy, row energy and the composite score."""
    snap = energy = row_energy = 0
    for weights in attentions:
        w = weights[:, :, :memory]  # [H, R, M]
        heads, rows = w.shape[0], w.shape[1]
        snap = snap + w.mean(dim=(0, 1))
        grouped = w.reshape(kv_heads, heads // kv_heads, rows, memory).mean(1)  # [K, R, M]
        energy = energy + (max_pool_reference(grouped.mean(1)) ** 2).sum(0)
        row_energy = row_energy + (max_pool_reference(grouped) ** 2).mean(1).sum(0)
    return {
        "snap": snap,
        "energy": energy,
        "row_energy": row_energy,
        "score": max_pool_reference(snap) * (row_energy / energy) ** 2,
    }


class LiteralSupportFold:
    """Section 4.2 transcribed step by step (keys repeated to every query head, torch.matmul)."""

    def __init__(self, row_chunk: int = 256) -> None:
        self.row_chunk = row_chunk
        self.votes = self.energy = self.row_energy = None
        self.heads = self.rows = 0

    def __call__(self, query, key, scaling):
        _, heads, rows, _ = query.shape
        kv_heads, total = key.shape[1], key.shape[2]
        group, memory = heads // kv_heads, total - rows
        if self.votes is None:
            self.heads, self.rows = heads, rows
            self.votes = torch.zeros(memory)
            self.energy = torch.zeros(memory)
            self.row_energy = torch.zeros(memory)
        expanded = key[0].repeat_interleave(group, dim=0)  # kv0 x g, kv1 x g, ...
        row_sum = torch.zeros(kv_heads, memory)
        row_acc = torch.zeros(memory)
        for start in range(0, rows, self.row_chunk):
            stop = min(start + self.row_chunk, rows)
            logits = torch.matmul(query[0, :, start:stop], expanded.transpose(-1, -2)) * scaling
            for r in range(start, stop):
                logits[:, r - start, memory + r + 1 :] = float("-inf")
            attention = torch.softmax(logits.float(), dim=-1)[..., :memory]
            self.votes += attention.sum(dim=(0, 1))
            grouped = attention.reshape(kv_heads, group, stop - start, memory).mean(1)
            row_sum += grouped.sum(1)
            row_acc += (256.0 * max_pool_reference(grouped)).square().sum(dim=(0, 1))
        self.energy += (256.0 * max_pool_reference(row_sum / rows)).square().sum(0)
        self.row_energy += row_acc / rows


def snapshot(sender):
    """The sender's rows, ids and cache tensors (the objects and copies), for `assert_unchanged`."""
    layers = cache_layers(sender.past_key_values)
    return {
        "rows": sender.input_embeds.clone(),
        "ids": sender.token_ids.clone(),
        "tensors": [(k, v) for k, v in layers],
        "values": [(k.clone(), v.clone()) for k, v in layers],
    }


def assert_unchanged(sender, before):
    """A selector left the sender as `snapshot` saw it: same tensors, same values, dispatch restored."""
    assert torch.equal(sender.input_embeds, before["rows"])
    assert torch.equal(sender.token_ids, before["ids"])
    layers = cache_layers(sender.past_key_values)
    assert len(layers) == len(before["tensors"])
    for (k, v), (k0, v0), (kc, vc) in zip(layers, before["tensors"], before["values"]):
        assert k is k0 and v is v0
        assert torch.equal(k, kc) and torch.equal(v, vc)
    assert sender.model.config._attn_implementation == "sdpa"
    assert all(c._attn_implementation == "sdpa" for c in reachable_configs(sender.model))
    assert _capture.active_captures() == ()
