"""The frame store on the core's placement and checkpoints: its tier under a RAM budget, online migration
while frames are appended and read, incremental checkpoints, exact restores, torn files and saves that
run while frames are appended (64x64 uint8 frames, a few thousand of them)."""

from __future__ import annotations

import os
import shutil
import threading
import time

import numpy as np
import pytest
import torch
from conduit_rllib.frames import REPLAN_PARTS, FrameCodec, FrameStore

from conduit.errors import CheckpointError, PlacementCapacityError
from conduit.topology import Link, Tier, Topology

H = W = 64
FRAME_BYTES = H * W
GB = 10**9
_PIXELS = (np.arange(H)[:, None] * 3 + np.arange(W)[None, :]).astype(np.int64)


def frames_of(ids: np.ndarray) -> np.ndarray:
    """The frame of each id ``[n, H, W, 1]`` (uint8): its pixels are a function of the id only."""
    ids = np.asarray(ids, np.int64)
    return ((ids[:, None, None] * 7 + ids[:, None, None] // 256 + _PIXELS[None]) % 256).astype(np.uint8)[
        ..., None
    ]


class Reading:
    """A machine's free memory as the planner reads it: host fastest, shm a little slower, disk slow."""

    def __init__(self, host: int, shm: int = 100 * GB, disk: int = 1000 * GB) -> None:
        self.host, self.shm, self.disk = host, shm, disk

    def __call__(self) -> Topology:
        tiers = (
            Tier("node0/host", "host", "node0", self.host),
            Tier("node0/shm", "shm", "node0", self.shm),
            Tier("node0/disk", "disk", "node0", self.disk),
        )
        rate = {"node0/host": 10.0, "node0/shm": 8.0, "node0/disk": 0.5}
        links = tuple(
            Link(a.name, b.name, min(rate[a.name], rate[b.name]), 150.0 if "disk" in a.name + b.name else 5.0)
            for a in tiers
            for b in tiers
        )
        return Topology(tiers, links, "test reading")


def make_store(tmp_path, capacity: int, reading=None, budget=None, pins=None) -> FrameStore:
    return FrameStore(
        H,
        W,
        capacity,
        FrameCodec(normalized=False),
        memory_budget=budget,
        disk_path=str(tmp_path / "tier"),
        pins=pins,
        reading=reading or Reading(100 * GB),
    )


def fill(store: FrameStore, n: int, chunk: int = 64) -> None:
    start = store.appended
    for first in range(start, start + n, chunk):
        k = min(chunk, start + n - first)
        assert store.append(frames_of(np.arange(first, first + k))) == first


def check_stacks(store: FrameStore, ids: torch.Tensor) -> None:
    """Stacks of ``ids`` ``[B, F]`` are bit-identical to the frames appended under those ids."""
    got = store.stacks(ids)
    want = torch.from_numpy(frames_of(ids.reshape(-1).numpy())).view(*ids.shape, H, W).permute(0, 2, 3, 1)
    assert torch.equal(got, want)


def stored_ok(store: FrameStore) -> int:
    """Every written slot holds the frame of the id its generation names; returns the slots checked."""
    gen = store.storage.generation.clone()
    rows = torch.nonzero(gen > 0).flatten()
    want = torch.from_numpy(frames_of((gen[rows] - 1).numpy())[..., 0])
    assert torch.equal(store.storage.data["frame"][rows], want)
    return int(rows.numel())


# -- placement ----------------------------------------------------------------------------------


def test_the_budget_puts_frames_on_host_shm_or_disk(tmp_path):
    cap = 2000  # 8.2 MB of frames
    cases = [
        (dict(budget=None), "host"),
        (dict(budget=64 << 20), "host"),
        (dict(budget=1 << 20), "disk"),  # a budget too small for host
        (dict(budget=0), "disk"),
        (dict(reading=Reading(host=1 << 20)), "disk"),  # no budget: the machine's free memory is short
        (dict(budget=64 << 20, pins={"frame": "shm"}), "shm"),
    ]
    for kw, tier in cases:
        store = make_store(tmp_path, cap, **kw)
        assert store.tier == tier, kw
        fill(store, 300)
        check_stacks(store, torch.tensor([[0, 5, 17, 299], [3, 2, 1, 0]]))
        store.buffer.close()
    with pytest.raises(PlacementCapacityError, match="memory_budget"):
        make_store(tmp_path, cap, budget=1 << 20, pins={"frame": "shm"})  # shm is RAM: within the budget


def test_the_machines_own_reading_places_frames(tmp_path):
    """Without a given reading the planner reads this machine (``local_topology``)."""
    small = FrameStore(H, W, 1000, FrameCodec(False), memory_budget=1 << 20, disk_path=str(tmp_path))
    large = FrameStore(H, W, 1000, FrameCodec(False), memory_budget=1 << 30, disk_path=str(tmp_path))
    assert (small.tier, large.tier) == ("disk", "host")


# -- migration ----------------------------------------------------------------------------------


def test_frames_migrate_online_while_filling_and_stacks_stay_identical(tmp_path):
    """Frames start on disk (free memory short); as the store fills, a re-plan finds room and moves them
    to host, then a lower budget moves them back to disk; a reader checks stacks all along."""
    cap = 4096
    reading = Reading(host=1 << 20)
    store = make_store(tmp_path, cap, reading=reading)
    assert store.tier == "disk"
    fill(store, 256)
    reading.host = 100 * GB  # memory freed: the next fill milestone re-plans
    stop, errors, reads = threading.Event(), [], [0]

    def reader() -> None:
        g = torch.Generator().manual_seed(1)
        try:
            while not stop.is_set():
                top = store.appended
                lo = max(0, top - cap // 4)
                ids = torch.randint(lo, top, (32, 4), generator=g)
                check_stacks(store, ids)
                reads[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        fill(store, cap // REPLAN_PARTS, chunk=32)  # crosses a milestone: a background re-plan
        store.wait_placement(30)
        moved_up = store.tier
        fill(store, 256, chunk=32)
        report = store.replan("budget lowered", memory_budget=1 << 20)  # host -> disk, reader running
        fill(store, cap, chunk=96)  # the ring wraps on disk
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors[0]
    assert moved_up == "host" and store.tier == "disk" and report is not None
    assert [m.dst for m in report.migration.moves] == ["disk"]
    assert [h.migration.moves[0].dst for h in store.buffer.placer.history] == ["host", "disk"]
    assert reads[0] > 0 and stored_ok(store) == cap
    assert not store.placement_errors


def test_a_placement_that_still_fits_is_kept(tmp_path):
    """The reading counts the frames' own bytes as used: a full host keeps them where they are."""
    store = make_store(tmp_path, 2000, reading=Reading(host=100 * GB))
    store.reading = Reading(host=0)  # everything else took the free memory; the frames are already there
    assert store.replan("no room left") is None and store.tier == "host"


# -- checkpoints --------------------------------------------------------------------------------


def test_checkpoints_after_the_first_write_only_new_frames(tmp_path):
    cap = 8192  # 5 segments of 2,040 frames (8 MiB)
    store = make_store(tmp_path, cap)
    root = tmp_path / "ckpt"
    fill(store, 6000)
    first = store.checkpoint(root)
    assert first.bytes_written >= 6000 * FRAME_BYTES
    same = store.checkpoint(root)  # nothing new: index and metadata only
    assert same.segments_written == 0 and same.bytes_written < 64 << 10
    fill(store, 100)  # slots 6000..6099: one or two segments
    grown = store.checkpoint(root)
    assert 1 <= grown.segments_written <= 2
    assert grown.segments_linked == first.segments_written - grown.segments_written  # the rest linked
    assert grown.bytes_written < 2 * (8 << 20) + (64 << 10)
    assert grown.bytes_written < first.bytes_written / 2
    fill(store, 4000)  # wraps: every segment but one rewritten
    wrapped = store.checkpoint(root)
    assert wrapped.segments_written >= 3 and wrapped.bytes_written > 4000 * FRAME_BYTES
    linked = [p for p in os.scandir(wrapped.path) if p.name.startswith("seg-")]
    assert sum(os.stat(p.path).st_nlink > 1 for p in linked) == wrapped.segments_linked


def test_restore_is_exact_and_a_torn_checkpoint_is_detected(tmp_path):
    cap = 6000
    store = make_store(tmp_path, cap)
    root = tmp_path / "ckpt"
    fill(store, 5000)
    store.checkpoint(root)
    saved1 = {k: v.clone() for k, v in store.storage.state_dict().items()}
    fill(store, 3000)  # wraps
    second = store.checkpoint(root)
    saved2 = {k: v.clone() for k, v in store.storage.state_dict().items()}

    other = make_store(tmp_path, cap, reading=Reading(host=1 << 20))  # restored onto the disk tier
    assert other.tier == "disk" and other.restore(root) == second.path
    assert all(torch.equal(other.storage.state_dict()[k], v) for k, v in saved2.items())
    assert other.appended == store.appended
    check_stacks(other, torch.tensor([[7999, 7998, 5000, 2001]]))

    # a save killed before it was published leaves a temporary directory: never read, removed later
    (root / "ckpt-000003.tmp-999999-0").mkdir()
    (root / "ckpt-000003.tmp-999999-0" / "manifest.cdr").write_bytes(b"CDR1 partial")
    # a torn segment file of the newest checkpoint (one it wrote, not one linked from the first)
    fresh = [
        p for p in os.scandir(second.path) if p.name.startswith("seg-") and os.stat(p.path).st_nlink == 1
    ]
    with open(fresh[0].path, "r+b") as f:
        f.truncate(os.path.getsize(fresh[0].path) // 2)
    third = make_store(tmp_path, cap)
    assert third.restore(root).endswith("ckpt-000001")  # the torn one is skipped, the one before used
    assert all(torch.equal(third.storage.state_dict()[k], v) for k, v in saved1.items())

    with open(root / "ckpt-000001" / "manifest.cdr", "wb") as f:
        f.write(b"not a record at all")  # crafted
    fourth = make_store(tmp_path, cap)
    fill(fourth, 10)
    before = fourth.storage.data["frame"].clone()
    with pytest.raises(CheckpointError, match=r"truncated|bad magic") as e:
        fourth.restore(root)
    assert "ckpt-000002" in str(e.value) and "ckpt-000001" in str(e.value)
    assert torch.equal(fourth.storage.data["frame"], before) and fourth.appended == 10  # unchanged
    store.checkpoint(root)
    assert not (root / "ckpt-000003.tmp-999999-0").exists()


def test_a_checkpoint_of_another_shape_is_refused(tmp_path):
    store = make_store(tmp_path, 1000)
    fill(store, 10)
    store.checkpoint(tmp_path / "ckpt")
    other = FrameStore(32, 32, 1000, FrameCodec(False), reading=Reading(100 * GB))
    with pytest.raises(CheckpointError, match="does not fit"):
        other.restore(tmp_path / "ckpt")


def test_appends_and_checkpoints_in_two_threads_do_not_corrupt(tmp_path):
    """A writer thread appends (the ring wraps twice) while the main thread saves; every checkpoint
    restores to frames that are exactly the frames of the ids their slots record, none missing."""
    cap = 3000
    store = make_store(tmp_path, cap)
    fill(store, 500)
    root, done, errors = tmp_path / "ckpt", threading.Event(), []

    def writer() -> None:
        try:
            for _ in range(2 * cap // 20):
                fill(store, 20, chunk=20)
                time.sleep(0.005)  # a few seconds of appends: several saves run meanwhile
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    reports = []
    while not done.is_set():
        reports.append(store.checkpoint(root))
    t.join(60)
    assert not errors, errors[0]
    final = store.appended
    assert len({r.inserted for r in reports}) >= 3 and any(r.inserted < final for r in reports[-3:])
    for r in reports[-3:]:  # the kept ones, each restored alone
        alone = tmp_path / f"alone-{r.inserted}"
        shutil.copytree(r.path, alone / os.path.basename(r.path))
        other = make_store(tmp_path, cap)
        other.restore(alone)
        assert other.appended == r.inserted
        assert stored_ok(other) == min(r.inserted, cap)  # every slot its id's frame, none missing
        other.buffer.close()
