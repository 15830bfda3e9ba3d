"""Failures never hang: worker errors reach the caller within a second, ``close()`` always returns,
and producers faster than consumers never overwrite unread on-policy data (issue 12)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch
from fifo_conduits import fifo_conduit
from promptly import get_raises_within, raises_within

from conduit import (
    BufferConfig,
    ClosedError,
    Column,
    ColumnBatch,
    Conduit,
    ConduitError,
    InsufficientDataError,
    Operator,
    OperatorError,
    SchedulerConfig,
    Schema,
)

SCHEMA = Schema([Column("id", torch.int64)])
MODES = ["sync", "async"]


def frag(start: int, n: int) -> ColumnBatch:
    return ColumnBatch({"id": torch.arange(start, start + n)})


def fifo(overlap: str, capacity: int = 8, mode: str = "block", timeout_s: float = 30.0, **kw) -> Conduit:
    return fifo_conduit(SCHEMA, overlap, capacity, timeout_s, mode=mode, **kw)


class Call:
    """Runs ``fn`` on a thread; remembers when it returned and what it raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.error: BaseException | None = None
        self.ended: float | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 — inspected by the test
            self.error = e
        self.ended = time.monotonic()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call is still blocked"


def crash(after: threading.Event | None = None) -> Operator:
    def fn(b: ColumnBatch) -> ColumnBatch:
        if after is not None:
            after.wait(10)
        raise RuntimeError("reward model crashed")

    return Operator("reward", fn)


# -- async worker errors reach the caller within a second --------------------------------------


def test_an_ingest_error_wakes_a_get_that_is_already_waiting():
    go = threading.Event()
    c = fifo("async", ingest=[crash(after=go)])
    c.put(frag(0, 4))
    waiting = Call(lambda: c.get(4))
    time.sleep(0.3)
    assert waiting.ended is None  # blocked: nothing is in the buffer yet
    t_fail = time.monotonic()
    go.set()
    waiting.join(5)
    assert isinstance(waiting.error, OperatorError) and "reward model crashed" in str(waiting.error)
    assert waiting.ended is not None and waiting.ended - t_fail < 1.0
    c.close(drain=False)


def test_an_ingest_error_wakes_a_put_blocked_on_a_full_queue():
    go = threading.Event()
    c = fifo("async", ingest=[crash(after=go)])  # depth 2: one fragment in the worker, two queued
    for i in range(3):
        c.put(frag(i, 1))
    blocked = Call(lambda: c.put(frag(3, 1)))
    time.sleep(0.3)
    assert blocked.ended is None
    t_fail = time.monotonic()
    go.set()
    blocked.join(5)
    assert isinstance(blocked.error, ConduitError) and "reward model crashed" in str(blocked.error)
    assert blocked.ended is not None and blocked.ended - t_fail < 1.0
    # Refused fragments are reported once each (issue 26, item 13): the runtime goes on, as in sync.
    reports = 1
    for _ in range(3):
        try:
            c.flush()
        except OperatorError:
            reports += 1
    c.flush()
    assert reports <= 3 and len(c.buffer) == 0
    c.put(frag(9, 1))  # still accepted (and refused by the operator in turn)
    with pytest.raises(OperatorError, match="reward model crashed"):
        c.flush()
    c.close(drain=False)


def test_a_delivery_error_reaches_the_reader_within_a_second():
    def bad_collate(b: ColumnBatch) -> ColumnBatch:
        raise ValueError("collate failed")

    c = fifo("async", deliver=[Operator("collate", bad_collate)])
    get_raises_within(c, frag(0, 4), 1.0, OperatorError, "collate failed")


# -- close() never hangs -----------------------------------------------------------------------


@pytest.mark.parametrize("overlap", MODES)
def test_close_wakes_a_producer_blocked_in_put(overlap):
    c = fifo(overlap, capacity=4)
    c.put(frag(0, 4))
    if overlap == "async":  # the worker holds one fragment waiting for room; fill the queue behind it
        c.put(frag(4, 4))
        c.put(frag(8, 4))
        c.put(frag(12, 4))
    blocked = Call(lambda: c.put(frag(16, 4)))
    time.sleep(0.3)
    assert blocked.ended is None, "the put should wait: unread on-policy items are never overwritten"
    t_close = time.monotonic()
    c.close(drain=False)
    blocked.join(5)
    assert time.monotonic() - t_close < 2.0
    assert isinstance(blocked.error, ClosedError)


def test_close_with_an_ingest_operator_that_never_returns_is_bounded():
    hang = threading.Event()

    def stuck(b: ColumnBatch) -> ColumnBatch:
        hang.wait(60)
        return b

    c = fifo("async", timeout_s=0.5, ingest=[Operator("reward", stuck)])
    c.put(frag(0, 4))
    with raises_within(8.0, ConduitError, "could not be ingested"):  # the drain timeout plus a bounded join
        c.close(drain=True)
    hang.set()


# -- backpressure ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", MODES)
def test_a_fast_producer_blocks_and_loses_nothing(overlap):
    c = fifo(overlap, capacity=8)
    got: list[int] = []
    producer = Call(lambda: [c.put(frag(i * 4, 4)) for i in range(16)])
    while len(got) < 64:
        got += c.get(4).batch["id"].tolist()
    producer.join(10)
    assert producer.error is None
    assert got == list(range(64))  # every item once, in order
    assert "count/overwritten" not in c.end_iteration()
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_a_fast_producer_in_error_mode_is_refused_and_the_runtime_stays_usable(overlap):
    c = fifo(overlap, capacity=8, mode="error")
    c.put(frag(0, 6))
    with pytest.raises(InsufficientDataError, match="unconsumed on-policy items are never overwritten"):
        c.put(frag(6, 4))  # async: refused at the call, counting what is still queued
    c.put(frag(6, 2))
    c.flush()  # error mode reads only what is in the buffer now
    assert c.get(8).batch["id"].tolist() == list(range(8))  # nothing overwritten, nothing stranded
    c.put(frag(8, 4))
    c.flush()
    assert c.get(4).batch["id"].tolist() == list(range(8, 12))
    c.close()


def test_a_write_committing_during_the_refusal_check_is_counted_once():
    # CI caught this race: put() read the in-flight count, the ingest worker committed, then the free
    # slots were read — the 6 in-flight items were counted twice and a put that fits was refused.
    c = fifo("sync", capacity=8, mode="error")
    c.put(frag(0, 6))
    buf = c.buffer
    assert buf.insert_refusal(2, in_flight=(6, 0)) is None  # taken at count 0, committed: counted once
    assert buf.insert_refusal(2, in_flight=(6, 6)) is not None  # still in flight: 6 + 6 + 2 > 8
    c.close()


def test_error_mode_accepts_every_put_that_fits_while_the_worker_commits():
    c = fifo("async", capacity=8, mode="error")
    for i in range(200):  # each round races put(2) against the commit of the put(6) before it
        c.put(frag(i * 8, 6))
        c.put(frag(i * 8 + 6, 2))
        c.flush()
        assert c.get(8).batch["id"].tolist() == list(range(i * 8, i * 8 + 8))
    c.close()


@pytest.mark.parametrize("overlap", MODES)
def test_off_policy_overwrites_the_oldest_and_counts_them(overlap):
    cfg = BufferConfig(capacity=8)
    with Conduit(SCHEMA, cfg, SchedulerConfig(overlap=overlap)) as c:
        for i in range(5):
            c.put(frag(i * 4, 4))
        c.flush()
        assert c.end_iteration()["count/overwritten"] == 12
        assert set(c.buffer.storage.read(torch.arange(8)).columns["id"].tolist()) == set(range(12, 20))
