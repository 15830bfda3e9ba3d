"""The TQ store's writes are all or nothing, its keys are range-checked, and its per-key tables are as
large as the keys held, not as the largest key (issue 26, item 14)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")
from conduit_verl.errors import StorageBackendError  # noqa: E402
from conduit_verl.tq_store.columns import column_of  # noqa: E402
from conduit_verl.tq_store.store import NodeStore  # noqa: E402

from conduit.buffer.columns import to_wire  # noqa: E402
from conduit.buffer.mapped import write_mapped  # noqa: E402

MAX_GLOBAL_INDEX = 2**31  # store.MAX_GLOBAL_INDEX
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def jagged(lengths: list[int], start: int = 0) -> torch.Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return torch.nested.nested_tensor_from_jagged(torch.arange(start, start + int(offsets[-1])), offsets)


def wire(name: str, value) -> tuple:
    return to_wire(column_of(name, value))


def values(s: NodeStore, name: str, keys: list[int]) -> list:
    """What field ``name`` holds for ``keys``, straight from its array (None: not stored)."""
    field = s.fields[name]
    slots = torch.tensor(keys)
    missing = set(field.missing(slots))
    present = [k for k in keys if k not in missing]
    got = field.read(torch.tensor(present, dtype=torch.int64)) if present else []
    got = got.tolist() if isinstance(got, torch.Tensor) else list(got)
    out = dict(zip(present, got))
    return [out.get(k) for k in keys]


def snapshot(s: NodeStore) -> tuple:
    return s.stats(), dict(s.budgets.free), values(s, "a", [0, 1, 2])


@pytest.fixture
def store():
    """Field ``a`` (scalars) holds key 0; ``shm`` holds 4 KiB, no other tier has room."""
    s = NodeStore(default_tier="shm", budgets={"shm": 4096, "host": 0, "disk": 0})
    s.put(np.array([0]), {"a": wire("a", torch.tensor([1.0]))})
    yield s
    s.close()


def test_an_over_budget_put_writes_no_field(store):
    before = snapshot(store)
    big = {"a": wire("a", torch.tensor([2.0, 3.0])), "b": wire("b", jagged([1000, 1]))}  # b: 512 KB
    with pytest.raises(StorageBackendError, match=r"field 'b' needs \d+ bytes"):
        store.put(np.array([0, 1]), big)
    assert snapshot(store) == before, "a field of a refused put was written"
    assert "b" not in store.fields


@pytest.mark.parametrize(
    "offsets, match",
    [
        ([0, 2, 5], "offsets must run from 0 to the 3 values"),  # past the values
        ([0, 3, 1], "offsets must run from 0"),  # going back
        ([1, 2, 3], "offsets must run from 0"),  # not from 0
    ],
)
def test_a_put_with_bad_offsets_writes_no_field(store, offsets, match):
    before = snapshot(store)
    bad = ("jagged", "torch.int64", np.arange(3), np.array(offsets, dtype=np.int64))
    with pytest.raises(StorageBackendError, match=f"field 'b': jagged {match}"):
        store.put(np.array([0, 1]), {"a": wire("a", torch.tensor([2.0, 3.0])), "b": bad})
    assert snapshot(store) == before
    assert "b" not in store.fields


def test_a_malformed_column_is_refused_before_any_field(store):
    before = snapshot(store)
    two_d = ("scalar", "torch.float32", np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(StorageBackendError, match="field 'b': a scalar column is 1-d"):
        store.put(np.array([0, 1]), {"a": wire("a", torch.tensor([2.0, 3.0])), "b": two_d})
    wrong = ("scalar", "torch.float32", np.zeros(2, dtype=np.int64))  # the bytes are not what it says
    with pytest.raises(StorageBackendError, match="field 'b': a torch.float32 column travels as float32"):
        store.put(np.array([0, 1]), {"a": wire("a", torch.tensor([2.0, 3.0])), "b": wrong})
    assert snapshot(store) == before


def test_a_commit_whose_data_fields_do_not_fit_makes_nothing_of_the_plan_visible(tmp_path):
    s = NodeStore(placement={"values": "host"}, budgets={"host": 0, "disk": 0}, default_tier="shm")
    gis = np.array([0, 1])
    cols = {
        "responses": column_of("responses", jagged([3, 2])),
        "values": column_of("values", jagged([3, 2])),
    }
    plan_id, entries = s.write_plan(gis, {f: c.plan_spec() for f, c in cols.items()}, same_node=True)
    assert set(entries) == {"responses"}  # values is pinned to host: it goes with the commit, as data
    layout, rows = entries["responses"]
    lengths = write_mapped(layout, torch.from_numpy(rows), cols["responses"].data).numpy()
    with pytest.raises(StorageBackendError, match=r"field 'values' needs \d+ bytes"):
        s.commit(plan_id, gis, {"responses": lengths}, {"values": to_wire(cols["values"])})
    assert s.fields["responses"].missing(torch.from_numpy(gis)) == [0, 1], "the plan's field became visible"
    assert int(s.fields["responses"].used.sum()) == 0  # its rows are free again
    assert "values" not in s.fields and s.stats()["plans_open"] == 0
    s.close()


def test_a_write_plan_that_does_not_fit_reserves_nothing():
    s = NodeStore(default_tier="shm", budgets={"shm": 4096, "host": 0, "disk": 0})
    cols = {"a": column_of("a", jagged([2, 2])), "b": column_of("b", jagged([1000, 1]))}
    with pytest.raises(StorageBackendError, match=r"field 'b' needs \d+ bytes"):
        s.write_plan(np.array([0, 1]), {f: c.plan_spec() for f, c in cols.items()}, same_node=True)
    assert not s.fields and s.stats()["plans_open"] == 0 and s.budgets.free["shm"] == 4096
    s.close()


@pytest.mark.parametrize("key", [-1, -(2**40), MAX_GLOBAL_INDEX, 2**40])
def test_keys_outside_the_range_are_refused_naming_the_key(store, key):
    before = snapshot(store)
    gis = np.array([1, key])
    for call in (
        lambda: store.put(gis, {"a": wire("a", torch.tensor([2.0, 3.0]))}),
        lambda: store.get(gis, ["a"]),
        lambda: store.read_plan(gis, ["a"], True),
        lambda: store.clear(gis),
        lambda: store.write_plan(gis, {"a": ("scalar", "torch.float32", (), 0)}, True),
    ):
        with pytest.raises(
            StorageBackendError, match=rf"global index {key} is outside \[0, {MAX_GLOBAL_INDEX}\)"
        ):
            call()
    assert snapshot(store) == before


def test_keys_twice_in_one_put_are_refused(store):
    before = snapshot(store)
    with pytest.raises(StorageBackendError, match="names some of its 2 global indexes twice"):
        store.put(np.array([1, 1]), {"a": wire("a", torch.tensor([2.0, 3.0]))})
    assert snapshot(store) == before


def test_a_large_key_costs_memory_for_the_keys_held_not_for_its_value():
    psutil = pytest.importorskip("psutil")
    s = NodeStore(default_tier="host")
    rss = psutil.Process().memory_info().rss
    keys = np.array([150_000_000, 3])  # (a table as long as the largest key took 1.2 GB here)
    s.put(keys, {"a": wire("a", torch.tensor([1.0, 2.0])), "r": wire("r", jagged([2, 1]))})
    grown = psutil.Process().memory_info().rss - rss
    assert grown < 64 << 20, f"{grown >> 20} MiB for two keys"
    top = MAX_GLOBAL_INDEX - 1  # the largest key allowed: no dearer
    s.put(np.array([top]), {"a": wire("a", torch.tensor([7.0])), "r": wire("r", jagged([1]))})
    assert psutil.Process().memory_info().rss - rss < 64 << 20
    assert s.fields["a"].index.nbytes == 3 * 16
    assert s.get(np.array([top, 150_000_000]), ["a"])["a"][2].tolist() == [7.0, 1.0]
    s.clear(np.array([150_000_000]))
    assert s.fields["a"].missing(torch.tensor([150_000_000, 3, top])) == [150_000_000]
    s.close()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "remove"]),
            st.lists(st.integers(0, 40), max_size=8, unique=True),
        ),
        max_size=12,
    )
)
def test_the_key_index_maps_keys_as_a_dict_does(ops):
    from conduit_verl.tq_store.store import MAX_GLOBAL_INDEX as bound

    from conduit.buffer.rows import KeyIndex

    assert bound == MAX_GLOBAL_INDEX
    index, model = KeyIndex(), {}
    for n, (op, keys) in enumerate(ops):
        slots = torch.tensor(keys, dtype=torch.int64)
        if op == "set":
            rows = torch.arange(len(keys), dtype=torch.int64) + 100 * n
            index.set(slots, rows)
            model.update(zip(keys, rows.tolist()))
        else:
            gone = index.remove(slots)
            assert sorted(gone.tolist()) == sorted(model.pop(k) for k in keys if k in model)
        probe = torch.arange(45)
        assert index.find(probe).tolist() == [model.get(k, -1) for k in range(45)]
        assert index.keys.tolist() == sorted(model)
