"""An append-only journal of what lands in a buffer: committed writes, priority updates, deliveries.

The buffer asks the journal before each commit (:meth:`Journal.check`: a journal that failed refuses
the write with :class:`~conduit.errors.JournalError`, so a write either happened or did not) and
tells it of each commit under its lock (:meth:`Journal.committed`, one call per write, references
only, never raising); a background thread writes the queued records in Conduit's record format
every ``flush_interval_s`` and fsyncs them. A crash loses at most what was committed since the last
fsync: :attr:`Journal.max_lag_s` is the longest measured time from commit to durable. On a
consume-once (FIFO) buffer, ``Conduit.get`` also journals how far the deliveries reached
(:meth:`Journal.delivered`), so items handed out are not handed out again after a restart.

:func:`replay` puts the journal back into a buffer, in commit order, after what a checkpoint holds.
A damaged record (torn by a crash, a flipped byte, a record that does not fit the buffer) is skipped:
replay resynchronises on the next record whose checksum verifies and goes on, and reports every
byte range skipped and every item lost (:class:`ReplayReport`, and a warning). When items were lost
the journal is rewritten (*compacted*) into one new file holding exactly what the buffer now holds,
so a later recovery gives the same buffer and continues with what was written since. A FIFO buffer
gets back the items not yet delivered, once; consumed items are never written back.

One writer per directory: a journal holds an exclusive lock on its directory for its life
(:class:`~conduit.persist.writer_lock.WriterLock`, released on close and by the OS when the process
dies); a second opener gets :class:`~conduit.errors.JournalLockedError` naming the holder.
:func:`open_journal` takes the lock before it replays. :func:`replay` alone takes no lock.

Pruning: after a checkpoint is durable, :meth:`Journal.prune` starts a new file (opened before the
current one is closed, so a commit racing it always lands in an open file) and removes the older
files every record of which the checkpoints kept under that root already hold (oldest first, so
what remains is always a contiguous tail). It first writes ``pruned.cdr`` naming the checkpoint
root; :func:`open_journal` on a buffer that lacks those records loads that checkpoint before the
replay, so a journal alone still recovers everything, and ``Conduit.load`` stays exact.

Callers must not modify a batch's tensors after handing it to the buffer (the same contract as an
async ``Conduit.put``): the journal writes them a moment later.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from conduit.batch import ColumnBatch, Ragged
from conduit.buffer.buffer import ExperienceBuffer
from conduit.config import JournalConfig
from conduit.errors import CheckpointError, ConduitError, JournalError
from conduit.metrics import Metrics
from conduit.persist import atomic
from conduit.persist.checkpoint import Runtime, load_checkpoint
from conduit.persist.format import MAGIC, frame, parse_record, write_record
from conduit.persist.writer_lock import WriterLock

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "journal-", ".cdr"
PRUNED = "pruned.cdr"  # where the records pruned from the journal are: {"inserted", "checkpoint"}
DAMAGED = ".damaged"  # a journal file a compaction replaced, kept for inspection: journal-NNNNNN.cdr.damaged
_MAX = 1 << 62  # an item number, count or version beyond this is corrupt
# what parsing a damaged or crafted record may raise (format.parse_record wraps most in CheckpointError)
_BAD_RECORD = (CheckpointError, ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError)


class _NotReplayable(CheckpointError):
    """An intact journal that cannot go into this buffer (a gap no damage explains): raised, never skipped."""


@dataclass(frozen=True)
class Damage:
    """Bytes ``[start, end)`` of journal file ``file`` that replay skipped, and why."""

    file: str
    start: int
    end: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file} bytes {self.start}..{self.end} ({self.end - self.start} bytes: {self.reason})"


def scan(
    data: bytearray, name: str
) -> Iterator[tuple[int, int, dict[str, Any], list[torch.Tensor]] | Damage]:
    """``(offset, end, meta, tensors)`` of every intact record of ``data`` in order, and a :class:`Damage`
    for each stretch that is not one: after a bad record, reading resumes at the next place where a
    record's magic, lengths and checksum verify (the tensors share ``data``'s memory)."""
    offset, size = 0, len(data)
    while offset < size:
        try:
            meta, tensors, end = parse_record(data, offset)
            if not isinstance(meta, dict):
                raise CheckpointError(f"record at byte {offset}: its meta is not an object")
        except _BAD_RECORD as e:
            end = _resync(data, offset + 1)
            yield Damage(name, offset, end, str(e)[:200])
            offset = end
            continue
        yield offset, end, meta, tensors
        offset = end


def _resync(data: bytearray, start: int) -> int:
    """The first offset from ``start`` where an intact record begins (``len(data)``: none does)."""
    pos = start
    while (pos := data.find(MAGIC, pos)) >= 0:
        try:
            meta, _, _ = parse_record(data, pos)
            if isinstance(meta, dict):
                return pos
        except _BAD_RECORD:
            pass
        pos += 1
    return len(data)


def _count(meta: dict[str, Any], key: str, low: int = 0) -> int | None:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < _MAX:
        return None
    return value


def _items_record(
    batch: ColumnBatch, version: int, first_generation: int
) -> tuple[dict[str, Any], list[torch.Tensor]]:
    names, tensors = [], []
    for name, col in batch.columns.items():
        if isinstance(col, Ragged):
            names.append([name, "ragged"])
            tensors += [col.values, col.offsets]
        else:
            names.append([name, "fixed"])
            tensors.append(col)
    meta = {"kind": "items", "n": batch.size, "version": version, "first": first_generation, "cols": names}
    return meta, tensors


class Journal:
    """Durable record of a buffer's commits in ``directory`` (a new file per opening and per prune,
    never rewritten), its only writer while open (:class:`~conduit.errors.JournalLockedError` otherwise).

    Example:
        >>> journal = Journal("/data/run1/journal")
        >>> buffer.observer = journal          # what Conduit(journal=...) does
        >>> ...                                # writes and priority updates are journaled
        >>> journal.close()                    # final flush
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        flush_interval_s: float = 0.25,
        metrics: Metrics | None = None,
        consumes: bool = False,
        lock: WriterLock | None = None,
    ) -> None:
        """``metrics`` (optional) gets gauge ``journal/lag_s`` (commit to durable, the durability point)
        and bytes ``host->journal`` at each flush. ``consumes``: the buffer is consume-once, so
        :meth:`delivered` journals how far deliveries reached (ignored otherwise). ``lock``: the
        directory's writer lock, already taken (by :func:`open_journal`); taken here otherwise, and
        released by :meth:`close`."""
        self.metrics = metrics
        self.consumes = consumes
        self.directory = atomic.local_dir(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_interval_s = flush_interval_s
        self._reach: dict[Path, int] = {}  # closed file -> insert count a checkpoint needs to cover it
        self._writer_lock = lock if lock is not None else WriterLock.acquire(self.directory)
        try:
            self.path, self._file = self._next_file()
        except BaseException:
            self._writer_lock.release()
            raise
        self._file_reach = 0
        self._closed = False
        self._prune_lock = threading.Lock()  # one prune at a time
        self._pending: list[tuple[float, dict[str, Any], list[torch.Tensor]]] = []
        self._lock = threading.Lock()
        self._io = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.records = 0
        self.bytes = 0
        self.max_lag_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="conduit-journal", daemon=True)
        self._thread.start()

    # -- called by the buffer under its lock (check, then enqueue only) ----------------------------

    def check(self) -> None:
        """Raise :class:`JournalError` if the journal cannot take another record (called before a commit)."""
        if self.error is not None:
            raise JournalError(
                f"the journal at {self.path} failed ({type(self.error).__name__}: {self.error}); "
                "nothing more is committed: free the space or raise the limit, then reopen"
            )
        if self._closed:
            raise JournalError(f"the journal at {self.path} is closed")

    def committed(self, batch: ColumnBatch, slots: torch.Tensor, version: int, first_generation: int) -> None:
        """Queue the record of a committed write of ``batch`` into ``slots`` (never raises)."""
        self._enqueue(*_items_record(batch, version, first_generation))

    def priorities_updated(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor, inserted: int
    ) -> None:
        """Queue the record of a priority update made after ``inserted`` items were committed."""
        self._enqueue({"kind": "priorities", "after": inserted}, [slots, generations, priorities])

    def delivered(self, generations: torch.Tensor, inserted: int) -> None:
        """Queue how far a delivery of a consume-once buffer reached (its items' ``generations``; read
        ``inserted`` after the delivery was handed out): replay writes back only the items after it.
        One reduction, no host synchronisation; a no-op unless ``consumes``."""
        if self.consumes and generations.numel():
            self._enqueue({"kind": "delivered", "after": inserted}, [generations.max().reshape(1)])

    def _enqueue(self, meta: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        if self.error is not None:
            return  # never durable; the next check() refuses the next write
        with self._lock:
            self._pending.append((time.monotonic(), meta, tensors))

    # -- background flushing ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except JournalError:
                return  # kept in self.error, raised by the next check()

    def _next_file(self) -> tuple[Path, BinaryIO]:
        """Create the journal's next file (numbered after every file in the directory)."""
        number = max((n for n, _ in journal_files(self.directory)), default=0) + 1
        path = atomic.inside(self.directory, f"{PREFIX}{number:06d}{SUFFIX}")
        file = open(path, "xb")  # noqa: SIM115 - closed by close() or _switch_locked()
        atomic.fsync_dir(self.directory)
        return path, file

    def _switch_locked(self) -> None:
        """Start the next file: open it, swap it in, then close the current one (``self._io`` held).
        Never a moment without an open file, so a commit racing this is never refused."""
        path, file = self._next_file()
        old_path, old_file, old_reach = self.path, self._file, self._file_reach
        self.path, self._file, self._file_reach = path, file, 0
        old_file.close()
        self._reach[old_path] = old_reach

    def flush(self) -> None:
        """Write and fsync every queued record now; :class:`JournalError` if that fails (for good)."""
        with self._io:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self.check()
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            for _, meta, tensors in pending:
                self._file_reach = max(self._file_reach, _reach(meta))
                for part in frame(meta, tensors):
                    self._file.write(part)
                    self.bytes += len(part) if isinstance(part, bytes) else part.nbytes
            self._file.flush()
            os.fsync(self._file.fileno())
        except BaseException as e:  # noqa: BLE001 - a journal that failed stays failed
            self.error = e
            log.error("journal %s failed: %s; later writes are refused", self.path, e)
            raise JournalError(f"the journal at {self.path} failed ({type(e).__name__}: {e})") from e
        lag = time.monotonic() - pending[0][0]
        self.records += len(pending)
        self.max_lag_s = max(self.max_lag_s, lag)
        if self.metrics is not None:
            self.metrics.set_gauge("journal/lag_s", lag)
            self.metrics.add_bytes("host->journal", sum(_nbytes(t) for _, _, ts in pending for t in ts))

    def _rotate_locked(self) -> None:
        """Flush into the current file, then switch to the next one (``self._io`` held)."""
        self._flush_locked()
        self._switch_locked()

    def prune(self, covered: int, checkpoint_root: str | os.PathLike[str]) -> list[Path]:
        """Remove the journal files whose every record is among the first ``covered`` items, which the
        (durable) checkpoints kept under ``checkpoint_root`` hold; returns the files removed.

        Call only after the checkpoint is durable (``Conduit.save`` does). A new file is started, so
        what is journaled until the next save is pruned by that save; commits may go on meanwhile.
        """
        root = atomic.local_dir(checkpoint_root)
        with self._prune_lock:
            return self._prune(covered, root)

    def _prune(self, covered: int, root: Path) -> list[Path]:
        with self._io:
            self._rotate_locked()
        removable = []
        for _, path in journal_files(self.directory):
            if path == self.path:
                break
            if path not in self._reach:  # written by an earlier opening: read once
                self._reach[path] = _scan_reach(path)
            if self._reach[path] > covered:
                break
            removable.append(path)
        if not removable:
            return []
        marker = atomic.inside(self.directory, PRUNED)
        atomic.remove_stale(marker)
        tmp = atomic.temp_sibling(marker)
        atomic.write_file(tmp, frame({"inserted": covered, "checkpoint": str(root)}, []))
        os.replace(tmp, marker)
        atomic.fsync_dir(self.directory)  # the marker is durable before any record goes
        for path in removable:  # oldest first: a crash leaves a contiguous tail
            path.unlink()
            del self._reach[path]
        atomic.fsync_dir(self.directory)
        log.info(
            "journal %s: pruned %d file(s) held by the checkpoints under %s",
            self.directory,
            len(removable),
            root,
        )
        return removable

    def close(self) -> None:
        """Stop the flusher after a final flush; :class:`JournalError` if the journal had failed (what
        was committed since its last good flush is not durable)."""
        if self._closed:
            return
        self._stop.set()
        self._thread.join()
        try:
            with self._io:
                if self.error is None:
                    self._flush_locked()
        finally:
            self._closed = True
            self._file.close()
            self._writer_lock.release()
        if self.error is not None:
            raise JournalError(f"the journal at {self.path} had failed: {self.error}")


def open_journal(buffer: ExperienceBuffer, config: JournalConfig) -> Journal:
    """Replay what the journal at ``config.path`` already holds into ``buffer``, then journal its commits.

    If records the buffer lacks were pruned after a checkpoint, that checkpoint is loaded first.
    """
    directory = atomic.local_dir(config.path)
    directory.mkdir(parents=True, exist_ok=True)
    lock = WriterLock.acquire(directory)  # before the replay: a second writer changes nothing
    try:
        pruned = pruned_marker(directory)
        if pruned is not None and buffer.inserted < int(pruned["inserted"]):
            path = load_checkpoint(buffer, pruned["checkpoint"])
            log.info("journal %s was pruned after a checkpoint: loaded %s first", config.path, path)
        report = replay(config.path, buffer)
        if report.items or report.priority_updates:
            log.info(
                "recovered %d item(s), %d priority update(s) from %s",
                report.items,
                report.priority_updates,
                config.path,
            )
        journal = Journal(
            config.path, config.flush_interval_s, buffer.metrics, buffer.sampler.consumes, lock=lock
        )
    except BaseException:
        lock.release()
        raise
    buffer.observer = journal
    return journal


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class ReplayReport:
    """What :func:`replay` restored and what it could not.

    ``skipped_records``: records the buffer already held (a checkpoint) or that a FIFO had consumed.
    ``damaged``: every byte range skipped (torn, corrupt or not fitting the buffer). ``lost_items``:
    ranges of item numbers (as journaled) no intact record holds, renumbered past; the items after
    them keep their order. ``dropped_undelivered``: FIFO items drawn but not delivered before a crash
    that no longer fit the buffer. ``compacted``: the file the journal was rewritten into (items lost).
    """

    items: int
    priority_updates: int
    skipped_records: int
    damaged: tuple[Damage, ...] = ()
    lost_items: tuple[tuple[int, int], ...] = ()
    dropped_undelivered: int = 0
    compacted: str | None = None

    @property
    def lost(self) -> int:
        """How many items were lost (the sum of ``lost_items``)."""
        return sum(hi - lo + 1 for lo, hi in self.lost_items)


def journal_files(directory: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of the journal files in ``directory``, oldest first.

    Raises :class:`CheckpointError` for a journal file that is a symbolic link (it may lead outside
    ``directory``: the journal never reads, writes or removes a file elsewhere).
    """
    out = []
    for p in directory.iterdir() if directory.is_dir() else []:
        middle = p.name[len(PREFIX) : -len(SUFFIX)]
        if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX) and middle.isdigit():
            if p.is_symlink():
                raise CheckpointError(f"refusing journal file {p}: a symbolic link (to {os.readlink(p)})")
            out.append((int(middle), p))
    return sorted(out)


def pruned_marker(directory: Path) -> dict[str, Any] | None:
    """What :meth:`Journal.prune` recorded in ``directory`` (``None``: never pruned)."""
    path = atomic.inside(directory, PRUNED)
    if not path.exists():
        return None
    if path.is_symlink():
        raise CheckpointError(f"refusing {path}: a symbolic link (to {os.readlink(path)})")
    meta, _, _ = parse_record(bytearray(path.read_bytes()), 0)
    if (
        not isinstance(meta, dict)
        or _count(meta, "inserted") is None
        or not isinstance(meta.get("checkpoint"), str)
    ):
        raise CheckpointError(f"{path}: not a journal prune marker: {str(meta)[:200]}")
    return meta


def _reach(meta: dict[str, Any]) -> int:
    """The insert count a checkpoint must hold for this record to be skipped by :func:`replay`."""
    if meta.get("kind") == "items":
        first, n = _count(meta, "first"), _count(meta, "n")
        return 0 if first is None or n is None else first + n - 1
    after = _count(meta, "after")
    return 0 if after is None else after + 1


def _scan_reach(path: Path) -> int:
    """:func:`_reach` of a journal file written by an earlier opening (its intact records)."""
    reach = 0
    for entry in scan(bytearray(path.read_bytes()), path.name):
        if not isinstance(entry, Damage):
            reach = max(reach, _reach(entry[2]))
    return reach


# -- replay --------------------------------------------------------------------------------------


@dataclass
class _Record:
    """An intact, well-formed record found by the first pass (its tensors are read again to apply it)."""

    file: int  # index into the replayed files
    offset: int
    end: int
    kind: str
    meta: dict[str, Any]
    value: int = 0  # a delivered record's reach (item number)


@dataclass
class _Plan:
    """What the second pass does, in order, and what the report says."""

    actions: list[tuple[Any, ...]] = field(default_factory=list)
    damaged: list[Damage] = field(default_factory=list)
    lost: list[tuple[int, int]] = field(default_factory=list)  # item numbers as journaled
    covered: int = 0
    dropped: int = 0
    head: int = 0  # a FIFO's final head (items consumed)
    inserted: int = 0


def _check_record(
    buffer: ExperienceBuffer, meta: dict[str, Any], tensors: list[torch.Tensor]
) -> tuple[str, int]:
    """``(kind, value)`` of a well-formed record for ``buffer``; raises ``CheckpointError`` naming why not."""
    kind = meta.get("kind")
    if kind == "items":
        first, n, version = _count(meta, "first", 1), _count(meta, "n", 1), meta.get("version")
        if (
            first is None
            or n is None
            or isinstance(version, bool)
            or not isinstance(version, int)
            or abs(version) >= _MAX
        ):
            raise CheckpointError(
                f"items record with first={meta.get('first')!r} n={meta.get('n')!r} version={version!r}"
            )
        batch = _batch(meta, tensors, clone=False)
        if batch.size != n:
            raise CheckpointError(f"items record of n={n} holds {batch.size} items")
        buffer.check_write(batch)  # schema, dtypes, shapes, ragged offsets, NaN/inf: a ConduitError
        return kind, 0
    if kind == "priorities":
        ok = _count(meta, "after") is not None and len(tensors) == 3
        if ok:
            slots, gens, pri = tensors
            ok = slots.dim() == 1 and slots.shape == gens.shape == pri.shape
            ok = ok and slots.dtype == gens.dtype == torch.int64 and pri.is_floating_point()
        if not ok:
            raise CheckpointError("malformed priorities record")
        return kind, 0
    if kind == "delivered":
        if (
            _count(meta, "after") is None
            or len(tensors) != 1
            or tensors[0].dtype != torch.int64
            or tensors[0].numel() != 1
        ):
            raise CheckpointError("malformed delivered record")
        value = int(tensors[0].reshape(()))
        if not 0 <= value < _MAX:
            raise CheckpointError(f"delivered record reaching item {value}")
        return kind, value
    if kind == "compacted":
        supersedes = _count(meta, "supersedes")
        if supersedes is None:
            raise CheckpointError("malformed compaction header")
        return kind, supersedes
    raise CheckpointError(f"unknown record kind {str(kind)[:40]!r}")


def _batch(meta: dict[str, Any], tensors: list[torch.Tensor], clone: bool) -> ColumnBatch:
    cols = meta.get("cols")
    if not isinstance(cols, list) or not all(
        isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and c[1] in ("fixed", "ragged")
        for c in cols
    ):
        raise CheckpointError(f"items record with columns {str(cols)[:80]}")
    if len(tensors) != sum(2 if form == "ragged" else 1 for _, form in cols):
        raise CheckpointError(f"items record with {len(tensors)} tensors for columns {str(cols)[:80]}")
    it = iter(t.clone() if clone else t for t in tensors)
    columns: dict[str, Any] = {}
    for name, form in cols:
        columns[name] = Ragged(next(it), next(it)) if form == "ragged" else next(it)
    return ColumnBatch(columns, meta["n"])


def _read_pass(buffer: ExperienceBuffer, files: list[tuple[int, Path]]) -> tuple[list[_Record | Damage], int]:
    """Every record of ``files`` checked against ``buffer`` (or a :class:`Damage`), and the number of
    the newest file a compaction superseded (0: none)."""
    entries: list[_Record | Damage] = []
    superseded = 0
    for i, (number, path) in enumerate(files):
        for entry in scan(bytearray(path.read_bytes()), path.name):
            if isinstance(entry, Damage):
                entries.append(entry)
                continue
            offset, end, meta, tensors = entry
            try:
                kind, value = _check_record(buffer, meta, tensors)
            except (ConduitError, *_BAD_RECORD, RuntimeError, StopIteration) as e:
                entries.append(
                    Damage(path.name, offset, end, f"record does not fit the buffer: {str(e)[:160]}")
                )
                continue
            if kind == "compacted" and offset == 0 and value < number:
                superseded = max(superseded, value)
            entries.append(_Record(i, offset, end, kind, meta, value))
    if superseded:  # a complete compaction replaced these files (a crash before they were removed)
        names = {files[i][1].name for i in range(len(files)) if files[i][0] <= superseded}
        entries = [
            e for e in entries
            if (files[e.file][0] if isinstance(e, _Record) else _number(e.file)) > superseded
        ]  # fmt: skip
        log.info("journal: %s superseded by a compaction; not replayed", ", ".join(sorted(names)))
    return entries, superseded


def _number(name: str) -> int:
    return int(name[len(PREFIX) : -len(SUFFIX)])


def _plan(buffer: ExperienceBuffer, entries: list[_Record | Damage], files: list[tuple[int, Path]]) -> _Plan:
    """Decide, from the records alone, what replay writes back and what it renumbers or skips.

    Items keep their journaled numbers unless an earlier damaged stretch lost some: the items after
    are renumbered to follow on (and the journal is compacted). A FIFO skips every item up to the
    furthest delivery journaled (``ustar``): consumed items are never needed again.
    """
    p = _Plan()
    start = ins = buffer.inserted
    consumes = bool(buffer.sampler.consumes)
    head = int(buffer.sampler.state_dict()["head"]) if consumes else 0  # type: ignore[call-overload]
    cap = buffer.capacity
    last_v = buffer.last_version
    records = [e for e in entries if isinstance(e, _Record)]
    newest = max((_reach(r.meta) for r in records if r.kind == "items"), default=0)
    ustar = head
    if consumes:
        ustar = max(ustar, min(newest, max((r.value for r in records if r.kind == "delivered"), default=0)))
    shift = 0  # journaled number - buffer number of the items after the lost ones
    damage = False  # damage seen since the last items record

    def name(r: _Record) -> str:
        return files[r.file][1].name

    def jump(to: int, version: int) -> None:
        nonlocal ins, head, last_v
        ins = head = to
        last_v = version if last_v is None else max(last_v, version)
        if p.actions and p.actions[-1][0] == "fifo" and p.actions[-1][3] is not None:
            p.actions.pop()  # consecutive consumed records: one move
        p.actions.append(("fifo", ins, head, last_v))

    for e in entries:
        if isinstance(e, Damage):
            p.damaged.append(e)
            damage = True
            continue
        if e.kind == "priorities":
            after = int(e.meta["after"])
            after -= sum(max(0, min(hi, after) - lo + 1) for lo, hi in p.lost)
            if after < start:
                p.actions.append(("copy", e))
                p.covered += 1
            else:
                p.actions.append(("priorities", e, ins + shift))
            continue
        if e.kind == "delivered":
            if int(e.meta["after"]) < start:
                p.actions.append(("copy", e))  # kept for a checkpoint a load may fall back to
            continue
        if e.kind != "items":
            continue  # a compaction header
        first, n, version = int(e.meta["first"]), int(e.meta["n"]), int(e.meta["version"])
        last = first + n - 1
        new_first = first - shift
        if new_first + n - 1 <= ins:  # the buffer holds it already
            p.actions.append(("copy", e))
            p.covered += 1
            damage = False
            continue
        if consumes and last <= ustar:  # delivered before: consumed, never needed again
            jump(new_first + n - 1, version)
            p.covered += 1
            damage = False
            continue
        if last_v is not None and version < last_v:
            p.damaged.append(Damage(name(e), e.offset, e.end, f"policy version {version} after {last_v}"))
            damage = True
            continue
        if new_first > ins + 1:
            lo = ins + shift + 1  # the first missing item, as journaled
            if consumes and ustar >= lo:  # the consumed part of the gap is no loss
                jump(min(ustar, first - 1) - shift, version)
                lo = ins + shift + 1
            if lo <= first - 1:
                if not damage:
                    raise _NotReplayable(
                        f"{name(e)} byte {e.offset}: the journal does not continue the buffer (record starts at "
                        f"item {first}, the buffer holds {ins + shift}); load the checkpoint the journal was "
                        "started from"
                    )
                p.lost.append((lo, first - 1))
                shift += first - lo
            new_first = first - shift
        elif new_first <= ins:
            raise _NotReplayable(
                f"{name(e)} byte {e.offset}: items {first}..{last} overlap the {ins + shift} the buffer holds"
            )
        if consumes and ins - head + n > cap:  # drawn, never delivered, and no room for them now
            over = ins - head + n - cap
            head += over
            p.dropped += over
            p.actions.append(("fifo", ins, head, None))
        p.actions.append(("items", e, new_first))
        ins += n
        last_v = version
        damage = False
        if consumes and ustar >= first:
            head = max(head, min(ustar - shift, ins))
            p.actions.append(("fifo", ins, head, None))
    p.head, p.inserted = head, ins
    return p


def replay(directory: str | os.PathLike[str], target: Runtime | ExperienceBuffer) -> ReplayReport:
    """Write the journal's records that follow what ``target``'s buffer holds (its insert count) back into it.

    Records already covered (e.g. by the checkpoint just loaded) are skipped, and so are items a FIFO
    buffer had delivered. A damaged stretch of a file is skipped with a warning naming the file and
    the byte range, and reading goes on with the next intact record; items no intact record holds are
    reported lost, the later ones renumbered to follow on, and the journal is compacted (rewritten
    into one new file; the damaged files renamed ``*.damaged``) so the next recovery is the same.
    Raises :class:`CheckpointError` if an intact journal does not continue the buffer (a gap no
    damage explains). Nothing is journaled again while replaying.
    """
    buffer = target if isinstance(target, ExperienceBuffer) else target.buffer
    base = atomic.local_dir(directory)
    live = buffer.observer if isinstance(buffer.observer, Journal) else None
    if live is not None and live.directory != base:
        live = None  # journaling elsewhere: untouched by this replay
    if live is not None:
        live.flush()  # its records are part of what is replayed
    files = journal_files(base)
    entries, superseded = _read_pass(buffer, files)
    plan = _plan(buffer, entries, files)
    for d in plan.damaged:
        log.warning("journal replay skipped %s", d)
    if plan.lost:
        log.warning(
            "journal replay: %d item(s) lost in the damaged records (items %s as journaled); the %s after them "
            "are renumbered to follow on",
            sum(hi - lo + 1 for lo, hi in plan.lost),
            ", ".join(f"{lo}..{hi}" for lo, hi in plan.lost),
            "items",
        )
    if plan.dropped:
        log.warning(
            "journal replay: %d FIFO item(s) drawn but not delivered before the crash do not fit the buffer "
            "(capacity %d) and are dropped",
            plan.dropped,
            buffer.capacity,
        )
    compaction = _Compaction(base, files[-1][0]) if plan.lost and files else None
    observer, buffer.observer = buffer.observer, compaction
    try:
        items, updates = _apply(buffer, plan, files, compaction)
        if compaction is not None:
            if buffer.sampler.consumes:
                compaction.delivered_upto(plan.head, plan.inserted)
            if live is not None:
                with live._io:  # the live file is superseded too: the journal goes on after the compaction
                    compaction.finish()
                    live._switch_locked()
            else:
                compaction.finish()
            _remove_superseded(base, files, {d.file for d in plan.damaged}, live)
        elif superseded:
            _remove_superseded(base, [f for f in files if f[0] <= superseded], set(), live)
    except BaseException:
        if compaction is not None:
            compaction.abort()
        raise
    finally:
        buffer.observer = observer
    return ReplayReport(
        items,
        updates,
        plan.covered,
        tuple(plan.damaged),
        tuple(plan.lost),
        plan.dropped,
        None if compaction is None else compaction.final.name,
    )


def _apply(
    buffer: ExperienceBuffer, plan: _Plan, files: list[tuple[int, Path]], compaction: _Compaction | None
) -> tuple[int, int]:
    """Run ``plan``'s actions on ``buffer``; returns ``(items, priority updates)`` written back."""
    items = updates = 0
    current, data = -1, bytearray()
    for action in plan.actions:
        if action[0] == "fifo":
            _, inserted, head, version = action
            buffer.restore_consumed(inserted, head, version)
            continue
        r: _Record = action[1]
        if r.file != current:
            current, data = r.file, bytearray(files[r.file][1].read_bytes())
        if action[0] == "copy":
            if compaction is not None:
                compaction.raw(data[r.offset : r.end])
            continue
        meta, tensors, _ = parse_record(data, r.offset)
        if action[0] == "items":
            if buffer.inserted + 1 != action[2]:
                raise CheckpointError(
                    f"journal replay out of step at {files[r.file][1].name} byte {r.offset}"
                )
            buffer.extend(_batch(meta, tensors, clone=True), version=int(meta["version"]))
            items += int(meta["n"])
        else:  # priorities
            slots, gens = _renumber(tensors[1], plan.lost, action[2], buffer.capacity)
            try:
                updates += buffer.update_priorities(slots, gens, tensors[2].clone())
            except ConduitError as e:
                log.warning(
                    "journal replay skipped the priority update at %s byte %d: %s",
                    files[r.file][1].name,
                    r.offset,
                    e,
                )
    return items, updates


def _renumber(
    generations: torch.Tensor, lost: list[tuple[int, int]], reached: int, capacity: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and generations of journaled ``generations`` in the replayed buffer (lost, not yet written
    by item ``reached`` or not positive: generation -1, which matches no slot)."""
    gens = generations.clone()
    bad = (gens <= 0) | (gens > reached)
    for lo, hi in reversed(lost):
        bad |= (gens >= lo) & (gens <= hi)
        gens = torch.where(gens > hi, gens - (hi - lo + 1), gens)
    gens = torch.where(bad, torch.full_like(gens, -1), gens)
    slots = torch.where(bad, torch.zeros_like(gens), (gens - 1) % capacity)
    return slots, gens


class _Compaction:
    """The journal rewritten into one file, ``journal-<superseded + 1>``, holding what the buffer holds
    (written beside it, then renamed in: it is complete or absent). Its first record names the newest
    file it supersedes; the buffer tells it of each write as a :class:`Journal` would."""

    def __init__(self, directory: Path, superseded: int) -> None:
        self.directory = directory
        self.final = atomic.inside(directory, f"{PREFIX}{superseded + 1:06d}{SUFFIX}")
        atomic.remove_stale(self.final)  # an earlier compaction's leftover, if one was interrupted
        self.tmp = atomic.temp_sibling(self.final)
        self._file = open(self.tmp, "xb")  # noqa: SIM115 - closed by finish() or abort()
        write_record(self._file, {"kind": "compacted", "supersedes": superseded}, [])

    def check(self) -> None:
        pass

    def committed(self, batch: ColumnBatch, slots: torch.Tensor, version: int, first_generation: int) -> None:
        write_record(self._file, *_items_record(batch, version, first_generation))

    def priorities_updated(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor, inserted: int
    ) -> None:
        write_record(self._file, {"kind": "priorities", "after": inserted}, [slots, generations, priorities])

    def raw(self, record: bytearray) -> None:
        self._file.write(record)

    def delivered_upto(self, head: int, inserted: int) -> None:
        write_record(self._file, {"kind": "delivered", "after": inserted}, [torch.tensor([head])])

    def finish(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.final)
        atomic.fsync_dir(self.directory)
        log.warning("journal compacted into %s", self.final)

    def abort(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)


def _remove_superseded(
    directory: Path, files: list[tuple[int, Path]], damaged: set[str], live: Journal | None
) -> None:
    """Remove the files a complete compaction replaced (oldest first); damaged ones are renamed
    ``*.damaged`` for inspection."""
    for _, path in files:
        if path.name in damaged:
            os.replace(path, path.with_name(path.name + DAMAGED))
        else:
            path.unlink(missing_ok=True)
        if live is not None:
            live._reach.pop(path, None)
    atomic.fsync_dir(directory)
