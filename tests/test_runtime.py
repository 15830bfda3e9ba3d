import json
import threading

import pytest
import torch

from conduit import (
    BufferConfig,
    Column,
    ColumnBatch,
    Conduit,
    InsufficientDataError,
    Operator,
    OperatorError,
    RateLimit,
    SchedulerConfig,
    Schema,
)

IN = Schema([Column("id", torch.int64), Column("reward", torch.float32)])
STORED = IN.with_column(Column("ret", torch.float32))


def frag(start: int, n: int) -> ColumnBatch:
    i = torch.arange(start, start + n)
    return ColumnBatch({"id": i, "reward": i.float()})


def double_return() -> Operator:
    return Operator("ret", lambda b: b.with_columns(ret=b["reward"] * 2))


def make(overlap: str, **kw) -> Conduit:
    sched = SchedulerConfig(overlap=overlap, g_ing=kw.pop("g_ing", 1), g_del=kw.pop("g_del", 1))
    buf = kw.pop("buffer", BufferConfig(capacity=256, sampler="fifo", rate_limit=RateLimit(timeout_s=10)))
    return Conduit(IN, buf, sched, ingest=[double_return()], stored_schema=STORED, **kw)


@pytest.mark.parametrize("overlap", ["sync", "async"])
@pytest.mark.parametrize("g_ing", [1, 3])
@pytest.mark.parametrize("g_del", [1, 2])
def test_on_policy_items_delivered_once_in_order_with_ingestion_applied(overlap, g_ing, g_del):
    c = make(overlap, g_ing=g_ing, g_del=g_del)
    for k in range(8):
        c.put(frag(10 * k, 10), version=0)
    c.flush()
    got = [c.get(8, version=0) for _ in range(10)]
    ids = torch.cat([d.batch["id"] for d in got])
    assert ids.tolist() == list(range(80))
    assert torch.equal(torch.cat([d.batch["ret"] for d in got]), ids.float() * 2)
    m = c.end_iteration()
    assert m["count/inserted"] == 80 and m["exposed_s"] > 0
    c.close()


def test_delivery_ops_and_rank_split():
    def pack(b: ColumnBatch) -> ColumnBatch:
        return b.with_columns(id=b["id"] * 10)

    c = Conduit(IN, BufferConfig(capacity=64, sampler="fifo"), deliver=[Operator("pack", pack)], ranks=3)
    c.put(frag(0, 7))
    d = c.get(7)
    assert d.batch["id"].tolist() == [0, 10, 20, 30, 40, 50, 60]
    assert [p.size for p in d.parts] == [3, 2, 2]
    assert torch.cat([p.batch["id"] for p in d.parts]).tolist() == d.batch["id"].tolist()
    assert torch.cat([p.slots for p in d.parts]).tolist() == d.slots.tolist()


def test_sync_runs_ingestion_inline_as_exposed_time_async_does_not():
    def slow(b: ColumnBatch) -> ColumnBatch:
        torch.ones(2000, 2000) @ torch.ones(2000, 200)  # ~0.8 GFLOP, releases the GIL
        return b.with_columns(ret=b["reward"])

    out = {}
    for overlap in ("sync", "async"):
        c = Conduit(
            IN,
            BufferConfig(capacity=64),
            SchedulerConfig(overlap=overlap),
            ingest=[Operator("slow", slow)],
            stored_schema=STORED,
        )
        c.put(frag(0, 8))
        m = c.end_iteration()
        out[overlap] = (m["exposed_s"], m.get("op/ingest/slow_s", 0.0))
        c.close()
    sync_exposed, sync_op = out["sync"]
    assert sync_exposed >= sync_op > 0
    assert out["async"][0] < sync_op / 5


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_failing_operator_is_reported_not_dropped(overlap):
    def boom(b: ColumnBatch) -> ColumnBatch:
        raise RuntimeError("kaboom")

    c = Conduit(
        IN, BufferConfig(capacity=64), SchedulerConfig(overlap=overlap), ingest=[Operator("boom", boom)]
    )
    with pytest.raises(OperatorError, match="'boom'.*kaboom"):
        c.put(frag(0, 4))
        c.flush()
    c.close(drain=False)


def test_operator_returning_wrong_type():
    c = Conduit(IN, BufferConfig(capacity=64), ingest=[Operator("bad", lambda b: {"id": 1})])
    with pytest.raises(OperatorError, match="returned dict"):
        c.put(frag(0, 4))


def test_close_drains_queued_fragments():
    c = make("async", g_ing=4)
    for k in range(3):  # fewer than g_ing: only a drain ingests them
        c.put(frag(10 * k, 10))
    c.close(drain=True)
    assert c.buffer.inserted == 30


def test_async_prioritized_updates_are_applied_in_order():
    buf = BufferConfig(capacity=64, sampler="prioritized", alpha=1.0, rate_limit=RateLimit(min_size=16))
    c = Conduit(
        IN, buf, SchedulerConfig(overlap="async", depth=2), ingest=[double_return()], stored_schema=STORED
    )
    c.put(frag(0, 16))
    for _ in range(20):
        d = c.get(8)
        c.update_priorities(d, torch.where(d.batch["id"] == 3, 1000.0, 0.001))
    c.flush()
    d = c.get(8)
    c.update_priorities(d, torch.where(d.batch["id"] == 3, 1000.0, 0.001))
    counts = torch.zeros(16)
    for _ in range(10):
        counts += torch.bincount(c.get(64).batch["id"], minlength=16)
    assert counts.argmax().item() == 3 and counts[3] / counts.sum() > 0.9
    c.close()


def test_async_get_reports_rate_limit_reason_in_error_mode():
    buf = BufferConfig(capacity=64, sampler="fifo", rate_limit=RateLimit(mode="error", min_size=100))
    c = Conduit(IN, buf, SchedulerConfig(overlap="async"), ingest=[double_return()], stored_schema=STORED)
    c.put(frag(0, 4))
    c.flush()
    with pytest.raises(InsufficientDataError, match="min_size=100"):
        c.get(2)
    c.close()


def test_producer_and_consumer_threads():
    c = make("async", g_ing=2)
    total = 400
    got: list[int] = []

    def producer() -> None:
        for k in range(total // 10):
            c.put(frag(10 * k, 10))

    t = threading.Thread(target=producer)
    t.start()
    while len(got) < total:
        got += c.get(20).batch["id"].tolist()
    t.join()
    assert got == list(range(total))
    c.close()


def test_trace_export(tmp_path):
    c = make("async")
    c.put(frag(0, 10))
    c.flush()
    c.get(5)
    path = tmp_path / "trace.json"
    c.metrics.export_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"put", "get", "ingest/ret", "deliver/sample"} <= names
    c.close()


def test_state_dict_round_trip_through_conduit():
    a = make("async")
    a.put(frag(0, 10))
    sd = a.state_dict()
    b = make("sync")
    b.load_state_dict(sd)
    assert b.get(10).batch["id"].tolist() == list(range(10))
    a.close()
