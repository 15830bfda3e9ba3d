"""gather_rows: the same result as torch.index_select on both of its paths, for any dtype and shape."""

from __future__ import annotations

import pytest
import torch

from conduit import BufferConfig, Column, ColumnBatch, Schema
from conduit.buffer.gather_kernels import GRAIN, _gather_bytes, gather_rows
from conduit.build_buffer import build_buffer

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int64, torch.uint8, torch.complex64]


def _data(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    raw = torch.randn(shape, generator=gen) * 100
    return raw > 0 if dtype == torch.bool else raw.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,n", [((50, 3), 7), ((4000, 40), 900), ((300, 2, 300), 64), ((70_000,), 40_000)]
)
def test_matches_index_select(dtype: torch.dtype, shape: tuple[int, ...], n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    src = _data(shape, dtype, gen)
    index = torch.randint(0, shape[0], (n,), generator=gen)  # with repeats
    want = src.index_select(0, index)
    assert torch.equal(gather_rows(src, index), want)
    out = torch.empty_like(want)
    got = gather_rows(src, index, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(out, want)


def test_large_gathers_take_the_kernel_small_ones_torch() -> None:
    src = torch.arange(4 * GRAIN, dtype=torch.float32).view(4, GRAIN)
    index = torch.tensor([3, 0, 3])
    assert torch.equal(gather_rows(src, index), src[index])  # kernel: 3 * GRAIN values
    assert torch.equal(gather_rows(src[:, :8], index), src[index, :8])  # non-contiguous source: torch
    assert gather_rows(src, index[:0]).shape == (0, GRAIN)


def test_every_dtype_and_shape_shares_one_compiled_kernel() -> None:
    """Rows travel as bytes, so a storage built (which warms the kernel) never compiles in a sample."""
    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        gather_rows(_data((3, GRAIN), dtype, gen), torch.tensor([2, 1]))
    assert len(_gather_bytes.signatures) == 1


def test_out_of_range_index_raises_and_writes_nothing_outside_out() -> None:
    src = torch.ones(3, GRAIN)
    with pytest.raises(IndexError):
        gather_rows(src, torch.tensor([0, 3]))
    with pytest.raises(IndexError):
        gather_rows(src, torch.tensor([-1]))


def test_buffer_samples_large_rows_exactly() -> None:
    schema = Schema([Column("obs", torch.float32, (4096,)), Column("act", torch.int64)])
    buf = build_buffer(BufferConfig(capacity=64, sampler="uniform"), schema, seed=0)
    obs = torch.randn(64, 4096)
    buf.extend(ColumnBatch({"obs": obs, "act": torch.arange(64)}))
    s = buf.sample(32)
    assert torch.equal(s.batch.columns["obs"], obs[s.slots])
    again = buf.sample(32, out=s.batch)
    assert torch.equal(again.batch.columns["obs"], obs[again.slots])
    assert torch.equal(again.batch.columns["act"], again.slots)
