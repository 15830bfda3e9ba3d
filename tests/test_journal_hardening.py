"""The journal under damage and failure (issue 26): replay past a damaged record and stay the same on the
next recovery; consume-once across restarts; a failing journal refuses writes before they commit;
records with valid checksums but crafted contents never corrupt the buffer."""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import struct
import subprocess
import sys
import tempfile
import textwrap
import zlib
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conduit import BufferConfig, Column, ColumnBatch, Conduit, SchedulerConfig, Schema
from conduit.build_buffer import build_buffer
from conduit.errors import ConduitError, InsufficientDataError, JournalError
from conduit.persist import Journal, replay
from conduit.persist.format import MAGIC, frame
from conduit.persist.journal import Damage, scan

SCHEMA = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
ROOT = Path(__file__).resolve().parents[1]


def batch(n: int, start: int) -> ColumnBatch:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return ColumnBatch({"obs": x[:, None].repeat(1, 4), "reward": x})


def rewards(c: Conduit) -> list[float]:
    """The rewards of the items a ring buffer holds, oldest first (no wrap in these tests)."""
    return c.buffer.storage.data["reward"][: c.buffer.inserted].tolist()


def records(path: Path) -> list[tuple[int, int, dict]]:
    return [(e[0], e[1], e[2]) for e in scan(bytearray(path.read_bytes()), path.name)]


# -- item 4: replay past a damaged record, and the next recovery is the same --------------------------


def test_a_flipped_byte_mid_journal_loses_that_record_only_and_a_second_recovery_loses_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = BufferConfig.prioritized_replay(
        1024, journal={"path": str(tmp_path / "j"), "flush_interval_s": 0.05}
    )
    for part in (range(10), range(10, 15)):  # two openings: two journal files
        a = Conduit(SCHEMA, cfg, seed=0)
        for i in part:
            a.put(batch(10, 10 * i))
            d = a.get(4)
            a.update_priorities(d, torch.rand(4) + 0.5)
        a.close()
    path = tmp_path / "j" / "journal-000001.cdr"  # the oldest
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    hit = next(m for off, end, m in records(path) if off <= middle < end)
    if hit["kind"] != "items":  # flip a byte of the nearest items record instead
        off, end, hit = next((o, e, m) for o, e, m in records(path) if o > middle and m["kind"] == "items")
        middle = (off + end) // 2
    data[middle] ^= 0x5A
    path.write_bytes(bytes(data))
    lost = list(range(hit["first"] - 1, hit["first"] - 1 + hit["n"]))  # the rewards of its items

    with caplog.at_level(logging.WARNING):
        b = Conduit(SCHEMA, cfg, seed=0)
    want = [float(x) for x in range(150) if x not in lost]
    assert rewards(b) == want  # everything but the damaged record, in order
    assert f"journal replay skipped {path.name} bytes" in caplog.text
    assert f"items {hit['first']}..{hit['first'] + hit['n'] - 1} as journaled" in caplog.text
    assert (tmp_path / "j" / (path.name + ".damaged")).exists()  # kept for inspection
    written = b.buffer.sampler.tree.state_dict()["written"]
    assert int(written.sum()) == 140 and b.buffer.storage.generation[:140].tolist() == list(range(1, 141))
    for i in range(3):
        b.put(batch(10, 1000 + 10 * i))
    b.close()

    c = Conduit(SCHEMA, cfg, seed=0)  # the second recovery: all 170, nothing lost
    assert rewards(c) == want + [float(x) for x in range(1000, 1030)]
    assert torch.equal(
        c.buffer.sampler.tree.state_dict()["priorities"], b.buffer.sampler.tree.state_dict()["priorities"]
    )
    c.close()


def test_a_crash_between_compaction_and_removing_the_old_files_recovers_the_same(tmp_path: Path) -> None:
    j = tmp_path / "j"
    cfg = BufferConfig.uniform_replay(256, journal={"path": str(j), "flush_interval_s": 10})
    a = Conduit(SCHEMA, cfg)
    for i in range(6):
        a.put(batch(8, 8 * i))
    a.close()
    (path,) = j.glob("journal-*.cdr")
    data = bytearray(path.read_bytes())
    off, end, _ = records(path)[2]
    data[off + 30] ^= 0xFF  # the third record's header
    path.write_bytes(bytes(data))
    b = Conduit(SCHEMA, cfg)
    assert b.buffer.inserted == 40 and rewards(b)[16:24] == list(map(float, range(24, 32)))
    b.close()
    path.write_bytes(bytes(data))  # the damaged file is back: as if the crash came before its removal
    (j / (path.name + ".damaged")).unlink()
    c = Conduit(SCHEMA, cfg)  # the compaction supersedes it
    assert rewards(c) == rewards(b)
    c.close()
    assert not path.exists()


def test_an_intact_journal_with_a_gap_is_still_refused(tmp_path: Path) -> None:
    buf = build_buffer(BufferConfig.uniform_replay(64), SCHEMA)
    buf.extend(batch(8, 0))
    j = Journal(tmp_path, flush_interval_s=10)
    buf.observer = j
    buf.extend(batch(8, 8))  # items 9..16: no record holds 1..8, and nothing is damaged
    j.close()
    with pytest.raises(ConduitError, match="does not continue the buffer"):
        replay(tmp_path, build_buffer(BufferConfig.uniform_replay(64), SCHEMA))


def test_conduit_load_over_a_damaged_journal_compacts_it_and_journals_on(tmp_path: Path) -> None:
    cfg = BufferConfig.uniform_replay(512, journal={"path": str(tmp_path / "j"), "flush_interval_s": 10})
    a = Conduit(SCHEMA, cfg)
    for i in range(4):
        a.put(batch(10, 10 * i))
    a.save(tmp_path / "ckpt")  # items 1..40; their journal file is pruned
    for i in range(4, 12):
        a.put(batch(10, 10 * i))  # items 41..120
    a.close()
    b = Conduit(SCHEMA, cfg)  # the checkpoint, then 41..120
    for i in range(12, 14):
        b.put(batch(10, 10 * i))  # 121..140, in b's live file
    b.journal.flush()
    older = sorted((tmp_path / "j").glob("journal-*.cdr"))[-2]
    data = bytearray(older.read_bytes())
    off, end, meta = records(older)[4]  # items 81..90
    data[(off + end) // 2] ^= 0x01
    older.write_bytes(bytes(data))
    b.load(tmp_path / "ckpt")  # replays past the damage, renumbers, compacts, and the journal goes on
    want = [float(x) for x in range(140) if not 80 <= x < 90]
    assert rewards(b) == want
    b.put(batch(10, 1000))
    b.close()
    c = Conduit(SCHEMA, cfg)
    assert rewards(c) == want + [float(x) for x in range(1000, 1010)]
    c.close()


# -- item 5: on-policy FIFO with a journal ------------------------------------------------------------


def fifo_cfg(path: Path) -> BufferConfig:
    return BufferConfig.on_policy(50, timeout_s=2.0, journal={"path": str(path), "flush_interval_s": 0.05})


def run_fifo(c: Conduit) -> list[float]:
    """150 items through a FIFO of capacity 50 (all consumed), then 50 more of which 20 are consumed."""
    seen: list[float] = []
    for i in range(15):
        c.put(batch(10, 10 * i))
        seen += c.get(10).batch["reward"].tolist()
    for i in range(15, 20):
        c.put(batch(10, 10 * i))
    seen += c.get(20).batch["reward"].tolist()
    return seen


def check_reopened(path: Path, overlap: str = "sync") -> None:
    c = Conduit(SCHEMA, fifo_cfg(path), SchedulerConfig(overlap=overlap))
    assert len(c.buffer) == 30  # the 30 never delivered; not the 170 that were
    assert c.get(30).batch["reward"].tolist() == [float(x) for x in range(170, 200)]
    with pytest.raises(InsufficientDataError):
        c.buffer.sample(1)  # nothing more: each item once
    c.put(batch(10, 500), version=0)
    c.close()
    d = Conduit(SCHEMA, fifo_cfg(path), SchedulerConfig(overlap=overlap))  # the 30 are consumed now too
    assert d.get(10).batch["reward"].tolist() == [float(x) for x in range(500, 510)] and len(d.buffer) == 0
    d.close()


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_fifo_with_a_journal_reopens_after_more_than_capacity_and_delivers_each_item_once(
    tmp_path: Path, overlap: str
) -> None:
    c = Conduit(SCHEMA, fifo_cfg(tmp_path / "j"), SchedulerConfig(overlap=overlap))
    assert run_fifo(c) == [float(x) for x in range(170)]
    c.close()
    check_reopened(tmp_path / "j", overlap)


def test_fifo_with_a_journal_after_a_kill_delivers_each_undelivered_item_once(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_journal_hardening import SCHEMA, fifo_cfg, run_fifo
        from pathlib import Path
        from conduit import Conduit
        c = Conduit(SCHEMA, fifo_cfg(Path({str(tmp_path / "j")!r})))
        assert run_fifo(c) == [float(x) for x in range(170)]
        c.journal.flush()
        os._exit(0)  # no close(): the journal's file is as a kill leaves it
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=120)
    check_reopened(tmp_path / "j")


# -- item 8: a journal that fails refuses the write before it commits -----------------------------------


class _Full:
    """A journal file whose writes fail after ``room`` bytes, as on a full disk."""

    def __init__(self, f, room: int) -> None:  # noqa: ANN001
        self.f, self.room = f, room

    def write(self, part) -> int:  # noqa: ANN001
        n = len(part) if isinstance(part, bytes) else memoryview(part).nbytes
        if n > self.room:
            raise OSError(28, "No space left on device")
        self.room -= n
        return self.f.write(part)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.f, name)


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_a_journal_that_fails_refuses_the_next_write_before_committing(tmp_path: Path, overlap: str) -> None:
    cfg = BufferConfig.prioritized_replay(256, journal={"path": str(tmp_path / "j"), "flush_interval_s": 60})
    c = Conduit(SCHEMA, cfg, SchedulerConfig(overlap=overlap), seed=0)
    c.put(batch(8, 0))
    c.flush()
    c.journal.flush()
    c.journal._file = _Full(c.journal._file, 100)  # the disk fills up
    c.put(batch(8, 8))  # committed; its record is still queued
    c.flush()
    with pytest.raises(JournalError, match="No space left"):
        c.journal.flush()
    for _ in range(3):  # every retry is refused before anything is committed
        with pytest.raises(JournalError, match="No space left"):
            c.put(batch(8, 16))
            c.flush()  # async: the refusal surfaces here
    if overlap == "sync":
        d = c.get(4)
        with pytest.raises(JournalError, match="No space left"):
            c.update_priorities(d, torch.ones(4))
    assert c.buffer.inserted == 16 and rewards(c) == [float(x) for x in range(16)]
    with pytest.raises(JournalError):
        c.close()


def test_a_file_size_limit_makes_puts_fail_cleanly_and_none_is_duplicated(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import json, resource, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_journal_hardening import SCHEMA, batch
        from conduit import BufferConfig, Conduit
        from conduit.errors import JournalError
        cfg = BufferConfig.uniform_replay(4096, journal={{"path": {str(tmp_path / "j")!r}, "flush_interval_s": 0.01}})
        c = Conduit(SCHEMA, cfg)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
        ok = refused = 0
        error = ""
        for i in range(400):
            try:
                c.put(batch(8, 8 * ok))  # a retry puts the same items again
                ok += 1
            except JournalError as e:
                refused += 1
                error = str(e)
                if refused == 3:
                    break
            time.sleep(0.01)
        print(json.dumps({{"ok": ok, "refused": refused, "inserted": c.buffer.inserted,
                           "rewards": c.buffer.storage.data["reward"][: c.buffer.inserted].tolist(),
                           "error": error}}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, cwd=ROOT, timeout=120, capture_output=True, text=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["refused"] == 3 and "File too large" in got["error"], got
    assert got["inserted"] == 8 * got["ok"]  # every put that returned, and only those
    assert got["rewards"] == [float(x) for x in range(8 * got["ok"])]  # no item twice


# -- fuzzing: records with valid checksums, crafted contents -------------------------------------------


def _journal_bytes(kind: str) -> bytes:
    """A small journal file of a ``kind`` buffer ('fifo': with deliveries; 'prioritized': with updates)."""
    with tempfile.TemporaryDirectory() as d:
        if kind == "fifo":
            cfg = BufferConfig.on_policy(16, timeout_s=1.0, journal={"path": d, "flush_interval_s": 60})
        else:
            cfg = BufferConfig.prioritized_replay(16, journal={"path": d, "flush_interval_s": 60})
        c = Conduit(SCHEMA, cfg, seed=0)
        for i in range(6):
            c.put(batch(4, 4 * i))
            got = c.get(4)
            if kind != "fifo":
                c.update_priorities(got, torch.rand(4))
        c.close()
        (path,) = Path(d).glob("journal-*.cdr")
        return path.read_bytes()


@functools.cache
def journals() -> dict[str, bytes]:
    return {kind: _journal_bytes(kind) for kind in ("fifo", "prioritized")}


_FRAME = struct.Struct("<4sIQI")


def _reframe(header: bytes, payload: bytes) -> bytes:
    """A record of ``header`` and ``payload`` with its lengths and checksum recomputed (format.frame's)."""
    crc = zlib.crc32(payload, zlib.crc32(header))
    return _FRAME.pack(MAGIC, len(header), len(payload), crc) + header + payload


def _split(data: bytes) -> list[tuple[bytes, bytes, list[torch.Tensor]]]:
    out = []
    for off, end, _, tensors in scan(bytearray(data), "j"):
        _, hlen, _, _ = _FRAME.unpack_from(data, off)
        body = data[off + _FRAME.size : end]
        out.append((body[:hlen], body[hlen:], [t.clone() for t in tensors]))
    return out


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)
_metas = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["items", "priorities", "delivered", "compacted", "other"]) | _json,
        "first": st.integers(-5, 2**64) | _json,
        "n": st.integers(-2, 40) | _json,
        "version": st.integers(-3, 3) | _json,
        "after": st.integers(-2, 2**64) | _json,
        "supersedes": st.integers(-1, 5) | _json,
        "cols": st.just([["obs", "fixed"], ["reward", "fixed"]]) | _json,
    },
)


def _consistent(c: Conduit) -> None:
    buf = c.buffer
    n = buf.inserted
    assert 0 <= n < 2**62
    state = buf.sampler.state_dict()
    if state["kind"] == "fifo":
        assert state["tail"] == n and 0 <= n - state["head"] <= buf.capacity
    else:
        assert state["size"] == min(n, buf.capacity)


@example(kind="prioritized", which=3, how="meta", at=0, junk=b"x", meta={"kind": "items"})
@example(kind="fifo", which=5, how="meta", at=0, junk=b"x", meta={"kind": "delivered", "after": 2**64})
@settings(
    max_examples=int(os.environ.get("FUZZ_N", 100)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(["fifo", "prioritized"]),
    which=st.integers(0, 40),
    how=st.sampled_from(["bytes", "meta"]),
    at=st.integers(0, 10_000),
    junk=st.binary(min_size=1, max_size=64),
    meta=_metas,
)
def test_records_with_valid_checksums_and_crafted_contents_never_corrupt_the_buffer(
    kind: str, which: int, how: str, at: int, junk: bytes, meta: dict
) -> None:
    parts = _split(journals()[kind])
    i = which % len(parts)
    header, payload, tensors = parts[i]
    if how == "bytes":  # random bytes over the header or the payload
        body = bytearray(header + payload)
        pos = at % len(body)
        body[pos : pos + len(junk)] = junk
        split = min(len(header), len(body))
        header, payload = bytes(body[:split]), bytes(body[split:])
        crafted = _reframe(header, payload)
    else:  # a well-formed record (its own tensors) whose meta is anything
        crafted = b"".join(bytes(p) for p in frame(meta, tensors))
    parts_bytes = [_reframe(h, p) for h, p, _ in parts]
    parts_bytes[i] = crafted
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "journal-000001.cdr").write_bytes(b"".join(parts_bytes))
        cfg = (
            BufferConfig.on_policy(16, timeout_s=0.5)
            if kind == "fifo"
            else BufferConfig.prioritized_replay(16, timeout_s=0.5)
        )
        c = Conduit(SCHEMA, cfg, seed=0)
        try:
            report = replay(d, c)
        except ConduitError:
            report = None  # refused with a clear error: fine
        _consistent(c)
        if report is not None:
            assert report.items <= 24 + 4  # never more than was journaled (+ one crafted record)
            c.buffer.sample(1) if len(c.buffer) else None  # still usable
        c.close()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024  # KiB: bounded


def test_the_fuzz_corpus_is_intact_and_replays_whole() -> None:
    for kind, data in journals().items():
        assert not any(isinstance(e, Damage) for e in scan(bytearray(data), "j"))
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "journal-000001.cdr").write_bytes(data)
            cfg = BufferConfig.on_policy(16) if kind == "fifo" else BufferConfig.prioritized_replay(16)
            report = replay(d, build_buffer(cfg, SCHEMA))
            assert report.damaged == () and report.items == (0 if kind == "fifo" else 24)
