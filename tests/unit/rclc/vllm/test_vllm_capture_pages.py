"""Page extraction for both supported layouts, on synthetic pools (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch

from rclc.vllm.capture.pages import PageGeometry, gather_prompt, kernel_block_size, scatter_prompt

HEADS, DIM = 2, 8


def _pool(layout: str, blocks: int, tokens: int, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    if layout == "cpu":
        shape = (blocks, HEADS, tokens, 2 * DIM)
    else:
        shape = (2, blocks, tokens, HEADS, DIM)
    return torch.randn(shape, generator=generator).to(dtype)


def _prompt(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(length)
    keys = torch.randn(1, HEADS, length, DIM, generator=generator)
    values = torch.randn(1, HEADS, length, DIM, generator=generator)
    return keys, values


@pytest.mark.parametrize("layout", ["cpu", "flash"])
@pytest.mark.parametrize("tensor_tokens", [4, 8])  # kernel blocks equal to, or half of, scheduler blocks
@pytest.mark.parametrize("length", [1, 7, 8, 19])
def test_gather_returns_what_was_written(layout, tensor_tokens, length):
    block_size = 8
    geometry = PageGeometry(layout, HEADS, DIM, block_size, torch.float32)
    pool = _pool(layout, blocks=12 * (block_size // tensor_tokens), tokens=tensor_tokens)
    block_ids = [5, 2, 9, 3]
    keys, values = _prompt(length)
    scatter_prompt(pool, geometry, block_ids, keys, values)
    before = pool.clone()
    got_keys, got_values = gather_prompt(pool, geometry, block_ids, length)
    assert torch.equal(got_keys, keys) and torch.equal(got_values, values)
    assert got_keys.is_contiguous() and got_values.is_contiguous()
    # A copy: the pool is untouched, and writing the result cannot reach the pool.
    assert torch.equal(pool, before)
    got_keys.add_(1.0)
    got_values.zero_()
    assert torch.equal(pool, before)


def test_cpu_layout_stores_keys_dimension_major_and_values_token_major():
    """The CPU kernel's slab: keys as [dim, tokens], then values as [tokens, dim]."""
    geometry = PageGeometry("cpu", HEADS, DIM, 4, torch.float32)
    pool = torch.zeros(3, HEADS, 4, 2 * DIM)
    keys = torch.arange(HEADS * 4 * DIM, dtype=torch.float32).view(1, HEADS, 4, DIM)
    values = -keys
    scatter_prompt(pool, geometry, [1], keys, values)
    slab = pool[1, 0].reshape(-1)
    assert torch.equal(slab[: 4 * DIM].view(DIM, 4), keys[0, 0].T)
    assert torch.equal(slab[4 * DIM :].view(4, DIM), values[0, 0])


def test_bf16_pages_round_trip():
    geometry = PageGeometry("flash", HEADS, DIM, 4, torch.bfloat16)
    pool = _pool("flash", 6, 4, torch.bfloat16)
    keys, values = (t.to(torch.bfloat16) for t in _prompt(6))
    scatter_prompt(pool, geometry, [1, 4], keys, values)
    got = gather_prompt(pool, geometry, [1, 4], 6)
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], keys) and torch.equal(got[1], values)


@pytest.mark.parametrize(
    ("block_ids", "length", "message"),
    [
        ([3], 9, "need 2 blocks"),
        ([0, 3], 9, "null block"),
        ([3, 3], 9, "duplicate"),
        ([3, 40], 9, "outside the pool"),
    ],
)
def test_bad_block_tables_are_refused(block_ids, length, message):
    geometry = PageGeometry("cpu", HEADS, DIM, 8, torch.float32)
    with pytest.raises(ValueError, match=message):
        gather_prompt(_pool("cpu", 10, 8), geometry, block_ids, length)


def test_shape_dtype_and_finiteness_are_checked():
    geometry = PageGeometry("flash", HEADS, DIM, 8, torch.float32)
    with pytest.raises(ValueError, match="flash layout expects"):
        kernel_block_size(_pool("cpu", 4, 8), geometry)
    with pytest.raises(ValueError, match="dtype"):
        kernel_block_size(_pool("flash", 4, 8, torch.float16), geometry)
    with pytest.raises(ValueError, match="does not divide"):
        kernel_block_size(_pool("flash", 4, 3), geometry)
    pool = _pool("flash", 4, 8)
    pool[0, 2, 1, 0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        gather_prompt(pool, geometry, [2], 5)


def test_geometry_is_validated():
    with pytest.raises(ValueError, match="layout"):
        PageGeometry("paged", HEADS, DIM, 8, torch.float32)
    with pytest.raises(ValueError, match="block_size"):
        PageGeometry("cpu", HEADS, DIM, 0, torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        PageGeometry("cpu", HEADS, DIM, 8, torch.int8)
