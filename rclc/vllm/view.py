"""An HF-shaped model over a vLLM engine's resident weights (no second checkpoint load).

Selection, latent rollout and re-prefill run Hugging Face code (its cache, attention
dispatch and capture hooks), but the weights already live in the engine. The view is a
transformers model built on the meta device whose modules are filled from the engine:

- norms, embeddings and the LM head become parameters that are zero-copy views of the
  engine's tensors (vLLM pads the vocabulary; the view takes the first `vocab_size` rows);
- a fused projection whose weight is still a plain `[rows, in]` tensor (vLLM on GPUs)
  is split into zero-copy row slices: `qkv_proj` -> q, k, v and `gate_up_proj` -> gate, up;
- a projection whose weight vLLM's CPU backend repacked for its GEMM kernels (it then
  replaces the parameter with an empty tensor, so no plain weight exists to view) is
  run through the engine layer itself: the HF module calls the engine's packed GEMM and
  slices its output. q, k and v (and gate, up) read one fused output per input tensor,
  so the fused GEMM runs once per HF attention or MLP call.

Either way the view holds no copy of a weight matrix; it is only valid while the engine
is alive and idle (the packed GEMM handles are the engine's).
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any

import torch
from torch import nn

from transformers import AutoModelForCausalLM

from ..errors import UnsupportedModelError
from ..models import check_model
from .capture.engine_checks import check_version
from .engine import engine_model, require_idle, vllm_config

_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors carry no version counter
        return None


class _FusedOutput:
    """Runs one engine projection and shares its output between the slices that read it.

    The output is reused only for the very same input tensor object at the same version
    (HF passes one tensor to q, k and v, or to gate and up) and dropped once every slice
    has read it, so a changed or new input always recomputes.
    """

    def __init__(self, layer: nn.Module, readers: int, dtype: torch.dtype, device: torch.device):
        self._layer = layer
        self._engine_dtype, self._engine_device = dtype, device
        self._readers = readers
        self._lock = threading.Lock()
        self._key: tuple[weakref.ref, int | None] | None = None
        self._output: torch.Tensor | None = None
        self._reads = 0

    @property
    def bias(self) -> torch.Tensor | None:
        bias = getattr(self._layer, "bias", None)
        return bias if isinstance(bias, torch.Tensor) and not getattr(self._layer, "skip_bias_add", False) else None

    def weight_columns(self, start: int, stop: int) -> torch.Tensor:
        """Rows `[start, stop)` of the engine's weight, recovered exactly from its packed GEMM.

        Multiplying the identity matrix (no bias) returns each weight entry times one plus
        zeros, which IEEE arithmetic keeps exact for float32/float16/bfloat16 kernels that do
        not lower input precision; the tests compare the result bitwise with the checkpoint.
        """
        layer = self._layer
        columns = int(layer.input_size)
        parts = []
        with torch.no_grad():
            for first in range(0, columns, 1024):
                eye = torch.zeros(min(1024, columns - first), columns, dtype=self.dtype, device=self.device)
                eye[:, first : first + eye.shape[0]].fill_diagonal_(1)
                parts.append(layer.quant_method.apply(layer, eye, None)[:, start:stop])
        return torch.cat(parts, dim=0).T.contiguous()

    @property
    def dtype(self) -> torch.dtype:
        return self._engine_dtype

    @property
    def device(self) -> torch.device:
        return self._engine_device

    def _compute(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        result = self._layer(flat)
        if isinstance(result, tuple):  # vLLM linears return (output, bias-to-add-later)
            result, extra_bias = result
            if extra_bias is not None:
                result = result + extra_bias
        return result.reshape(*x.shape[:-1], result.shape[-1])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            key = self._key
            if key is not None and key[0]() is x and key[1] == _version(x) and self._output is not None:
                output = self._output
            else:
                output = self._compute(x)
                self._key, self._output, self._reads = (weakref.ref(x), _version(x)), output, 0
            self._reads += 1
            if self._reads >= self._readers:
                self._key, self._output = None, None
            return output


class EngineProjection(nn.Module):
    """Output columns `[start, stop)` of an engine projection, computed by the engine's GEMM.

    Stands in for an `nn.Linear` whose weight exists only in the engine's packed format.
    The engine layer is held outside the module tree, so the view's `parameters()`,
    `state_dict()`, `.to()` and `.eval()` never reach engine tensors.
    """

    def __init__(self, fused: _FusedOutput, start: int, stop: int, in_features: int):
        super().__init__()
        self._fused = fused
        self.start, self.stop = start, stop
        self.in_features, self.out_features = in_features, stop - start

    def materialize(self) -> dict[str, torch.Tensor]:
        """This projection's `weight` (and `bias`) as new tensors, exactly the engine's values."""
        tensors = {"weight": self._fused.weight_columns(self.start, self.stop)}
        bias = self._fused.bias
        if bias is not None:
            tensors["bias"] = bias.detach()[self.start : self.stop].clone()
        return tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._fused(x)
        if self.start == 0 and self.stop == output.shape[-1]:
            return output
        return output[..., self.start : self.stop]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, engine GEMM"


def _frozen(tensor: torch.Tensor) -> nn.Parameter:
    """A new Parameter object sharing `tensor`'s storage, with gradients off."""
    return nn.Parameter(tensor.detach(), requires_grad=False)


def _child(module: nn.Module, name: str, where: str) -> nn.Module:
    child = getattr(module, name, None)
    if not isinstance(child, nn.Module):
        raise UnsupportedModelError(
            f"engine model: {where}.{name} is missing; the engine's model class is not a supported decoder"
        )
    return child


def _plain_weight(layer: nn.Module, rows: int, columns: int, where: str) -> torch.Tensor | None:
    """The layer's weight when it is a plain `[rows, columns]` matrix, None when repacked away."""
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise UnsupportedModelError(f"engine model: {where} has no weight")
    if weight.dim() == 2 and tuple(weight.shape) == (rows, columns):
        return weight
    if weight.numel() == 0 and callable(getattr(layer, "cpu_linear", None)):
        return None  # vLLM's CPU backend moved it into a packed GEMM handle
    raise UnsupportedModelError(
        f"engine model: {where}.weight has shape {list(weight.shape)}, expected [{rows}, {columns}]"
    )


def _fill_linears(
    owner: nn.Module,
    layer: nn.Module,
    names: tuple[str, ...],
    sizes: list[int],
    columns: int,
    where: str,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Give `owner.<names>` the engine layer's rows (views) or engine-computed slices."""
    total = sum(sizes)
    declared = (getattr(layer, "output_size", total), getattr(layer, "input_size", columns))
    parts = list(getattr(layer, "output_sizes", sizes)) if len(sizes) > 1 else sizes
    if declared != (total, columns) or parts != sizes:
        raise UnsupportedModelError(
            f"engine model: {where} computes {list(declared)} (parts {parts}) but the HF config implies "
            f"[{total}, {columns}] (parts {sizes}); the engine and the checkpoint config disagree "
            "(for example vLLM deriving head_dim from hidden_size / heads)"
        )
    weight = _plain_weight(layer, total, columns, where)
    bias = getattr(layer, "bias", None)
    if bias is not None and tuple(bias.shape) != (total,):
        raise UnsupportedModelError(f"engine model: {where}.bias has shape {list(bias.shape)}, expected [{total}]")
    fused = None if weight is not None else _FusedOutput(layer, len(names), dtype, device)
    start = 0
    for name, size in zip(names, sizes):
        target = getattr(owner, name)
        stop = start + size
        if fused is not None:
            setattr(owner, name, EngineProjection(fused, start, stop, columns))
        else:
            if tuple(target.weight.shape) != (size, columns):
                raise UnsupportedModelError(
                    f"view: {name} expects [{list(target.weight.shape)}], the engine gives [{size}, {columns}]"
                )
            target.weight = _frozen(weight[start:stop])
            if (target.bias is None) != (bias is None):
                raise UnsupportedModelError(f"view: {name} bias presence differs between the HF config and the engine")
            if bias is not None:
                target.bias = _frozen(bias[start:stop])
        start = stop


def _fill_norm(target: nn.Module, source: nn.Module, where: str) -> None:
    weight = getattr(source, "weight", None)
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != tuple(target.weight.shape):
        shape = list(weight.shape) if isinstance(weight, torch.Tensor) else None
        raise UnsupportedModelError(
            f"engine model: {where}.weight has shape {shape}, expected {list(target.weight.shape)}"
        )
    target.weight = _frozen(weight)


def _table(source: nn.Module, vocab: int, hidden: int, where: str) -> torch.Tensor:
    weight = getattr(source, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden or weight.shape[0] < vocab:
        shape = list(weight.shape) if isinstance(weight, torch.Tensor) else None
        raise UnsupportedModelError(f"engine model: {where}.weight has shape {shape}, expected [>= {vocab}, {hidden}]")
    return weight[:vocab]


def _hf_config(llm: Any) -> Any:
    config = copy.deepcopy(vllm_config(llm).model_config.hf_config)
    config._attn_implementation = "sdpa"
    config.dtype = vllm_config(llm).model_config.dtype
    return config


def _build(config: Any, engine: nn.Module) -> nn.Module:
    dtype = config.dtype
    with torch.device("meta"):
        view = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    hidden, intermediate, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    source = _child(engine, "model", "engine")
    layers = getattr(source, "layers", None)
    if layers is None or len(layers) != config.num_hidden_layers:
        raise UnsupportedModelError(f"engine model: expected {config.num_hidden_layers} decoder layers")
    decoder = view.model
    embed = _table(_child(source, "embed_tokens", "model"), vocab, hidden, "model.embed_tokens")
    decoder.embed_tokens.weight = _frozen(embed)
    placement = (embed.dtype, embed.device)
    for index, (target, layer) in enumerate(zip(decoder.layers, layers)):
        where = f"model.layers.{index}"
        attention, mlp = _child(layer, "self_attn", where), _child(layer, "mlp", where)
        _fill_linears(
            target.self_attn,
            _child(attention, "qkv_proj", f"{where}.self_attn"),
            _QKV,
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim],
            hidden,
            f"{where}.self_attn.qkv_proj",
            *placement,
        )
        _fill_linears(
            target.self_attn, _child(attention, "o_proj", f"{where}.self_attn"), ("o_proj",), [hidden],
            heads * head_dim, f"{where}.self_attn.o_proj", *placement,
        )
        for norm in ("q_norm", "k_norm"):
            if hasattr(target.self_attn, norm):
                _fill_norm(getattr(target.self_attn, norm), _child(attention, norm, f"{where}.self_attn"), f"{where}.self_attn.{norm}")
        _fill_linears(
            target.mlp, _child(mlp, "gate_up_proj", f"{where}.mlp"), _GATE_UP, [intermediate, intermediate],
            hidden, f"{where}.mlp.gate_up_proj", *placement,
        )
        _fill_linears(
            target.mlp, _child(mlp, "down_proj", f"{where}.mlp"), ("down_proj",), [hidden], intermediate,
            f"{where}.mlp.down_proj", *placement,
        )
        for norm in ("input_layernorm", "post_attention_layernorm"):
            _fill_norm(getattr(target, norm), _child(layer, norm, where), f"{where}.{norm}")
    _fill_norm(decoder.norm, _child(source, "norm", "model"), "model.norm")
    if getattr(config, "tie_word_embeddings", False):
        view.lm_head.weight = decoder.embed_tokens.weight
    else:
        view.lm_head.weight = _frozen(_table(_child(engine, "lm_head", "engine"), vocab, hidden, "lm_head"))
    # Rotary tables are buffers computed from the config; build them on CPU as
    # from_pretrained does (same rounding), then move them next to the weights.
    rotary_type = type(decoder.rotary_emb)
    with torch.device("cpu"):
        rotary = rotary_type(config=config)
    decoder.rotary_emb = rotary.to(embed.device)
    return view


def _check_view(view: nn.Module, engine: nn.Module, grad_flags: dict[str, bool]) -> None:
    for name, tensor in [*view.named_parameters(), *view.named_buffers()]:
        if tensor.is_meta:
            raise RuntimeError(f"view: {name} was not filled from the engine (still on the meta device)")
    engine_tensors = {id(t) for t in [*engine.parameters(), *engine.buffers()]}
    for name, parameter in view.named_parameters():
        if id(parameter) in engine_tensors:
            raise RuntimeError(f"view: {name} is the engine's own parameter object, not a view of it")
        if parameter.requires_grad:
            raise RuntimeError(f"view: {name} requires grad")
    changed = [name for name, p in engine.named_parameters() if p.requires_grad != grad_flags.get(name)]
    if changed:
        raise RuntimeError(f"view: building it changed requires_grad on engine parameters {changed[:3]}")


def view_state_dict(view: nn.Module) -> dict[str, torch.Tensor]:
    """What `state_dict()` of the HF model loaded from the engine's checkpoint would hold.

    Same keys in the same order; plain parameters are the view's own (shared) tensors and
    engine-GEMM projections are materialized exactly (see `EngineProjection.materialize`),
    so weight digests of a view and of an HF model of the same checkpoint agree. This
    allocates a copy of every packed projection; use it for hashing, not on a hot path.
    """
    out: dict[str, torch.Tensor] = {}
    for prefix, module in view.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        if isinstance(module, EngineProjection):
            for name, tensor in module.materialize().items():
                out[dot + name] = tensor
            continue
        for name, parameter in module._parameters.items():
            if parameter is not None:
                out[dot + name] = parameter.detach()
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                out[dot + name] = buffer.detach()
    return out


def model_from_vllm(llm: Any, *, allow_unstable: bool = False) -> nn.Module:
    """An HF causal LM (eval mode) over the engine's resident weights; see the module docs.

    Needs an idle in-process engine of a supported family with unquantized weights.
    UnsupportedModelError names a missing or mis-shaped engine tensor; RuntimeError means the
    engine is busy (EngineBusyError), out of process or of an untested vLLM release.
    """
    check_version(allow_unstable=allow_unstable)
    require_idle(llm)
    quantization = getattr(vllm_config(llm).model_config, "quantization", None)
    if quantization is not None:
        raise UnsupportedModelError(
            f"llm: quantized weights ({quantization}) are unsupported; load the checkpoint unquantized"
        )
    config = _hf_config(llm)
    engine = engine_model(llm)
    grad_flags = {name: p.requires_grad for name, p in engine.named_parameters()}
    with torch.no_grad():
        view = _build(config, engine)
    _check_view(view, engine, grad_flags)
    view.eval()
    check_model(view)
    return view
