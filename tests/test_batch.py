import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit import ColumnBatch, Ragged


def _ragged(lengths: list[int], width: int = 0) -> Ragged:
    total = sum(lengths)
    shape = (total, width) if width else (total,)
    values = torch.arange(total * max(width, 1), dtype=torch.float32).view(shape)
    return Ragged.from_lengths(values, torch.tensor(lengths, dtype=torch.int64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=20), st.data())
def test_ragged_index_matches_per_item_reference(lengths, data):
    r = _ragged(lengths, width=3)
    idx = data.draw(st.lists(st.integers(0, len(lengths) - 1), min_size=0, max_size=30))
    got = r.index(torch.tensor(idx, dtype=torch.int64))
    items = [r.values[r.offsets[i] : r.offsets[i + 1]] for i in idx]
    assert got.lengths.tolist() == [lengths[i] for i in idx]
    expect = torch.cat(items) if items else torch.empty(0, 3)
    assert torch.equal(got.values, expect)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=15))
def test_ragged_padded_round_trip(lengths):
    r = _ragged(lengths)
    padded, mask = r.to_padded(max_len=10, pad_value=-1)
    assert padded.shape == (len(lengths), 10)
    assert mask.sum().item() == sum(lengths)
    assert (padded[~mask] == -1).all()
    back = Ragged.from_padded(padded, r.lengths)
    assert torch.equal(back.values, r.values) and torch.equal(back.offsets, r.offsets)


def test_slice_is_zero_copy_and_split_covers_everything():
    b = ColumnBatch({"x": torch.arange(10.0), "t": _ragged([1, 2, 3, 0, 1, 2, 3, 0, 1, 2])})
    s = b.slice(2, 5)
    assert s["x"].data_ptr() == b["x"][2:].data_ptr()
    parts = b.split(3)
    assert [p.size for p in parts] == [4, 3, 3]
    whole = ColumnBatch.cat(parts)
    assert torch.equal(whole["x"], b["x"])
    assert torch.equal(whole["t"].values, b["t"].values)


def test_consolidate_is_one_buffer_and_round_trips():
    b = ColumnBatch({"obs": torch.randn(5, 3), "act": torch.arange(5), "tok": _ragged([2, 0, 3, 1, 4])})
    c = b.consolidate()
    out = c.unpack()
    base = c.storage.data_ptr()
    for name in ("obs", "act"):
        assert torch.equal(out[name], b[name])
        assert base <= out[name].data_ptr() < base + c.nbytes
    assert torch.equal(out["tok"].values, b["tok"].values)
    assert torch.equal(out["tok"].offsets, b["tok"].offsets)
    assert torch.equal(c.to("cpu").unpack()["obs"], b["obs"])


def test_tensordict_round_trip_without_copies():
    b = ColumnBatch({"obs": torch.randn(4, 2), "tok": _ragged([1, 3, 0, 2])})
    td = b.to_tensordict()
    assert td.batch_size == torch.Size([4])
    assert td["obs"].data_ptr() == b["obs"].data_ptr()
    back = ColumnBatch.from_tensordict(td)
    assert back["obs"].data_ptr() == b["obs"].data_ptr()
    assert back["tok"].values.data_ptr() == b["tok"].values.data_ptr()
    assert torch.equal(back["tok"].offsets, b["tok"].offsets)
