"""The ragged rows' paths for an array on a device (the ``cuda`` tier): token positions, one scatter,
one gather. Pure torch, so they run here on CPU tensors against the CPU kernels they stand in for."""

from __future__ import annotations

import pytest
import torch

from conduit.buffer.ragged_kernels import (
    gather_prefixes,
    gather_tokens,
    scatter_prefixes,
    scatter_tokens,
    token_positions,
)
from conduit.errors import RaggedLengthError


def batch(lengths: list[int], rest: tuple[int, ...], dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    values = torch.randint(0, 1000, (int(offsets[-1]), *rest), generator=g).to(dtype)
    return offsets, values


def test_token_positions_by_hand():
    offsets = torch.tensor([0, 2, 2, 5])
    rows = torch.tensor([3, 0, 1])
    assert token_positions(rows, offsets, 4, torch.device("cpu")).tolist() == [12, 13, 4, 5, 6]


@pytest.mark.parametrize("rest", [(), (3,)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool, torch.bfloat16])
def test_scatter_and_gather_equal_the_cpu_kernels(rest, dtype):
    lengths = [5, 0, 7, 1, 7, 3]
    offsets, values = batch(lengths, rest, dtype)
    rows = torch.tensor([9, 2, 0, 5, 7, 1])
    mine = torch.zeros((10, 8, *rest), dtype=dtype)
    ref = mine.clone()
    scatter_tokens(mine, rows, offsets, values)
    scatter_prefixes(ref, rows, offsets, values)
    assert torch.equal(mine, ref)
    pick = torch.tensor([7, 9, 1])
    pick_offsets = torch.tensor([0, 7, 12, 15])
    out = torch.empty((15, *rest), dtype=dtype)
    assert torch.equal(gather_tokens(mine, pick, pick_offsets), gather_prefixes(ref, pick, pick_offsets, out))


def test_empty_batch_and_empty_rows():
    array = torch.arange(12).view(3, 4)
    none = torch.zeros(1, dtype=torch.int64)
    assert gather_tokens(array, torch.empty(0, dtype=torch.int64), none).numel() == 0
    assert gather_tokens(array, torch.tensor([1, 2]), torch.tensor([0, 0, 0])).numel() == 0
    scatter_tokens(array, torch.empty(0, dtype=torch.int64), none, torch.empty(0, dtype=torch.int64))
    assert torch.equal(array, torch.arange(12).view(3, 4))


def test_an_overlong_row_is_refused_and_nothing_written():
    array = torch.zeros(4, 3, dtype=torch.int64)
    offsets, values = batch([2, 4], (), torch.int64)
    with pytest.raises(RaggedLengthError, match="row of 4 tokens in rows of 3"):
        scatter_tokens(array, torch.tensor([0, 1]), offsets, values)
    assert not array.any()
