import multiprocessing as mp
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit import (
    BufferConfig,
    Column,
    ColumnBatch,
    InsufficientDataError,
    Ragged,
    RateLimit,
    Schema,
    ShapeError,
    StaleDataError,
)
from conduit.build_buffer import build_buffer

SCHEMA = Schema([Column("id", torch.int64), Column("obs", torch.float32, (3,))])
TOK = Schema([Column("id", torch.int64), Column("tok", torch.int32, ragged=True, max_len=6)])


def ids(start: int, n: int) -> ColumnBatch:
    i = torch.arange(start, start + n)
    return ColumnBatch({"id": i, "obs": i.float().unsqueeze(1).repeat(1, 3)})


@pytest.mark.parametrize("tier", ["host", "shm", "disk"])
def test_tiers_store_and_return_what_was_written(tier, tmp_path):
    b = build_buffer(BufferConfig(capacity=8, tier=tier, disk_path=str(tmp_path), sampler="fifo"), SCHEMA)
    b.extend(ids(0, 5))
    s = b.sample(5)
    assert s.batch["id"].tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(s.batch["obs"][:, 0], s.batch["id"].float())
    if tier == "shm":
        assert b.storage.data["obs"].is_shared()


def _child_writes(t: torch.Tensor) -> None:
    t[0, 0] = 42.0


def test_shm_tier_is_shared_across_processes_without_copies():
    b = build_buffer(BufferConfig(capacity=4, tier="shm"), SCHEMA)
    p = mp.get_context("fork").Process(target=_child_writes, args=(b.storage.data["obs"],))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert b.storage.data["obs"][0, 0].item() == 42.0


def test_ring_overwrites_oldest():
    b = build_buffer(BufferConfig(capacity=4), SCHEMA)
    b.extend(ids(0, 3))
    b.extend(ids(3, 3))
    assert sorted(b.storage.data["id"].tolist()) == [2, 3, 4, 5]
    assert len(b) == 4 and b.inserted == 6


def test_ragged_storage_round_trip_and_growth():
    b = build_buffer(BufferConfig(capacity=4, sampler="fifo"), TOK)
    tok = Ragged.from_lengths(torch.arange(9, dtype=torch.int32), torch.tensor([2, 3, 4]))
    b.extend(ColumnBatch({"id": torch.arange(3), "tok": tok}))
    b.grow_column("tok", 10)
    long = Ragged.from_lengths(torch.arange(10, dtype=torch.int32), torch.tensor([10]))
    b.extend(ColumnBatch({"id": torch.tensor([3]), "tok": long}))
    out = b.sample(4).batch["tok"]
    assert out.lengths.tolist() == [2, 3, 4, 10]
    assert torch.equal(out.values, torch.cat([tok.values, long.values]))


def test_grouped_writer_refuses_partial_groups_whole():
    b = build_buffer(BufferConfig(capacity=8, writer="grouped", group_size=4), SCHEMA)
    b.extend(ids(0, 8))
    with pytest.raises(ShapeError, match="last group has 2 items"):
        b.extend(ids(8, 6))
    assert b.inserted == 8 and sorted(b.storage.data["id"].tolist()) == list(range(8))


def test_grouped_writes_are_never_seen_half_done():
    b = build_buffer(BufferConfig(capacity=64, writer="grouped", group_size=8), SCHEMA)
    b.extend(ids(0, 8))
    stop = threading.Event()
    seen_partial = []

    def reader() -> None:
        while not stop.is_set():
            got = b.sample(64).batch["id"]
            groups = torch.unique(got // 8)
            # every group present in storage must be complete: all 8 ids of the group are written
            stored = b.storage.data["id"][: min(b.inserted, 64)]
            for g in groups.tolist():
                if int(((stored // 8) == g).sum()) % 8:
                    seen_partial.append(g)

    t = threading.Thread(target=reader)
    t.start()
    for k in range(1, 40):
        b.extend(ids(8 * k, 8))
    stop.set()
    t.join()
    assert not seen_partial


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12), st.integers(1, 5))
def test_fifo_delivers_every_item_exactly_once_in_order(puts, take):
    b = build_buffer(BufferConfig(capacity=16, sampler="fifo", rate_limit=RateLimit(mode="error")), SCHEMA)
    seen: list[int] = []
    nxt = 0
    for n in puts:
        while len(b) + n > 16:
            seen += b.sample(min(take, len(b))).batch["id"].tolist()
        b.extend(ids(nxt, n))
        nxt += n
    while len(b):
        seen += b.sample(min(take, len(b))).batch["id"].tolist()
    assert seen == list(range(nxt))


def test_fifo_refuses_to_overwrite_unconsumed_items():
    b = build_buffer(BufferConfig(capacity=4, sampler="fifo", rate_limit=RateLimit(mode="error")), SCHEMA)
    b.extend(ids(0, 3))
    with pytest.raises(InsufficientDataError, match="only 1 free slots"):
        b.extend(ids(3, 2))
    assert b.sample(3).batch["id"].tolist() == [0, 1, 2]


def test_fifo_versions_and_staleness_error_mode():
    cfg = BufferConfig(capacity=16, sampler="fifo", rate_limit=RateLimit(mode="error", max_staleness=1))
    b = build_buffer(cfg, SCHEMA)
    b.extend(ids(0, 2), version=0)
    b.extend(ids(2, 2), version=2)
    with pytest.raises(StaleDataError, match="version 0"):
        b.sample(2, version=2)
    assert len(b) == 4  # nothing consumed by the refused read
    assert b.sample(2, version=1).versions.tolist() == [0, 0]
    assert b.sample(2, version=3).versions.tolist() == [2, 2]


def test_fifo_staleness_block_mode_evicts_and_counts():
    cfg = BufferConfig(capacity=16, sampler="fifo", rate_limit=RateLimit(max_staleness=0))
    b = build_buffer(cfg, SCHEMA)
    b.extend(ids(0, 3), version=0)
    b.extend(ids(3, 3), version=1)
    s = b.sample(3, version=1)
    assert s.batch["id"].tolist() == [3, 4, 5]
    assert b.metrics.totals()["count/stale_evicted"] == 3


def test_prioritized_distribution_follows_priorities():
    b = build_buffer(BufferConfig(capacity=4, sampler="prioritized", alpha=1.0, beta=1.0), SCHEMA, seed=0)
    b.extend(ids(0, 4))
    s = b.sample(4)
    order = torch.argsort(s.slots)
    b.update_priorities(s.slots[order], s.generations[order], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    counts = torch.zeros(4)
    for _ in range(200):
        got = b.sample(500)
        counts += torch.bincount(got.slots, minlength=4)
        # w_i = (P_i / P_min)^-beta: the smallest priority has weight 1
        expect_w = (got.slots.double() + 1).reciprocal()
        assert torch.allclose(got.weights.double(), expect_w, rtol=1e-4)
    freq = counts / counts.sum()
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.01)


def test_priority_update_for_overwritten_slot_is_skipped():
    b = build_buffer(BufferConfig(capacity=4, sampler="prioritized", alpha=1.0), SCHEMA)
    b.extend(ids(0, 4))
    s = b.sample(4)  # in flight
    b.extend(ids(4, 2))  # overwrites slots 0 and 1
    applied = b.update_priorities(s.slots, s.generations, torch.full((4,), 100.0))
    live = (s.slots >= 2).sum().item()
    assert applied == live
    leaves = b.sampler.tree.get(torch.arange(4))
    assert torch.all(leaves[:2] < 50)  # the new items kept their insert priority
    assert b.metrics.totals()["count/priority_updates_skipped"] == 4 - live


def test_concurrent_writers_samplers_and_priority_updates():
    b = build_buffer(BufferConfig(capacity=256, sampler="prioritized"), SCHEMA)
    b.extend(ids(0, 64))
    errors: list[BaseException] = []
    done = threading.Event()

    def learner() -> None:
        try:
            while not done.is_set():
                s = b.sample(32)
                assert torch.equal(s.batch["obs"][:, 0], s.batch["id"].float())  # never a torn row
                b.update_priorities(s.slots, s.generations, torch.rand(32) + 0.1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=learner) for _ in range(2)]
    for t in threads:
        t.start()
    for k in range(1, 200):
        b.extend(ids(64 * k, 16))
    done.set()
    for t in threads:
        t.join()
    assert not errors
    tree = b.sampler.tree
    assert tree.total() == pytest.approx(float(tree.get(torch.arange(256)).sum()), rel=1e-9)


def test_samples_per_insert_ratio_error_mode():
    cfg = BufferConfig(capacity=64, rate_limit=RateLimit(samples_per_insert=2.0, tolerance=4, mode="error"))
    b = build_buffer(cfg, SCHEMA)
    b.extend(ids(0, 4))
    b.sample(8)
    b.sample(4)  # 12 <= 2*4 + 4
    with pytest.raises(InsufficientDataError, match="samples_per_insert=2.0"):
        b.sample(1)
    b.extend(ids(4, 4))
    b.sample(8)


def test_samples_per_insert_block_mode_waits_for_inserts():
    cfg = BufferConfig(capacity=64, rate_limit=RateLimit(samples_per_insert=1.0, timeout_s=5))
    b = build_buffer(cfg, SCHEMA)
    b.extend(ids(0, 4))
    b.sample(4)
    timer = threading.Timer(0.2, lambda: b.extend(ids(4, 4)))
    timer.start()
    assert b.sample(4).batch.size == 4  # blocked until the insert landed
    timer.join()


def test_block_mode_times_out_with_reason():
    cfg = BufferConfig(capacity=8, rate_limit=RateLimit(min_size=4, timeout_s=0.2))
    b = build_buffer(cfg, SCHEMA)
    with pytest.raises(InsufficientDataError, match="timed out.*min_size=4"):
        b.sample(1)


@pytest.mark.parametrize("sampler", ["uniform", "fifo", "prioritized"])
def test_state_dict_round_trip(sampler):
    cfg = BufferConfig(capacity=8, sampler=sampler)
    a = build_buffer(cfg, SCHEMA)
    a.extend(ids(0, 6))
    s = a.sample(2)
    if sampler == "prioritized":
        a.update_priorities(s.slots, s.generations, torch.tensor([5.0, 7.0]))
    b = build_buffer(cfg, SCHEMA)
    b.load_state_dict(a.state_dict())
    assert (b.inserted, b.sampled, len(b)) == (a.inserted, a.sampled, len(a))
    assert torch.equal(b.storage.data["obs"], a.storage.data["obs"])
    if sampler == "prioritized":
        assert torch.equal(b.sampler.tree.get(torch.arange(8)), a.sampler.tree.get(torch.arange(8)))


def test_sample_into_reused_memory():
    b = build_buffer(BufferConfig(capacity=16, sampler="fifo"), SCHEMA)
    b.extend(ids(0, 8))
    first = b.sample(4).batch
    ptr = first["obs"].data_ptr()
    again = b.sample(4, out=first).batch
    assert again["obs"].data_ptr() == ptr
    assert again["id"].tolist() == [4, 5, 6, 7]
    assert torch.equal(again["obs"][:, 0], again["id"].float())
    with pytest.raises(ShapeError, match="'id' must be"):
        b.sample(2, out=first)


@pytest.mark.parametrize("waiters", [1, 3])
def test_a_sample_wakes_writers_blocked_on_a_full_fifo_at_once(waiters):
    """A sample frees room; every writer waiting for it resumes at once, not at its next 0.5 s re-check."""
    b = build_buffer(BufferConfig(capacity=4, sampler="fifo", rate_limit=RateLimit(timeout_s=10)), SCHEMA)
    b.extend(ids(0, 4))
    resumed: list[float] = []
    lock = threading.Lock()

    def write(k: int) -> None:
        b.extend(ids(100 + k, 1))
        with lock:
            resumed.append(time.monotonic())

    threads = [threading.Thread(target=write, args=(k,)) for k in range(waiters)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while b._waiters < waiters and time.monotonic() < deadline:  # noqa: SLF001 - all are waiting
        time.sleep(0.01)
    assert b._waiters == waiters  # noqa: SLF001
    freed = time.monotonic()
    assert b.sample(waiters).batch.size == waiters
    for t in threads:
        t.join(5)
    assert len(resumed) == waiters and max(resumed) - freed < 0.3
    assert b._waiters == 0  # noqa: SLF001
