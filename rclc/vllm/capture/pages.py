"""Reading one request's prompt KV out of vLLM's paged cache, for the two layouts we support.

vLLM stores each layer's KV in a pool of fixed-size blocks; a request owns a list of
block IDs (its block table). Where keys and values sit inside a block depends on the
attention backend:

- `cpu` (vLLM's CPU_ATTN backend with its portable `vec`/`vec16` kernels, checked on
  vLLM 0.30.0 for float32, bfloat16 and float16 pages): `[blocks, kv_heads, block_size, 2 * head_dim]`, where each (block, head)
  slab is two halves of `block_size * head_dim` elements: the keys stored dimension-major
  (`[head_dim, block_size]`, transposed for the kernel's dot products), then the values
  stored token-major (`[block_size, head_dim]`). The tensor's shape alone does not say
  this; the layout was found by locating HF-computed keys in a real engine's pool, and
  the tests compare captures against HF KV so a change is caught.
- `flash` (FlashAttention and backends sharing its shape): `[2, blocks, block_size,
  kv_heads, head_dim]`, keys at index 0, values at index 1.

Extraction gathers the request's blocks with `index_select`, which always allocates a
new tensor, so the engine's pool is only ever read. Everything here is plain torch with
no vLLM import, so both layouts are testable with synthetic tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import CaptureError, IncompatibleStateError, RclcError

LAYOUTS = ("cpu", "flash")
PAGE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class PageGeometry:
    """What every layer's page tensor must agree on (from the engine's KV cache spec)."""

    layout: str
    kv_heads: int
    head_dim: int
    block_size: int  # tokens per block in the scheduler's block table
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise RclcError(f"layout: {self.layout!r} is not one of {LAYOUTS}")
        for name in ("kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise RclcError(f"{name}: expected a positive int, got {value!r}")
        if self.dtype not in PAGE_DTYPES:
            raise RclcError(f"dtype: KV pages must be float16, bfloat16 or float32, got {self.dtype}")


def kernel_block_size(pages: torch.Tensor, geometry: PageGeometry) -> int:
    """Tokens per block in the tensor itself; raises IncompatibleStateError when the shape does not fit."""
    shape = tuple(pages.shape)
    heads, dim = geometry.kv_heads, geometry.head_dim
    if geometry.layout == "cpu":
        ok = len(shape) == 4 and shape[1] == heads and shape[3] == 2 * dim
        expected = f"[blocks, {heads}, tokens, {2 * dim}]"
        tokens = shape[2] if ok else 0
    else:
        ok = len(shape) == 5 and shape[0] == 2 and shape[3] == heads and shape[4] == dim
        expected = f"[2, blocks, tokens, {heads}, {dim}]"
        tokens = shape[2] if ok else 0
    if not ok:
        raise IncompatibleStateError(f"pages: {geometry.layout} layout expects {expected}, got {list(shape)}")
    if pages.dtype != geometry.dtype:
        raise IncompatibleStateError(f"pages: dtype {pages.dtype} differs from the KV cache spec's {geometry.dtype}")
    if tokens < 1 or geometry.block_size % tokens:
        raise IncompatibleStateError(
            f"pages: {tokens} tokens per tensor block does not divide the scheduler block size {geometry.block_size}"
        )
    return tokens


def _tensor_blocks(pages: torch.Tensor, layout: str) -> int:
    return int(pages.shape[0] if layout == "cpu" else pages.shape[1])


def _kernel_indices(block_ids: list[int], length: int, pages: torch.Tensor, geometry: PageGeometry) -> torch.Tensor:
    """Validate the request's block IDs and map them to tensor block indices."""
    if type(length) is not int or length < 1:
        raise RclcError(f"length: expected a positive int, got {length!r}")
    needed = -(-length // geometry.block_size)
    if len(block_ids) < needed:
        raise RclcError(
            f"block_ids: {length} positions need {needed} blocks of {geometry.block_size}, the request holds {len(block_ids)}"
        )
    chosen = [int(b) for b in block_ids[:needed]]
    if 0 in chosen:
        raise RclcError("block_ids: the request's table holds the null block 0 inside its prompt")
    if len(set(chosen)) != len(chosen):
        raise RclcError(f"block_ids: duplicate blocks in the request's table {chosen}")
    per_block = kernel_block_size(pages, geometry)
    ratio = geometry.block_size // per_block
    available = _tensor_blocks(pages, geometry.layout)
    if max(chosen) * ratio + ratio > available or min(chosen) < 0:
        raise RclcError(f"block_ids: {chosen} lie outside the pool of {available // ratio} blocks")
    expanded = [block * ratio + part for block in chosen for part in range(ratio)]
    return torch.tensor(expanded, dtype=torch.long, device=pages.device)


def gather_prompt(
    pages: torch.Tensor, geometry: PageGeometry, block_ids: list[int], length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the first `length` positions of one layer: `(keys, values)` each `[1, heads, length, dim]`.

    The result never shares storage with `pages`. Raises RclcError for bad block tables
    and CaptureError if the copied values are not finite (a sign of unwritten pages).
    """
    index = _kernel_indices(block_ids, length, pages, geometry)
    heads, dim = geometry.kv_heads, geometry.head_dim
    if geometry.layout == "cpu":
        blocks = pages.index_select(0, index)  # [n, heads, tokens, 2*dim], a copy
        tokens = blocks.shape[2]
        halves = blocks.view(blocks.shape[0], heads, 2, tokens * dim)
        key_slabs = halves[:, :, 0].view(-1, heads, dim, tokens).transpose(2, 3)  # [n, heads, tokens, dim]
        value_slabs = halves[:, :, 1].view(-1, heads, tokens, dim)
        keys = key_slabs.permute(1, 0, 2, 3).reshape(heads, -1, dim)
        values = value_slabs.permute(1, 0, 2, 3).reshape(heads, -1, dim)
    else:
        blocks = pages.index_select(1, index)  # [2, n, tokens, heads, dim], a copy
        keys = blocks[0].reshape(-1, heads, dim).permute(1, 0, 2)
        values = blocks[1].reshape(-1, heads, dim).permute(1, 0, 2)
    keys = keys[:, :length].unsqueeze(0).contiguous()
    values = values[:, :length].unsqueeze(0).contiguous()
    if not (torch.isfinite(keys).all() and torch.isfinite(values).all()):
        raise CaptureError("captured KV holds non-finite values; the prompt's pages were not written as expected")
    return keys, values


def scatter_prompt(
    pages: torch.Tensor, geometry: PageGeometry, block_ids: list[int], keys: torch.Tensor, values: torch.Tensor
) -> None:
    """Write `[1, heads, length, dim]` keys/values into `pages` at the given blocks.

    The inverse of `gather_prompt`, used only to build synthetic pools in tests (the
    connector never writes an engine pool).
    """
    length = int(keys.shape[2])
    index = _kernel_indices(block_ids, length, pages, geometry).tolist()
    tokens = kernel_block_size(pages, geometry)
    for position in range(length):
        block, slot = index[position // tokens], position % tokens
        for head in range(geometry.kv_heads):
            if geometry.layout == "cpu":
                halves = pages[block, head].view(2, tokens * geometry.head_dim)
                halves[0].view(geometry.head_dim, tokens)[:, slot] = keys[0, head, position]
                halves[1].view(tokens, geometry.head_dim)[slot] = values[0, head, position]
            else:
                pages[0, block, slot, head] = keys[0, head, position]
                pages[1, block, slot, head] = values[0, head, position]
