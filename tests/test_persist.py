"""conduit.persist: safe checkpoints (exact, occupied slots only, incremental, corrupt ones skipped) and
the journal (durable commits, replay, torn tails)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Ragged, SchedulerConfig, Schema
from conduit.build_buffer import build_buffer
from conduit.config import JournalConfig
from conduit.errors import CheckpointError, ConfigError
from conduit.persist import Journal, load_checkpoint, replay, save_checkpoint
from conduit.persist.atomic import inside, local_dir, publish_dir, remove_stale, temp_sibling
from conduit.persist.format import encode, frame, parse_record

SCHEMA = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])


def batch(n: int, start: int) -> ColumnBatch:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return ColumnBatch({"obs": x[:, None].repeat(1, 4), "reward": x})


def prioritized(capacity: int = 64, **kw) -> Conduit:
    return Conduit(SCHEMA, BufferConfig.prioritized_replay(capacity, **kw), seed=0)


def fill(c: Conduit, items: int, step: int = 8) -> None:
    for s in range(0, items, step):
        c.put(batch(step, s))
    d = c.get(16)
    c.update_priorities(d, torch.rand(16) * 5)


def same(a: Conduit, b: Conduit, versions: bool = True) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["versions"] == sb["versions"] or not versions
    ba, bb = sa["buffer"], sb["buffer"]
    assert ba["inserted"] == bb["inserted"]
    assert ba["sampled"] == bb["sampled"] or not versions  # a journal holds commits, not sample counts
    for k, v in ba["storage"].items():
        assert torch.equal(v, bb["storage"][k]), k
    ta, tb = ba["sampler"]["tree"], bb["sampler"]["tree"]
    assert torch.equal(ta["priorities"], tb["priorities"]) and torch.equal(ta["written"], tb["written"])
    assert ba["sampler"]["max_priority"] == bb["sampler"]["max_priority"]


def test_roundtrip_is_exact(tmp_path: Path) -> None:
    a = prioritized()
    fill(a, 100)  # wraps the ring: every slot occupied
    a.save(tmp_path)
    b = prioritized()
    b.load(tmp_path)
    same(a, b)
    assert b.get(8).batch.size == 8


def test_only_occupied_slots_are_written(tmp_path: Path) -> None:
    schema = Schema([Column("obs", torch.float32, (64,))])
    c = Conduit(schema, BufferConfig.prioritized_replay(200_000))  # 51 MB of slots
    c.put(ColumnBatch({"obs": torch.randn(600, 64)}))
    report = c.save(tmp_path)
    assert report.items == 600
    assert report.bytes_written < 600 * 64 * 4 + 200_000  # rows + small state, not the capacity
    d = Conduit(schema, BufferConfig.prioritized_replay(200_000))
    d.load(tmp_path)
    assert torch.equal(d.buffer.storage.data["obs"][:600], c.buffer.storage.data["obs"][:600])
    assert d.buffer.inserted == 600 and len(d.buffer) == 600


def test_second_save_rewrites_only_changed_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "conduit.persist.checkpoint.SEGMENT_BYTES", 16 * 36
    )  # 36 bytes per slot  # 16 slots per segment
    a = prioritized(capacity=128)
    fill(a, 128)
    first = a.save(tmp_path)
    assert first.segments_written == 8 and first.segments_reused == 0
    a.put(batch(8, 1000))  # rewrites slots 0..7: one segment
    second = a.save(tmp_path)
    assert (second.segments_written, second.segments_reused) == (1, 7)
    assert second.pause_s < 1.0
    b = prioritized(capacity=128)
    b.load(tmp_path)
    same(a, b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001", "ckpt-000002"]


def test_corrupt_newest_checkpoint_falls_back_to_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = prioritized()
    fill(a, 40)
    a.save(tmp_path)
    reference = prioritized()
    reference.load(tmp_path)
    a.put(batch(8, 500))
    a.save(tmp_path)
    seg = next((tmp_path / "ckpt-000002").glob("seg-*.cdr"))
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte
    os.unlink(seg)
    seg.write_bytes(data)
    b = prioritized()
    with caplog.at_level(logging.WARNING):
        used = b.load(tmp_path)
    assert used.endswith("ckpt-000001")
    assert "checksum mismatch" in caplog.text and "ckpt-000002" in caplog.text
    same(b, reference)


def test_no_intact_checkpoint_raises_and_leaves_the_buffer_unchanged(tmp_path: Path) -> None:
    a = prioritized()
    fill(a, 40)
    a.save(tmp_path)
    state = next((tmp_path / "ckpt-000001").glob("state.cdr"))
    state.write_bytes(state.read_bytes()[:-10])  # truncated
    b = prioritized()
    b.put(batch(8, 7))
    before = b.state_dict()
    with pytest.raises(CheckpointError, match="truncated"):
        b.load(tmp_path)
    after = b.state_dict()
    assert torch.equal(before["buffer"]["storage"]["data/obs"], after["buffer"]["storage"]["data/obs"])
    assert after["buffer"]["inserted"] == 8
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        b.load(tmp_path / "empty")


def test_incompatible_schema_or_capacity_raises(tmp_path: Path) -> None:
    a = prioritized()
    fill(a, 16)
    a.save(tmp_path)
    with pytest.raises(CheckpointError, match="does not fit"):
        prioritized(capacity=32).load(tmp_path)
    other = Conduit(Schema([Column("obs", torch.float32, (5,)), Column("reward", torch.float32)]))
    with pytest.raises(CheckpointError, match="does not fit"):
        other.load(tmp_path)
    with pytest.raises(CheckpointError, match="sampler"):
        Conduit(SCHEMA, BufferConfig.uniform_replay(64)).load(tmp_path)


def test_format_refuses_pickle_and_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no pickle"):
        encode({"f": lambda: 0}, [])
    with pytest.raises(CheckpointError, match="leave"):
        inside(tmp_path, "../x")
    with pytest.raises(CheckpointError, match="local directory"):
        local_dir("s3://bucket/x")
    data = bytearray(b"".join(bytes(p) for p in frame({"a": 1}, [torch.arange(4)])))
    meta, tensors, end = parse_record(data, 0)
    assert meta == {"a": 1} and torch.equal(tensors[0], torch.arange(4)) and end == len(data)
    with pytest.raises(CheckpointError, match="bad magic"):
        parse_record(b"X" + data[1:], 0)


def test_journal_replays_commits_and_priorities_exactly(tmp_path: Path) -> None:
    cfg = BufferConfig.prioritized_replay(64, journal={"path": str(tmp_path / "j"), "flush_interval_s": 0.05})
    a = Conduit(SCHEMA, cfg, seed=0)
    fill(a, 100)
    a.journal.flush()
    assert a.journal.records > 0 and a.journal.max_lag_s < 1.0
    b = Conduit(SCHEMA, BufferConfig.prioritized_replay(64), seed=0)
    report = replay(tmp_path / "j", b)
    assert report.items == 104 and report.priority_updates == 16 and report.damaged == ()
    same(a, b, versions=False)  # the journal holds the buffer, not the runtime's version order
    a.close()


def test_checkpoint_then_journal_recovers_everything(tmp_path: Path) -> None:
    cfg = BufferConfig.prioritized_replay(64, journal=JournalConfig(str(tmp_path / "j"), 0.05))
    a = Conduit(SCHEMA, cfg, seed=0)
    fill(a, 48)
    a.save(tmp_path / "ckpt")
    fill(a, 40)
    a.journal.close()  # final flush (a stays open to compare)
    b = Conduit(SCHEMA, cfg, seed=0)  # replays the whole journal at construction
    same(a, b, versions=False)
    b.close()  # one writer per journal directory
    c = Conduit(SCHEMA, cfg, seed=0)
    c.load(tmp_path / "ckpt")  # the checkpoint, then the journal's later records
    same(a, c, versions=False)
    c.close()


def test_torn_journal_tail_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    j = Journal(tmp_path, flush_interval_s=10)
    buf = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    buf.observer = j
    buf.extend(batch(8, 0))
    buf.extend(batch(8, 8))
    j.close()
    path = j.path
    path.write_bytes(path.read_bytes()[:-5])
    fresh = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    with caplog.at_level(logging.WARNING):
        report = replay(tmp_path, fresh)
    assert report.items == 8 and len(report.damaged) == 1 and "truncated" in report.damaged[0].reason
    assert report.lost_items == () and report.compacted is None  # a torn tail loses nothing durable
    assert "journal replay skipped journal-000001.cdr bytes" in caplog.text
    assert fresh.inserted == 8


def test_journal_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="flush_interval_s"):
        BufferConfig(journal={"path": "/tmp/x", "flush_interval_s": 0})
    with pytest.raises(ConfigError, match="unknown JournalConfig"):
        BufferConfig(journal={"path": "/tmp/x", "fsync": True})


def test_a_bare_buffer_saves_and_loads(tmp_path: Path) -> None:
    a = build_buffer(BufferConfig(capacity=32, sampler="fifo"), SCHEMA)
    a.extend(batch(20, 0))
    a.sample(5)
    save_checkpoint(a, tmp_path)
    b = build_buffer(BufferConfig(capacity=32, sampler="fifo"), SCHEMA)
    load_checkpoint(b, tmp_path)
    assert len(b) == 15 and torch.equal(b.sample(15).batch.columns["reward"], torch.arange(5, 20.0))


def test_save_under_concurrent_puts_is_a_consistent_prefix(tmp_path: Path) -> None:
    """Ingestion goes on while a save copies; the checkpoint holds items 0..n-1 exactly, none torn."""
    schema = Schema([Column("id", torch.int64), Column("obs", torch.float32, (32,))])
    cfg = BufferConfig.prioritized_replay(50_000)
    c = Conduit(schema, cfg, SchedulerConfig(overlap="async"))
    stop = threading.Event()
    done = [0]

    def produce() -> None:
        while not stop.is_set():
            ids = torch.arange(done[0], done[0] + 256)
            c.put(ColumnBatch({"id": ids, "obs": ids[:, None].float().expand(256, 32)}))
            done[0] += 256

    t = threading.Thread(target=produce)
    t.start()
    try:
        time.sleep(0.05)
        reports = [c.save(tmp_path) for _ in range(3)]
    finally:
        stop.set()
        t.join()
    assert all(r.pause_s < r.total_s for r in reports)
    d = Conduit(schema, cfg)
    d.load(tmp_path)
    n = d.buffer.inserted
    assert 0 < n <= done[0]
    storage = d.buffer.storage
    kept = min(n, 50_000)  # the ring holds the newest items, each in the slot its generation says
    gen, ids = storage.generation, storage.data["id"]
    assert torch.equal(gen.sort().values[-kept:], torch.arange(n - kept + 1, n + 1))
    assert torch.equal(ids[gen > 0], gen[gen > 0] - 1)
    assert torch.equal(storage.data["obs"], ids[:, None].float().expand(-1, 32))
    c.close()


def test_ragged_groups_checkpoint_and_journal(tmp_path: Path) -> None:
    schema = Schema([Column("tokens", torch.int64, ragged=True, max_len=8), Column("adv", torch.float32)])
    cfg = BufferConfig.on_policy(32, group_size=4, journal={"path": str(tmp_path / "j")})
    a = Conduit(schema, cfg)
    lengths = torch.tensor([3, 1, 8, 2])
    a.put(ColumnBatch({"tokens": Ragged.from_lengths(torch.arange(14), lengths), "adv": torch.randn(4)}))
    a.get(2)
    a.save(tmp_path / "ck")
    a.put(
        ColumnBatch({"tokens": Ragged.from_lengths(torch.arange(14) + 100, lengths), "adv": torch.randn(4)})
    )
    a.journal.close()
    b = Conduit(schema, BufferConfig.on_policy(32, group_size=4, journal={"path": str(tmp_path / "j")}))
    b.load(tmp_path / "ck")
    assert b.buffer.inserted == 8 and len(b.buffer) == 6  # two consumed before the save stay consumed
    for key in ("data/tokens", "lengths/tokens", "data/adv"):
        assert torch.equal(a.buffer.storage.state_dict()[key], b.buffer.storage.state_dict()[key])
    b.close()


def test_publish_replaces_a_directory_whole_and_stale_leftovers_are_handled(tmp_path: Path) -> None:
    final = tmp_path / "ck"
    final.mkdir()
    (final / "old").write_text("old")
    new = temp_sibling(final)
    new.mkdir()
    (new / "new").write_text("new")
    publish_dir(new, final)
    assert sorted(p.name for p in final.iterdir()) == ["new"] and not new.exists()
    # the fallback's window: the old version renamed aside by a process that died, nothing at ``final``
    aside = tmp_path / "ck.old-999999999-0"
    final.rename(aside)
    (tmp_path / "ck.tmp-999999999-1").mkdir()
    remove_stale(final)
    assert (final / "new").exists() and not aside.exists()
    assert not (tmp_path / "ck.tmp-999999999-1").exists()


# -- journal pruning and path validation ---------------------------------------------------------


def journaled(tmp_path: Path) -> BufferConfig:
    return BufferConfig.prioritized_replay(64, journal=JournalConfig(str(tmp_path / "j"), 0.05))


def journal_names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "j").glob("journal-*.cdr"))


def test_save_prunes_the_journal_files_the_kept_checkpoints_hold(tmp_path: Path) -> None:
    a = Conduit(SCHEMA, journaled(tmp_path), seed=0)
    for _ in range(6):
        fill(a, 16)  # 16 items, then a priority update
        a.save(tmp_path / "ckpt")
    # without pruning there would be one file per save plus the current one (7); the KEEP=3 kept
    # checkpoints hold all but the last three saves' files
    names = journal_names(tmp_path)
    assert len(names) <= 4 and names[-1] == "journal-000007.cdr", names
    assert (tmp_path / "j" / "pruned.cdr").exists()
    fill(a, 8)
    a.journal.close()
    b = Conduit(SCHEMA, journaled(tmp_path), seed=0)  # the journal alone: loads the checkpoint it names first
    same(a, b, versions=False)
    b.close()
    c = Conduit(SCHEMA, journaled(tmp_path), seed=0)
    c.load(tmp_path / "ckpt")  # checkpoint + the remaining journal: exact
    same(a, c, versions=False)
    c.close()
    with pytest.raises(CheckpointError, match="does not continue the buffer"):
        replay(tmp_path / "j", prioritized())  # a pruned journal is never replayed into an empty buffer


def test_a_corrupt_newest_checkpoint_still_recovers_with_the_pruned_journal(tmp_path: Path) -> None:
    a = Conduit(SCHEMA, journaled(tmp_path), seed=0)
    fill(a, 16)
    for i in range(4):
        a.put(batch(16, 16 * i))  # no priority update after the last put: each save covers its file
        a.save(tmp_path / "ckpt")
    fill(a, 8)
    a.journal.close()
    newest = sorted((tmp_path / "ckpt").glob("ckpt-*"))[-1]
    (newest / "state.cdr").write_bytes(b"torn")
    b = Conduit(SCHEMA, journaled(tmp_path), seed=0)
    b.load(tmp_path / "ckpt")  # falls back to the previous checkpoint; the journal still covers the rest
    same(a, b, versions=False)
    b.close()


def test_a_crash_before_or_during_the_prune_still_recovers_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Conduit(SCHEMA, journaled(tmp_path), seed=0)
    for _ in range(3):  # KEEP=3 checkpoints: the next save's oldest kept one holds the first file
        fill(a, 16)
        a.save(tmp_path / "ckpt")
    fill(a, 16)
    before = {p.name: p.read_bytes() for p in (tmp_path / "j").glob("journal-*.cdr")}

    def crash(*_a: object, **_k: object) -> None:
        raise OSError("crash while publishing")

    with monkeypatch.context() as m:  # a crash before the checkpoint is durable: the journal is untouched
        m.setattr("conduit.persist.checkpoint.atomic.publish_dir", crash)
        with pytest.raises(CheckpointError, match="crash"):
            a.save(tmp_path / "ckpt")
    assert set(before) <= set(journal_names(tmp_path))
    a.save(tmp_path / "ckpt")
    removed = set(before) - set(journal_names(tmp_path))
    assert removed, "this save prunes the first file"
    for name in removed:  # a crash after the marker, before the files went: they come back
        (tmp_path / "j" / name).write_bytes(before[name])
    fill(a, 8)
    a.journal.close()
    b = Conduit(SCHEMA, journaled(tmp_path), seed=0)
    b.load(tmp_path / "ckpt")
    same(a, b, versions=False)
    b.close()


def test_paths_that_lead_outside_their_directory_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "ckpt"
    a = prioritized()
    fill(a, 16)
    a.save(root)
    (root / "ckpt-000009").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CheckpointError, match="symbolic link"):
        a.save(root)
    with pytest.raises(CheckpointError, match="symbolic link"):
        prioritized().load(root)
    assert list(outside.iterdir()) == []
    (root / "ckpt-000009").unlink()
    seg = next((root / "ckpt-000001").glob("seg-*.cdr"))
    target = outside / "seg.cdr"
    target.write_bytes(seg.read_bytes())
    seg.unlink()
    seg.symlink_to(target)
    with pytest.raises(CheckpointError, match="symbolic link"):
        prioritized().load(root)
    jdir = tmp_path / "j"
    jdir.mkdir()
    (jdir / "journal-000001.cdr").symlink_to(outside / "journal.cdr")
    with pytest.raises(CheckpointError, match="symbolic link"):
        Journal(jdir)
    with pytest.raises(CheckpointError, match="leave"):
        inside(root, "../ckpt-000001")
    assert sorted(p.name for p in outside.iterdir()) == ["seg.cdr"]


def test_a_torn_tail_does_not_hide_what_the_next_opening_journaled(tmp_path: Path) -> None:
    """A crash tears the last record of one opening's file; the next opening continues from the
    tear in a new file: a later recovery replays both (the torn record alone is lost)."""
    first = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    j = Journal(tmp_path, flush_interval_s=10)
    first.observer = j
    first.extend(batch(8, 0))
    first.extend(batch(8, 8))
    j.close()
    j.path.write_bytes(j.path.read_bytes()[:-5])  # the crash
    second = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    assert replay(tmp_path, second).items == 8
    j2 = Journal(tmp_path, flush_interval_s=10)
    second.observer = j2
    second.extend(batch(8, 100))
    j2.close()
    third = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    report = replay(tmp_path, third)
    assert report.items == 16 and len(report.damaged) == 1  # the tear is still reported
    assert torch.equal(third.storage.data["reward"][:16], second.storage.data["reward"][:16])
    # a later file that does not continue from the tear (its records start further on): the items no
    # file holds are reported lost, the later ones follow on, and the journal is compacted
    fourth = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    fourth.extend(batch(24, 0))
    j3 = Journal(tmp_path, flush_interval_s=10)
    fourth.observer = j3
    fourth.extend(batch(8, 200))  # items 25..32, after the 17..24 no file holds
    j3.close()
    (tmp_path / j2.path.name).unlink()
    fifth = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    report = replay(tmp_path, fifth)
    assert report.items == 16 and report.lost_items == ((9, 24),) and fifth.inserted == 16
    assert fifth.storage.data["reward"][8:16].tolist() == list(range(200, 208))
    sixth = build_buffer(
        BufferConfig.uniform_replay(64), SCHEMA
    )  # the compacted journal: the same, nothing lost
    assert replay(tmp_path, sixth).damaged == () and torch.equal(
        sixth.storage.data["reward"], fifth.storage.data["reward"]
    )
