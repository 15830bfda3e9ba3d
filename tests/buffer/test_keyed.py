"""The core's keyed store (``conduit.buffer.keyed``) over mapped row arrays (``conduit.buffer.mapped``):
fixed, ragged and object columns by key, growth, budgets and spill, and writes in place with a commit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit.batch import Ragged
from conduit.buffer.keyed import KeyedStore, Spec
from conduit.buffer.mapped import StaleLayoutError, read_mapped, write_mapped
from conduit.buffer.tiers import map_file
from conduit.errors import PlacementCapacityError, SchemaError


def ragged(lengths: list[int], start: int = 0) -> Ragged:
    return Ragged.from_lengths(torch.arange(start, start + sum(lengths)), torch.tensor(lengths))


def test_columns_by_key_round_trip_grow_and_clear(tmp_path):
    s = KeyedStore(default_tier="shm", directory=str(tmp_path))
    s.write(torch.tensor([7, 2]), {"r": ragged([3, 1]), "v": torch.tensor([0.5, 1.5]), "o": ["a", {"b": 1}]})
    s.write(
        torch.tensor([900]), {"r": ragged([200], start=50), "v": torch.tensor([9.0]), "o": ["c"]}
    )  # grows
    got = s.read(torch.tensor([900, 7]), ["r", "v", "o"])
    assert [x.tolist() for x in got["r"].values.split(got["r"].lengths.tolist())] == [
        list(range(50, 250)),
        [0, 1, 2],
    ]
    assert got["v"].tolist() == [9.0, 0.5] and got["o"] == ["c", "a"]
    s.clear(torch.tensor([7]))
    with pytest.raises(SchemaError, match=r"column 'r' is not stored for keys \[7\]"):
        s.read(torch.tensor([2, 7]), ["r"])
    with pytest.raises(SchemaError, match="column 'v' holds"):
        s.write(torch.tensor([3]), {"v": torch.tensor([1], dtype=torch.int64)})
    s.close()


def test_a_write_over_every_budget_changes_nothing():
    s = KeyedStore(default_tier="shm", budgets={"shm": 4096, "host": 0, "disk": 0})
    s.write(torch.tensor([0]), {"a": torch.tensor([1.0])})
    before = (s.stats(), dict(s.budgets.free))
    with pytest.raises(PlacementCapacityError, match=r"column 'b' needs \d+ bytes"):
        s.write(torch.tensor([0, 1]), {"a": torch.tensor([2.0, 3.0]), "b": ragged([1000, 1])})
    assert (s.stats(), dict(s.budgets.free)) == before and "b" not in s.columns
    assert s.read(torch.tensor([0]), ["a"])["a"].tolist() == [1.0]
    s.close()


def test_a_full_shm_budget_spills_to_the_next_tier():
    s = KeyedStore(default_tier="shm", budgets={"shm": 1024})
    s.write(torch.tensor([0]), {"r": ragged([4])})
    assert s.stats()["columns"]["r"]["tier"] == "host" and s.stats()["columns"]["r"]["spilled"]
    s.close()


def test_a_writer_fills_planned_rows_in_place_and_a_stale_plan_is_refused():
    s = KeyedStore(default_tier="shm")
    keys = torch.tensor([4, 5])
    plan_id, entries = s.plan_write(keys, {"r": (Spec(torch.int64, (), True), 3), "o": (Spec(None), 0)})
    assert set(entries) == {"r"}  # objects go with the commit, as data
    layout, rows = entries["r"]
    lengths = write_mapped(layout, torch.from_numpy(rows), ragged([3, 2]))
    with pytest.raises(SchemaError, match="not stored"):  # nothing visible before the commit
        s.read(keys, ["r"])
    assert s.commit(plan_id, keys, {"r": lengths.numpy()}, {"o": ["x", "y"]})
    layout, lengths, rows = s.read_plan(keys, ["r"], same_node=True)["r"]
    assert read_mapped(layout, rows, lengths).values.tolist() == [0, 1, 2, 3, 4]
    stale_id, stale = s.plan_write(torch.tensor([6]), {"r": (Spec(torch.int64, (), True), 1)})
    s.write(torch.tensor([7]), {"r": ragged([500])})  # grows into a new file
    with pytest.raises(StaleLayoutError, match="a row of 500 in rows of"):  # the old file's rows are short
        write_mapped(stale["r"][0], torch.from_numpy(stale["r"][1]), ragged([500]))
    assert not s.commit(stale_id, torch.tensor([6]), {"r": np.array([1])}, {})
    assert s.stats()["plans_refused"] == 1 and s.stats()["plans_open"] == 0
    s.close()


def test_map_file_leaves_nothing_behind_and_reserves_its_blocks(tmp_path):
    t, fd = map_file((4, 3), torch.float32, "disk", str(tmp_path), keep_open=True)
    assert t.shape == (4, 3) and not t.any() and fd >= 0 and not list(tmp_path.iterdir())
    import os

    os.close(fd)


def test_the_planner_keeps_the_most_read_column_in_shm_and_sends_the_other_to_disk():
    from conduit.placer import plan_mapped_tiers
    from conduit.topology import Link, Tier, Topology

    tiers = (
        Tier("n/host", "host", "n", 1 << 30),
        Tier("n/shm", "shm", "n", 1 << 30),
        Tier("n/disk", "disk", "n", 1 << 40),
    )
    speed = {"n/host": 10.0, "n/shm": 10.0, "n/disk": 0.5}  # GB/s out of each tier
    links = tuple(Link(a.name, b.name, min(speed[a.name], speed[b.name]), 5.0) for a in tiers for b in tiers)
    topo = Topology(tiers, links)
    sizes = {"read_often": 30_000, "read_once": 30_000}
    got = plan_mapped_tiers(sizes, {}, {"read_often": 9}, {"shm": 40_000}, topo)
    assert got == {"read_often": "shm", "read_once": "disk"}
    assert plan_mapped_tiers(sizes, {}, {}, {"shm": 0, "disk": 0}, topo) is None  # nothing fits: spill rule
