"""Online migration of a buffer's columns and the placer that re-plans them: contents kept, nothing
lost or duplicated while writers and readers run, hysteresis, pins, growth and capacity errors."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from conduit import Column, Schema
from conduit.batch import ColumnBatch, Ragged
from conduit.build_buffer import build_buffer
from conduit.config import BufferConfig, RateLimit
from conduit.errors import CapacityError, ConfigError
from conduit.placement import PlacementCapacityError, conservative, greedy_fastest
from conduit.placer import Placer, Traffic, column_fields, usable_tiers
from conduit.topology import Link, Tier, Topology

MB = 10**6


def _host_topology(host: int, shm: int, disk: int = 10**12) -> Topology:
    """This machine's host tiers with given budgets: host fastest, shm a little slower, disk slow."""
    tiers = (
        Tier("node0/host", "host", "node0", host),
        Tier("node0/shm", "shm", "node0", shm),
        Tier("node0/disk", "disk", "node0", disk),
    )
    rate = {"node0/host": 10.0, "node0/shm": 8.0, "node0/disk": 0.5}
    links = tuple(
        Link(a.name, b.name, min(rate[a.name], rate[b.name]), 5.0 if "disk" not in a.name + b.name else 150.0)
        for a in tiers
        for b in tiers
    )
    return Topology(tiers, links, "test")


SCHEMA = Schema(
    [
        Column("id", torch.int64),
        Column("obs", torch.float32, (16,)),
        Column("tok", torch.int64, ragged=True, max_len=8),
    ]
)


def _batch(first: int, n: int, length: int = 5) -> ColumnBatch:
    ids = torch.arange(first, first + n)
    tok = ids[:, None].repeat(1, length)
    return ColumnBatch(
        {
            "id": ids,
            "obs": ids[:, None].float().repeat(1, 16),
            "tok": Ragged.from_padded(tok, torch.full((n,), length)),
        }
    )


def _check_rows(batch: ColumnBatch) -> None:
    """Every row consistent with its id (a torn row from a half-moved column would not be)."""
    ids = batch.columns["id"]
    obs = batch.columns["obs"]
    assert isinstance(obs, torch.Tensor) and isinstance(ids, torch.Tensor)
    assert torch.equal(obs, ids[:, None].float().repeat(1, 16))
    tok = batch.columns["tok"]
    assert isinstance(tok, Ragged)
    padded, _ = tok.to_padded()
    assert bool((tok.lengths == 5).all())
    assert torch.equal(padded[:, :5], ids[:, None].repeat(1, 5))


def test_migrate_moves_columns_and_keeps_contents() -> None:
    buf = build_buffer(BufferConfig(capacity=64, tier="host", sampler="fifo"), SCHEMA)
    buf.extend(_batch(0, 20))
    report = buf.migrate({"obs": "shm", "tok": "disk"}, {"tok": 32})
    assert {m.column: m.dst for m in report.moves} == {"obs": "shm", "tok": "disk"}
    assert buf.storage.tiers == {"id": "host", "obs": "shm", "tok": "disk"}
    assert buf.schema["tok"].max_len == 32
    assert report.nbytes == 64 * 16 * 4 + 64 * (32 * 8 + 8)
    assert buf.metrics.totals()["count/migrations"] == 1
    buf.extend(_batch(20, 4, length=5))
    s = buf.sample(24)
    assert s.batch.columns["id"].tolist() == list(range(24))
    _check_rows(s.batch)


def test_migrate_rejects_unknown_columns_and_shrinking() -> None:
    buf = build_buffer(BufferConfig(capacity=8, tier="host"), SCHEMA)
    with pytest.raises(ConfigError, match="unknown column"):
        buf.migrate({"nope": "shm"})
    with pytest.raises(ConfigError, match="cannot shrink"):
        buf.migrate({}, {"tok": 4})
    with pytest.raises(ConfigError, match="not ragged"):
        buf.migrate({}, {"obs": 40})
    assert buf.storage.tiers == {"id": "host", "obs": "host", "tok": "host"}


def test_migration_under_concurrent_writes_and_reads_loses_and_duplicates_nothing() -> None:
    """A writer and a consume-once reader run while every column flips between tiers: each id comes
    out exactly once, each row whole."""
    buf = build_buffer(
        BufferConfig(capacity=256, tier="host", sampler="fifo", rate_limit=RateLimit(timeout_s=20)), SCHEMA
    )
    total, step = 4000, 8
    seen: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for first in range(0, total, step):
                buf.extend(_batch(first, step))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def read() -> None:
        try:
            got = 0
            while got < total:
                s = buf.sample(step)
                _check_rows(s.batch)
                seen.append(s.batch.columns["id"].clone())  # type: ignore[union-attr]
                got += step
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    tiers = ["shm", "disk", "host"]
    moves = 0
    while any(t.is_alive() for t in threads) and moves < 60:
        buf.migrate({c: tiers[(moves + i) % 3] for i, c in enumerate(SCHEMA.names)})
        moves += 1
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    ids = torch.cat(seen)
    assert ids.numel() == total and torch.equal(torch.sort(ids).values, torch.arange(total))
    assert moves >= 3


def test_growth_during_writes_keeps_items() -> None:
    buf = build_buffer(BufferConfig(capacity=128, tier="host", sampler="fifo"), SCHEMA)
    stop = threading.Event()
    written = [0]

    def write() -> None:
        while not stop.is_set() and written[0] < 100:
            buf.extend(_batch(written[0], 1))
            written[0] += 1

    t = threading.Thread(target=write)
    t.start()
    for max_len in (16, 64, 256):
        buf.grow_column("tok", max_len)
    stop.set()
    t.join()
    s = buf.sample(written[0])
    assert s.batch.columns["id"].tolist() == list(range(written[0]))
    _check_rows(s.batch)
    assert buf.schema["tok"].max_len == 256


def _placer_buffer(capacity: int = 1000, **kw: object) -> tuple[BufferConfig, object]:
    cfg = BufferConfig(capacity=capacity, tier="host", sampler="fifo", **kw)  # type: ignore[arg-type]
    return cfg, build_buffer(cfg, SCHEMA)


def test_placer_spills_the_growing_column_and_explains(caplog: pytest.LogCaptureFixture) -> None:
    _, buf = _placer_buffer()
    topo = _host_topology(host=300_000, shm=2 * MB)
    placer = Placer(buf, topo, Traffic(100, 100))  # type: ignore[arg-type]
    placer.place(force=True)
    assert set(buf.storage.tiers.values()) == {"host"}  # type: ignore[attr-defined]
    buf.extend(_batch(0, 50))  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="conduit.placement"):
        buf.grow_column("tok", 64)  # type: ignore[attr-defined]  # 1000 x 520 B = 520 KB: past host's budget
    assert buf.storage.tiers["tok"] == "shm"  # type: ignore[attr-defined]
    assert "tok to max_len 64 (growth)" in caplog.text and "placement by" in caplog.text
    _check_rows(buf.sample(50).batch)  # type: ignore[attr-defined]
    assert placer.history[-1].migration.moves


def test_placer_hysteresis_keeps_a_placement_that_is_nearly_as_good() -> None:
    _, buf = _placer_buffer()
    topo = _host_topology(host=10 * MB, shm=10 * MB)
    placer = Placer(buf, topo, Traffic(100, 100), threshold=0.5)  # type: ignore[arg-type]
    buf.migrate({"obs": "shm"})  # type: ignore[attr-defined]  # host is better, by less than half
    assert placer.place("check") is None
    assert buf.storage.tiers["obs"] == "shm"  # type: ignore[attr-defined]
    assert placer.place("forced", force=True) is not None
    assert buf.storage.tiers["obs"] == "host"  # type: ignore[attr-defined]
    adopted = len(placer.history)
    report = buf.grow_column("tok", 16)  # type: ignore[attr-defined]  # fits where it is: plan kept
    assert [(m.column, m.src, m.dst) for m in report.moves] == [("tok", "host", "host")]
    assert buf.schema["tok"].max_len == 16 and len(placer.history) == adopted  # type: ignore[attr-defined]


def test_placer_pins_and_bad_pins() -> None:
    _, buf = _placer_buffer()
    topo = _host_topology(host=10 * MB, shm=10 * MB)
    Placer(buf, topo, Traffic(10, 10), pins={"obs": "disk"}).place(force=True)  # type: ignore[arg-type]
    assert buf.storage.tiers == {"id": "host", "obs": "disk", "tok": "host"}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="unknown column"):
        Placer(buf, topo, Traffic(10, 10), pins={"nope": "disk"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not usable"):
        Placer(buf, topo, Traffic(10, 10), pins={"obs": "cuda:3"})  # type: ignore[arg-type]


def test_a_tier_that_disappears_is_left() -> None:
    _, buf = _placer_buffer()
    Placer(buf, _host_topology(host=10 * MB, shm=10 * MB), Traffic(10, 10), pins={"obs": "shm"}).place(
        force=True
    )  # type: ignore[arg-type]
    assert buf.storage.tiers["obs"] == "shm"  # type: ignore[attr-defined]
    gone = Placer(buf, _host_topology(host=10 * MB, shm=0), Traffic(10, 10))  # type: ignore[arg-type]
    assert gone.priced_current() is None  # the current placement no longer fits
    assert gone.place("shm gone") is not None
    assert "shm" not in buf.storage.tiers.values()  # type: ignore[attr-defined]


def test_a_plan_that_cannot_fit_names_the_missing_bytes() -> None:
    _, buf = _placer_buffer()
    placer = Placer(buf, _host_topology(host=1000, shm=1000, disk=1000), Traffic(10, 10))  # type: ignore[arg-type]
    with pytest.raises(PlacementCapacityError, match="bytes") as err:
        placer.grow("tok", 1000)
    assert isinstance(err.value, CapacityError) and err.value.missing_bytes > 0
    assert buf.schema["tok"].max_len == 8  # type: ignore[attr-defined]  # nothing changed


def test_greedy_and_conservative_policies() -> None:
    topo = _host_topology(host=100_000, shm=10 * MB)
    fields = column_fields(SCHEMA, 1000, Traffic(100, 100), usable_tiers(topo))
    g = greedy_fastest(fields, topo)
    assert g.assignment["id"] == "node0/host" and g.assignment["tok"] != "node0/host"
    c = conservative(fields, topo)
    assert set(c.assignment.values()) == {"node0/disk"}
    assert c.predicted_s > g.predicted_s


def test_auto_tier_plans_at_build_and_honours_pins(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="conduit.placement"):
        buf = build_buffer(BufferConfig(capacity=32, pins={"obs": "disk"}), SCHEMA)
    assert buf.storage.tiers["obs"] == "disk"  # type: ignore[attr-defined]
    assert buf.placer is not None and "placement by" in caplog.text
    buf.extend(_batch(0, 4))
    _check_rows(buf.sample(4).batch)
    with pytest.raises(ConfigError, match="unknown column"):
        build_buffer(BufferConfig(capacity=32, pins={"nope": "disk"}), SCHEMA)
    with pytest.raises(ConfigError, match="pins must map"):
        BufferConfig(capacity=32, pins={"obs": "moon"})


def test_auto_placement_leaves_shared_memory_to_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared memory only pays when another process maps a column, which a buffer's own traffic never
    does: even where shm measured faster than pageable host, unpinned columns go to host; a pin to
    shm is still honoured."""
    fast_shm = _host_topology(10**12, 10**12)
    fast_shm = Topology(
        fast_shm.tiers,
        tuple(
            Link(lk.src, lk.dst, 20.0 if "shm" in lk.dst else lk.gb_per_s, lk.latency_us)
            for lk in fast_shm.links
        ),
        "test",
    )
    monkeypatch.setattr("conduit.discovery.local_topology", lambda: fast_shm)
    buf = build_buffer(BufferConfig(capacity=32), SCHEMA)
    assert set(buf.storage.tiers.values()) == {"host"}  # type: ignore[attr-defined]
    pinned = build_buffer(BufferConfig(capacity=32, pins={"obs": "shm"}), SCHEMA)
    assert pinned.storage.tiers["obs"] == "shm"  # type: ignore[attr-defined]
    assert fast_shm.without("shm").tiers == tuple(t for t in fast_shm.tiers if t.kind != "shm")
    assert all("shm" not in lk.src + lk.dst for lk in fast_shm.without("shm").links)
    assert fast_shm.without("hbm") is fast_shm
