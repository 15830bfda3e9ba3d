"""The backend builds and reads jagged nested tensors through torch's own fields (no dispatcher); the
result must be indistinguishable from the public ``nested_tensor_from_jagged`` for everything verl does."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transfer_queue")

from conduit_verl.tq_store.columns import column_of, field_of  # noqa: E402
from tensordict import TensorDict  # noqa: E402

import conduit.batch as columns  # noqa: E402
from conduit import Ragged  # noqa: E402
from conduit.buffer.columns import JAGGED, Column  # noqa: E402


def ragged(lengths: list[int], rest: tuple[int, ...] = (), dtype: torch.dtype = torch.float32) -> Ragged:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    values = torch.arange(int(offsets[-1]) * max(1, int(torch.tensor(rest).prod()) if rest else 1))
    return Ragged(values.to(dtype).view(int(offsets[-1]), *rest), offsets)


@pytest.mark.parametrize("rest", [(), (3,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_field_of_equals_the_public_constructor(rest, dtype):
    r = ragged([5, 1, 7, 3], rest, dtype)
    fast = field_of(Column(JAGGED, r))
    public = torch.nested.nested_tensor_from_jagged(r.values, r.offsets, min_seqlen=1, max_seqlen=7)
    assert columns._NESTED is not None  # this torch has the fields: the fast path ran
    assert type(fast) is type(public) and fast.layout == torch.jagged
    assert fast.shape[0] == public.shape[0] and fast.dim() == public.dim() and fast.dtype == dtype
    assert (fast._min_seqlen, fast._max_seqlen) == (1, 7)
    assert torch.equal(fast.values(), public.values()) and torch.equal(fast.offsets(), public.offsets())
    assert all(torch.equal(a, b) for a, b in zip(fast.unbind(), public.unbind(), strict=True))
    pad = torch.nested.to_padded_tensor(fast, 0)
    assert pad.shape == (4, 7, *rest)
    assert torch.equal(pad, torch.nested.to_padded_tensor(public, 0))
    td = TensorDict({"x": fast}, batch_size=4)  # what TransferQueue returns to verl
    assert torch.equal(torch.nested.to_padded_tensor(td["x"], -1), torch.nested.to_padded_tensor(public, -1))
    back = column_of("x", fast)  # and it reads back without a copy
    assert back.data.values.data_ptr() == r.values.data_ptr() and torch.equal(back.data.offsets, r.offsets)


def test_fallback_without_torch_internals_gives_the_same(monkeypatch):
    r = ragged([2, 0, 4])
    fast = field_of(Column(JAGGED, r))
    monkeypatch.setattr(columns, "_NESTED", None)
    slow = field_of(Column(JAGGED, r))
    assert (slow._min_seqlen, slow._max_seqlen) == (fast._min_seqlen, fast._max_seqlen) == (0, 4)
    assert all(torch.equal(a, b) for a, b in zip(fast.unbind(), slow.unbind(), strict=True))


def test_values_that_require_grad_keep_the_autograd_view():
    r = ragged([2, 3])
    r = Ragged(r.values.requires_grad_(), r.offsets)
    nt = field_of(Column(JAGGED, r))
    nt.values().sum().backward()
    assert r.values.grad is not None and torch.equal(r.values.grad, torch.ones(5))


def test_column_of_a_view_with_holes_is_compacted_first():
    dense = torch.arange(10.0).view(2, 5)
    starts, lengths = torch.tensor([1, 0]), torch.tensor([2, 3])
    holes = torch.nested.narrow(dense, 1, starts, lengths, layout=torch.jagged)  # explicit lengths
    assert holes._lengths is not None
    col = column_of("x", holes)
    assert col.data.lengths.tolist() == [2, 3]
    assert col.data.values.tolist() == [1.0, 2.0, 5.0, 6.0, 7.0]
