"""A RAM budget for the planner (``BufferConfig.memory_budget``), re-planning on a new reading of free
memory (``Placer.replan``), and checkpoints that hard-link every unchanged segment (``independent=False``)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from conduit import Column, Schema
from conduit.batch import ColumnBatch
from conduit.build_buffer import build_buffer
from conduit.config import BufferConfig
from conduit.errors import ConfigError, PlacementCapacityError
from conduit.persist import save_checkpoint
from conduit.placer import within_memory_budget
from conduit.topology import Link, Tier, Topology

MB = 10**6
GB = 10**9
SCHEMA = Schema([Column("id", torch.int64), Column("obs", torch.float32, (250,))])  # 1,008 bytes a row


def reading(host: int, shm: int = 100 * GB, pinned: bool = False) -> Topology:
    names = ["host", "shm", "disk"] + (["pinned"] if pinned else [])
    caps = {"host": host, "shm": shm, "disk": 1000 * GB, "pinned": host}
    tiers = tuple(Tier(f"node0/{n}", n, "node0", caps[n]) for n in names)
    rate = {"host": 10.0, "shm": 8.0, "disk": 0.5, "pinned": 9.0}
    links = tuple(
        Link(a.name, b.name, min(rate[a.kind], rate[b.kind]), 150.0 if "disk" in (a.kind, b.kind) else 5.0)
        for a in tiers
        for b in tiers
    )
    return Topology(tiers, links, "test")


def _rows(first: int, n: int) -> ColumnBatch:
    ids = torch.arange(first, first + n)
    return ColumnBatch({"id": ids, "obs": ids[:, None].float().repeat(1, 250)})


def test_budget_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="memory_budget must be an int"):
        BufferConfig(memory_budget=-1)
    with pytest.raises(ConfigError, match="tier='auto'"):
        BufferConfig(tier="host", memory_budget=1 << 20)


def test_the_budget_caps_ram_and_the_rest_goes_to_disk(tmp_path) -> None:
    cfg = BufferConfig(capacity=10_000, disk_path=str(tmp_path))  # obs: 10 MB, id: 80 kB
    placed = {}
    for budget in (None, 20 * MB, 1 * MB, 0):
        buf = build_buffer(dataclasses.replace(cfg, memory_budget=budget), SCHEMA, topology=reading(GB))
        placed[budget] = dict(buf.storage.tiers)
    assert placed[None] == placed[20 * MB] == {"id": "host", "obs": "host"}
    assert placed[1 * MB] == {"id": "host", "obs": "disk"}  # the small column stays in memory
    assert placed[0] == {"id": "disk", "obs": "disk"}


def test_under_a_budget_only_host_and_pinned_ram_tiers_are_planned() -> None:
    topo = within_memory_budget(reading(GB, pinned=True), 5 * MB)
    assert {t.kind: t.capacity_bytes for t in topo.tiers} == {"host": 5 * MB, "disk": 1000 * GB}
    kept = within_memory_budget(reading(GB), 5 * MB, pins={"obs": "shm"}, pinned_bytes=2 * MB)
    assert {t.kind: t.capacity_bytes for t in kept.tiers}["host"] == 3 * MB and "shm" in {
        t.kind for t in kept.tiers
    }
    with pytest.raises(PlacementCapacityError, match="memory_budget"):
        within_memory_budget(reading(GB), 1 * MB, pins={"obs": "shm"}, pinned_bytes=2 * MB)


def test_replan_reads_free_memory_again_and_counts_the_buffers_own_bytes(tmp_path) -> None:
    buf = build_buffer(
        BufferConfig(capacity=10_000, disk_path=str(tmp_path)), SCHEMA, topology=reading(1 * MB)
    )
    assert buf.storage.tiers["obs"] == "disk"
    buf.extend(_rows(0, 3000))
    placer = buf.placer
    assert placer is not None
    moved = placer.replan(reading(GB), "memory freed")  # type: ignore[attr-defined]
    assert moved is not None and buf.storage.tiers["obs"] == "host"
    assert placer.replan(reading(0), "no free memory left") is None  # type: ignore[attr-defined]
    assert buf.storage.tiers["obs"] == "host"  # its own bytes count: it still fits where it is
    placer.memory_budget = 1 * MB  # type: ignore[attr-defined]
    assert placer.replan(reading(GB), "budget lowered") is not None  # type: ignore[attr-defined]
    assert buf.storage.tiers["obs"] == "disk"
    out = buf.storage.read(torch.arange(3000))
    assert torch.equal(out.columns["obs"], _rows(0, 3000).columns["obs"])


def test_checkpoints_that_link_unchanged_segments_write_only_new_ones(tmp_path) -> None:
    buf = build_buffer(BufferConfig(capacity=40_000, tier="host"), SCHEMA)  # ~40 MB: 5 segments
    buf.extend(_rows(0, 30_000))
    first = save_checkpoint(buf, tmp_path, independent=False)
    buf.extend(_rows(30_000, 100))
    linked = save_checkpoint(buf, tmp_path, independent=False)
    assert linked.segments_written == 1 and linked.segments_linked == first.segments_written - 1
    assert linked.bytes_written < first.bytes_written / 4
    buf.extend(_rows(30_100, 100))
    copied = save_checkpoint(buf, tmp_path)  # the default keeps a second file of each segment
    assert copied.segments_linked < copied.segments_reused
    segs = [e for e in os.scandir(linked.path) if e.name.startswith("seg-")]
    assert sum(os.stat(e.path).st_nlink > 1 for e in segs) >= linked.segments_linked
