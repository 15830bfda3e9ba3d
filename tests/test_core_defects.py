"""One test per defect found by probing the core's public API (issue 8); each failed before the fix.

Both overlap modes must behave the same; every bad input raises a ConduitError before anything changes.
"""

import threading
import time

import pytest
import torch
from fifo_conduits import fifo_conduit
from promptly import get_raises_within, raises_within

from conduit import (
    BufferConfig,
    CapacityError,
    CheckpointError,
    ClosedError,
    Column,
    ColumnBatch,
    Conduit,
    ConduitError,
    ConfigError,
    Metrics,
    Operator,
    PriorityError,
    Ragged,
    RateLimit,
    SchedulerConfig,
    Schema,
    ShapeError,
    VersionError,
)
from conduit.build_buffer import build_buffer

IN = Schema([Column("id", torch.int64), Column("reward", torch.float32)])
TOK = Schema([Column("id", torch.int64), Column("tokens", torch.int64, ragged=True, max_len=8)])
MODES = ["sync", "async"]


def frag(start: int, n: int) -> ColumnBatch:
    i = torch.arange(start, start + n)
    return ColumnBatch({"id": i, "reward": i.float()})


def fifo(overlap: str, capacity: int = 128, g_del: int = 1, timeout_s: float = 10.0, **kw) -> Conduit:
    return fifo_conduit(IN, overlap, capacity, timeout_s, g_del=g_del, **kw)


def ids(deliveries) -> list[int]:
    return [i for d in deliveries for i in d.batch["id"].tolist()]


# -- on-policy items come out exactly once whatever the caller asks -----------------------------


@pytest.mark.parametrize("overlap", MODES)
def test_changing_batch_size_loses_no_consume_once_item(overlap):
    c = fifo(overlap, g_del=4)
    c.put(frag(0, 64))
    c.flush()
    sizes = [4] + [8] * 4 + [4] * 4
    got = [c.get(n) for n in sizes]
    assert [d.batch.size for d in got] == sizes
    assert ids(got) == list(range(sum(sizes)))
    rest = c.get(64 - sum(sizes))  # every item not yet delivered is still there, in order
    assert ids([rest]) == list(range(sum(sizes), 64))
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_with_replacement_size_change_serves_the_new_size(overlap):
    buf = BufferConfig(capacity=64, sampler="uniform")
    c = Conduit(IN, buf, SchedulerConfig(overlap=overlap, g_del=4, depth=4), seed=0)
    c.put(frag(0, 64))
    c.flush()
    assert [c.get(n).batch.size for n in (4, 8, 3, 16, 4)] == [4, 8, 3, 16, 4]
    c.close()


def _take_16(c: Conduit, out: list[int]) -> None:
    for _ in range(16):
        out += c.get(8).batch["id"].tolist()


@pytest.mark.parametrize("overlap", MODES)
def test_two_threads_calling_get_lose_nothing(overlap):
    for _ in range(40 if overlap == "sync" else 5):
        c = fifo(overlap, capacity=256, g_del=4)
        c.put(frag(0, 256))
        got: list[list[int]] = [[], []]
        threads = [threading.Thread(target=_take_16, args=(c, got[k])) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got[0] + got[1]) == list(range(256))
        c.close()


# -- epochs of minibatches (PPO) through the same delivery path --------------------------------


@pytest.mark.parametrize("overlap", MODES)
def test_get_epochs_lays_out_each_rank_once_per_epoch(overlap):
    c = fifo(overlap, ranks=2, seed=3)
    c.put(frag(0, 10), version=0)
    d = c.get_epochs(10, num_epochs=3, minibatch_size=2, version=0)
    assert d.batch["id"].tolist() == list(range(10))
    assert (d.minibatch_size, d.num_minibatches) == (2, 8)  # ceil(3 epochs x 5 rows / 2)
    for r, part in enumerate(d.parts):
        share = set(range(5 * r, 5 * r + 5))
        rows = part.batch["id"].tolist()
        assert len(rows) == 16
        assert set(rows[:5]) == share and set(rows[5:10]) == share  # each epoch a permutation of the share
        assert torch.equal(part.slots, part.batch["id"] % 128)  # parts carry their own slots
    c.put(frag(10, 6), version=1)
    d2 = c.get_epochs(6, num_epochs=1, version=1)  # a different request: nothing lost, nothing repeated
    assert d2.batch["id"].tolist() == list(range(10, 16))
    c.close()


def test_get_epochs_rejects_bad_shapes():
    c = fifo("sync", ranks=4)
    c.put(frag(0, 3))
    with pytest.raises(ConfigError, match="cannot be split over 4 ranks"):
        c.get_epochs(3, num_epochs=1)
    with pytest.raises(ConfigError, match="batch size"):
        c.get_epochs(3, num_epochs=0)
    c.close()


# -- validation on the caller's thread, before anything changes ---------------------------------


@pytest.mark.parametrize("overlap", MODES)
@pytest.mark.parametrize(
    "offsets",
    [torch.tensor([0, 3, 9]), torch.tensor([1, 3, 4]), torch.tensor([0, 3, 2, 4]), torch.tensor([0, 2])],
)
def test_malformed_ragged_is_refused_before_anything_is_written(overlap, offsets):
    c = fifo_conduit(TOK, overlap, capacity=4, timeout_s=5)
    n = offsets.numel() - 1
    bad = ColumnBatch({"id": torch.arange(n), "tokens": Ragged(torch.arange(4), offsets)})
    with pytest.raises(ShapeError, match="offsets"):
        c.put(bad)
    good = ColumnBatch({"id": torch.tensor([7]), "tokens": Ragged.from_list([torch.tensor([5, 6])])})
    c.put(good)
    c.flush()
    assert len(c.buffer) == 1  # no phantom items
    d = c.get(1)
    assert d.batch["id"].tolist() == [7] and d.batch["tokens"].values.tolist() == [5, 6]
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_oversize_and_partial_group_puts_raise_at_put_and_leave_the_runtime_usable(overlap):
    buf = BufferConfig(
        capacity=8, writer="grouped", group_size=4, sampler="fifo", rate_limit=RateLimit(min_size=0)
    )
    c = Conduit(IN, buf, SchedulerConfig(overlap=overlap))
    with pytest.raises(CapacityError, match="exceeds the buffer capacity"):
        c.put(frag(0, 12))
    with pytest.raises(ShapeError, match="not a whole number of groups"):
        c.put(frag(0, 6))
    c.put(frag(0, 4))
    c.flush()
    assert c.get(4).batch["id"].tolist() == [0, 1, 2, 3]
    c.close()


def test_async_ingest_never_concatenates_past_capacity():
    buf = BufferConfig(capacity=10, sampler="uniform")
    c = Conduit(IN, buf, SchedulerConfig(overlap="async", g_ing=4, depth=2))
    for k in range(4):
        c.put(frag(6 * k, 6))
    c.flush()
    assert c.buffer.inserted == 24
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_bad_priority_updates_raise_at_the_call(overlap):
    pri = BufferConfig(capacity=16, sampler="prioritized")
    c = Conduit(IN, pri, SchedulerConfig(overlap=overlap))
    c.put(frag(0, 16))
    d = c.get(4)
    with pytest.raises(PriorityError, match="finite"):
        c.update_priorities(d, torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    with pytest.raises(PriorityError, match="finite"):
        c.update_priorities(d, torch.tensor([1.0, float("inf"), 1.0, 1.0]))
    with pytest.raises(PriorityError, match="slots must lie"):
        c.update_priorities_at(torch.tensor([99]), torch.tensor([1]), torch.tensor([1.0]))
    with pytest.raises(ShapeError, match="same shape"):
        c.update_priorities(d, torch.ones(3))
    with pytest.raises(ShapeError, match="same shape"):
        c.buffer.update_priorities(d.slots, d.generations, torch.ones(3))  # one error class on every path
    c.update_priorities(d, torch.ones(4))
    assert c.get(4).batch.size == 4  # still serving
    c.close()
    u = fifo(overlap)
    u.put(frag(0, 8))
    d = u.get(4)
    with pytest.raises(PriorityError, match="has no priorities"):
        u.update_priorities(d, torch.ones(4))
    assert u.get(4).batch["id"].tolist() == [4, 5, 6, 7]
    u.close()


@pytest.mark.parametrize("size", [0, -3, True, 2.5])
@pytest.mark.parametrize("overlap", MODES)
def test_bad_batch_size_raises_at_once(overlap, size):
    c = fifo(overlap, timeout_s=30)
    c.put(frag(0, 8))
    with raises_within(1, ConfigError, "batch size must be an int >= 1"):
        c.get(size)
    assert c.get(8).batch.size == 8
    c.close()


def test_failed_ingest_operator_reaches_a_reader_promptly():
    def boom(b: ColumnBatch) -> ColumnBatch:
        raise RuntimeError("reward model crashed")

    c = fifo_conduit(IN, "async", capacity=16, timeout_s=60, ingest=[Operator("reward", boom)])
    get_raises_within(c, frag(0, 4), 5, ConduitError, "reward model crashed")


# -- state, versions, close --------------------------------------------------------------------


@pytest.mark.parametrize("overlap", MODES)
def test_state_dict_keeps_prepared_but_undelivered_items(overlap):
    c = fifo(overlap, capacity=256, g_del=4)
    c.put(frag(0, 256))
    c.flush()
    delivered = ids([c.get(8) for _ in range(4)])
    time.sleep(0.2)  # async: let the worker prepare ahead
    state = c.state_dict()
    restored = fifo("sync", capacity=256)
    restored.load_state_dict(state)
    assert len(restored.buffer) == 256 - 32
    assert ids([restored.get(224)]) == list(range(32, 256))
    assert delivered == list(range(32))
    assert ids([c.get(224)]) == list(range(32, 256))  # the original goes on unchanged
    c.close()


def test_state_dict_includes_queued_priority_updates():
    for _ in range(20):
        c = Conduit(IN, BufferConfig(capacity=16, sampler="prioritized"), SchedulerConfig(overlap="async"))
        c.put(frag(0, 16))
        d = c.get(4)
        c.update_priorities(d, torch.full((4,), 50.0))
        tree = c.state_dict()["buffer"]["sampler"]["tree"]["priorities"]
        expected = (50.0 + 1e-6) ** 0.6
        assert torch.allclose(tree[d.slots], torch.full((4,), expected, dtype=torch.float64))
        c.close(drain=False)


def test_loading_a_state_of_another_shape_raises_and_changes_nothing():
    a = fifo("sync", capacity=16)
    a.put(frag(0, 8))
    state = a.state_dict()
    b = fifo("sync", capacity=32)
    b.put(frag(100, 4))
    with pytest.raises(CheckpointError, match="capacity"):
        b.load_state_dict(state)
    p = Conduit(IN, BufferConfig(capacity=16, sampler="prioritized"))
    with pytest.raises(CheckpointError, match="sampler"):
        p.load_state_dict(state)
    with pytest.raises(CheckpointError):
        b.load_state_dict({"buffer": {"storage": {}}})
    assert b.get(4).batch["id"].tolist() == [100, 101, 102, 103]


@pytest.mark.parametrize("overlap", MODES)
def test_versions_never_go_backwards(overlap):
    c = fifo(overlap)
    c.put(frag(0, 4), version=3)
    with pytest.raises(VersionError, match="backwards"):
        c.put(frag(4, 4), version=2)
    c.get(2, version=3)
    with pytest.raises(VersionError, match="backwards"):
        c.get(2, version=1)
    assert c.get(2, version=3).batch["id"].tolist() == [2, 3]
    c.close()


def test_close_drain_with_ingest_blocked_on_full_fifo_raises_promptly_and_stops_workers():
    c = fifo("async", capacity=8, timeout_s=60)
    c.put(frag(0, 8))
    c.put(frag(8, 8))  # waits in the worker: unconsumed items are never overwritten
    with raises_within(5, ConduitError, "could not be ingested"):
        c.close(drain=True)
    assert not any(t.is_alive() for t in c._scheduler.threads)
    with pytest.raises(ClosedError):
        c.put(frag(0, 1))


def test_close_without_drain_is_prompt():
    c = fifo("async", capacity=8, timeout_s=60)
    c.put(frag(0, 8))
    c.put(frag(8, 8))
    t0 = time.monotonic()
    c.close(drain=False)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"capacity": True}, ConfigError, "capacity must be an int"),
        ({"beta": float("inf")}, ConfigError, "beta must be a finite number"),
        ({"alpha": float("nan")}, ConfigError, "alpha must be a finite number"),
        (
            {"capacity": 4, "tier": "disk", "disk_path": "/proc/conduit-cannot-exist"},
            ConfigError,
            "disk_path",
        ),
        ({"capacity": 2**50}, CapacityError, "fit on no tier"),
        ({"capacity": 2**50, "tier": "host"}, CapacityError, "cannot allocate"),
        ({"sampler": "uniform", "rate_limit": {"max_staleness": 1}}, ConfigError, "sampler='fifo'"),
    ],
)
def test_bad_buffer_configs_raise_conduit_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_buffer(BufferConfig(**kwargs), IN)


def test_metrics_bad_input_is_a_config_error():
    with pytest.raises(ConfigError):
        Metrics(max_trace_events=-1)
    with pytest.raises(ConfigError):
        Metrics().add_bytes("host->cuda", -1)


@pytest.mark.parametrize("overlap", MODES)
def test_rank_parts_carry_their_own_weights_and_slots(overlap):
    c = Conduit(
        IN, BufferConfig(capacity=32, sampler="prioritized"), SchedulerConfig(overlap=overlap), ranks=3
    )
    c.put(frag(0, 32))
    d = c.get(8)
    assert [p.size for p in d.parts] == [3, 3, 2]
    assert torch.equal(torch.cat([p.slots for p in d.parts]), d.slots)
    assert torch.equal(torch.cat([p.weights for p in d.parts]), d.weights)
    c.update_priorities(d.parts[1], torch.ones(3))  # a rank can send its own part's priorities
    c.close()


def test_presets_build_the_shapes_integrations_use():
    grpo = build_buffer(BufferConfig.on_policy(64, group_size=8, max_staleness=1), IN)
    assert grpo.sampler.consumes and grpo.writer.group_size == 8
    per = build_buffer(BufferConfig.prioritized_replay(64, alpha=0.5), IN)
    assert per.sampler.has_priorities and per.sampler.alpha == 0.5
    uni = build_buffer(BufferConfig.uniform_replay(64, min_size=10), IN)
    assert not uni.sampler.consumes and uni.limiter.config.min_size == 10


@pytest.mark.parametrize("overlap", MODES)
def test_close_wakes_a_get_waiting_for_a_producer_that_never_comes(overlap):
    c = fifo(overlap, timeout_s=60)
    c.put(frag(0, 2))
    errors: list[BaseException] = []

    def wait_for_more() -> None:
        try:
            c.get(8)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=wait_for_more)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    c.close(drain=False)
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 3
    assert len(errors) == 1 and isinstance(errors[0], ClosedError)


@pytest.mark.parametrize("overlap", MODES)
def test_a_producer_that_never_finishes_gives_a_timeout_that_names_why(overlap):
    c = fifo(overlap, timeout_s=0.5)
    c.put(frag(0, 3))
    with pytest.raises(ConduitError, match="requested 4 items but only 3 unconsumed"):
        c.get(4)
    assert c.get(3).batch["id"].tolist() == [0, 1, 2]  # nothing was consumed by the failed get
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_tensordict_in_and_out_at_the_boundary(overlap):
    buf = BufferConfig(capacity=8, sampler="fifo", rate_limit=RateLimit(min_size=0))
    c = Conduit(TOK, buf, SchedulerConfig(overlap=overlap))
    b = ColumnBatch(
        {"id": torch.arange(2), "tokens": Ragged.from_list([torch.tensor([1, 2]), torch.tensor([3])])}
    )
    c.put(b.to_tensordict())
    td = c.get(2).to_tensordict()
    assert td["id"].tolist() == [0, 1] and td["tokens"].values().tolist() == [1, 2, 3]
    with pytest.raises(ConduitError, match="ColumnBatch or a TensorDict"):
        c.put({"id": torch.arange(2)})
    c.close()
