"""One-pass ragged row copies in and out of a slot-padded array, against the per-row reference."""

from __future__ import annotations

import pytest
import torch

from conduit.buffer.ragged_kernels import gather_prefixes, scatter_prefixes


def _offsets(lengths: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    out[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    return out


def _values(n: int, rest: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((n, *rest), generator=g) * 100).to(dtype)


CASES = [
    (torch.int64, ()),
    (torch.float32, ()),
    (torch.bool, ()),
    (torch.bfloat16, ()),
    (torch.float32, (3,)),  # 12-byte tokens: 4-byte words
    (torch.uint8, (3,)),  # 3-byte tokens: byte copies
]


@pytest.mark.parametrize(("dtype", "rest"), CASES)
def test_scatter_then_gather_equals_per_row_copies(dtype, rest):
    rows, max_len = 9, 7
    array = _values(rows * max_len, rest, dtype, 0).view(rows, max_len, *rest).clone()
    before = array.clone()
    slots = torch.tensor([4, 0, 8, 2])
    lengths = [3, 0, 7, 1]
    offsets = _offsets(lengths)
    values = _values(int(offsets[-1]), rest, dtype, 1)
    scatter_prefixes(array, slots, offsets, values)
    want = before.clone()
    for i, (s, n) in enumerate(zip(slots.tolist(), lengths)):
        want[s, :n] = values[int(offsets[i]) : int(offsets[i]) + n]
    assert torch.equal(array, want)  # the prefixes written, nothing else touched

    order = torch.tensor([2, 8, 4, 4, 0])
    got_lengths = [1, 7, 3, 2, 0]
    got_offsets = _offsets(got_lengths)
    out = torch.full((int(got_offsets[-1]), *rest), 1, dtype=dtype)
    gather_prefixes(array, order, got_offsets, out)
    ref = torch.cat([array[s, :n] for s, n in zip(order.tolist(), got_lengths)])
    assert torch.equal(out, ref)


def test_out_of_range_slot_and_overlong_row_raise_and_scatter_writes_nothing():
    array = torch.zeros(4, 3, dtype=torch.int64)
    with pytest.raises(IndexError, match="slot out of range"):
        scatter_prefixes(array, torch.tensor([1, 4]), _offsets([1, 1]), torch.ones(2, dtype=torch.int64))
    with pytest.raises(IndexError, match="longer than the array's max_len"):
        scatter_prefixes(array, torch.tensor([1, 2]), _offsets([1, 4]), torch.ones(5, dtype=torch.int64))
    assert int(array.abs().sum()) == 0  # checked before the first byte moved
    with pytest.raises(IndexError, match="slot out of range"):
        gather_prefixes(array, torch.tensor([-1]), _offsets([1]), torch.empty(1, dtype=torch.int64))


def test_mismatched_inputs_are_named():
    array = torch.zeros(4, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="do not match"):
        scatter_prefixes(array, torch.tensor([0]), _offsets([1]), torch.ones(1, dtype=torch.float32))
    with pytest.raises(ValueError, match="offsets end at 2, values hold 3"):
        scatter_prefixes(array, torch.tensor([0]), _offsets([2]), torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="2 offsets for 2 slots"):
        gather_prefixes(array, torch.tensor([0, 1]), _offsets([1]), torch.empty(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="contiguous"):
        gather_prefixes(array.t(), torch.tensor([0]), _offsets([1]), torch.empty(1, dtype=torch.int64))


def test_copy_segments_checks_every_segment_before_copying():
    from conduit.buffer.ragged_kernels import copy_segments

    src = torch.arange(10, dtype=torch.int64)
    dst = torch.zeros(6, dtype=torch.int64)
    copy_segments(src, torch.tensor([7, 0]), dst, torch.tensor([0, 3]), torch.tensor([3, 2]))
    assert dst.tolist() == [7, 8, 9, 0, 1, 0]
    with pytest.raises(IndexError, match="outside its tensor"):
        copy_segments(src, torch.tensor([0, 9]), dst, torch.tensor([0, 3]), torch.tensor([1, 2]))
    assert dst.tolist() == [7, 8, 9, 0, 1, 0]  # the good first segment was not copied either


@pytest.mark.parametrize(("dtype", "rest"), CASES)
def test_ragged_index_on_cpu_equals_per_item_slices(dtype, rest):
    from conduit import Ragged

    lengths = [4, 0, 2, 7, 1]
    offsets = _offsets(lengths)
    r = Ragged(_values(int(offsets[-1]), rest, dtype, 3), offsets)
    idx = torch.tensor([3, 3, 0, 1, 4])
    got = r.index(idx)
    want = torch.cat([r.values[int(offsets[i]) : int(offsets[i + 1])] for i in idx.tolist()])
    assert torch.equal(got.values, want)
    assert got.lengths.tolist() == [lengths[i] for i in idx.tolist()]


@pytest.mark.parametrize(("dtype", "rest"), CASES)
def test_the_buffers_ragged_read_equals_the_padded_gather_and_mask(dtype, rest):
    from conduit import Ragged
    from conduit.buffer.gather_kernels import gather_rows
    from conduit.buffer.storage import _read_ragged

    rows, max_len = 11, 6
    data = _values(rows * max_len, rest, dtype, 5).view(rows, max_len, *rest).contiguous()
    at = torch.tensor([3, 0, 10, 3, 7])
    lengths = torch.tensor([6, 0, 2, 6, 1])
    got = _read_ragged(data, at, lengths)
    want = Ragged.from_padded(gather_rows(data, at), lengths)
    assert torch.equal(got.offsets, want.offsets) and torch.equal(got.values, want.values)
