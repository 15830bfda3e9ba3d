"""An append-only journal of what lands in a buffer: committed writes and priority updates.

The buffer tells the journal of each commit under its lock (:meth:`Journal.committed`, one call per
write, references only); a background thread writes the queued records in Conduit's record format
every ``flush_interval_s`` and fsyncs them. A crash loses at most what was committed since the last
fsync: :attr:`Journal.max_lag_s` is the longest measured time from commit to durable.

:func:`replay` puts the journal back into a buffer, in commit order, after what a checkpoint holds;
a torn or corrupt record ends its file with a warning naming the file and the offset (the next
opening's file, which continues from there, is replayed too).

Pruning: after a checkpoint is durable, :meth:`Journal.prune` starts a new file and removes the
older files every record of which the checkpoints kept under that root already hold (oldest first,
so what remains is always a contiguous tail). It first writes ``pruned.cdr`` naming the checkpoint
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from conduit.batch import ColumnBatch, Ragged
from conduit.buffer.buffer import ExperienceBuffer
from conduit.config import JournalConfig
from conduit.errors import CheckpointError, ClosedError
from conduit.metrics import Metrics
from conduit.persist import atomic
from conduit.persist.checkpoint import load_checkpoint
from conduit.persist.format import frame, parse_record, records

if TYPE_CHECKING:
    from conduit.api import Conduit

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "journal-", ".cdr"
PRUNED = "pruned.cdr"  # where the records pruned from the journal are: {"inserted", "checkpoint"}


class _NotReplayable(CheckpointError):
    """An intact journal that cannot go into this buffer (a gap, no room): raised, never skipped."""


class _Discontinued(CheckpointError):
    """After a torn record, a later file does not continue the buffer: replay stops there."""


class Journal:
    """Durable record of a buffer's commits in ``directory`` (a new file per opening and per prune,
    never rewritten).

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
    ) -> None:
        """``metrics`` (optional) gets gauge ``journal/lag_s`` (commit to durable, the durability point)
        and bytes ``host->journal`` at each flush."""
        self.metrics = metrics
        self.directory = atomic.local_dir(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.flush_interval_s = flush_interval_s
        self._reach: dict[Path, int] = {}  # closed file -> insert count a checkpoint needs to cover it
        self._open_next()
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

    # -- called by the buffer under its lock (enqueue only) -----------------------------------------

    def committed(self, batch: ColumnBatch, slots: torch.Tensor, version: int, first_generation: int) -> None:
        """Queue the record of a committed write of ``batch`` into ``slots``."""
        names, tensors = [], []
        for name, col in batch.columns.items():
            if isinstance(col, Ragged):
                names.append([name, "ragged"])
                tensors += [col.values, col.offsets]
            else:
                names.append([name, "fixed"])
                tensors.append(col)
        meta = {
            "kind": "items",
            "n": batch.size,
            "version": version,
            "first": first_generation,
            "cols": names,
        }
        self._enqueue(meta, tensors)

    def priorities_updated(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor, inserted: int
    ) -> None:
        """Queue the record of a priority update made after ``inserted`` items were committed."""
        self._enqueue({"kind": "priorities", "after": inserted}, [slots, generations, priorities])

    def _enqueue(self, meta: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        if self.error is not None:
            raise ClosedError(f"the journal at {self.path} failed: {self.error}")
        with self._lock:
            self._pending.append((time.monotonic(), meta, tensors))

    # -- background flushing ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except BaseException as e:  # noqa: BLE001 - kept and raised to the next caller
                self.error = e
                log.error("journal %s failed: %s", self.path, e)
                return

    def _open_next(self) -> None:
        number = max((n for n, _ in journal_files(self.directory)), default=0) + 1
        self.path = atomic.inside(self.directory, f"{PREFIX}{number:06d}{SUFFIX}")
        self._file = open(self.path, "xb")  # noqa: SIM115 - closed by close() or prune()
        self._file_reach = 0
        atomic.fsync_dir(self.directory)

    def flush(self) -> None:
        """Write and fsync every queued record now."""
        with self._io:
            self._flush_locked()

    def _flush_locked(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        for _, meta, tensors in pending:
            self._file_reach = max(self._file_reach, _reach(meta))
            for part in frame(meta, tensors):
                self._file.write(part)
                self.bytes += len(part) if isinstance(part, bytes) else part.nbytes
        self._file.flush()
        os.fsync(self._file.fileno())
        lag = time.monotonic() - pending[0][0]
        self.records += len(pending)
        self.max_lag_s = max(self.max_lag_s, lag)
        if self.metrics is not None:
            self.metrics.set_gauge("journal/lag_s", lag)
            self.metrics.add_bytes("host->journal", sum(_nbytes(t) for _, _, ts in pending for t in ts))

    def prune(self, covered: int, checkpoint_root: str | os.PathLike[str]) -> list[Path]:
        """Remove the journal files whose every record is among the first ``covered`` items, which the
        (durable) checkpoints kept under ``checkpoint_root`` hold; returns the files removed.

        Call only after the checkpoint is durable (``Conduit.save`` does). The current file is closed
        and a new one started, so what is journaled until the next save is pruned by that save.
        """
        root = atomic.local_dir(checkpoint_root)
        with self._io:
            if self._file.closed or self.error is not None:
                raise ClosedError(f"the journal at {self.path} is closed or failed: {self.error}")
            self._flush_locked()
            self._file.close()
            self._reach[self.path] = self._file_reach
            self._open_next()
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
        """Stop the flusher after a final flush."""
        if self._file.closed:
            return
        self._stop.set()
        self._thread.join()
        if self.error is None:
            self.flush()
        self._file.close()


def open_journal(buffer: ExperienceBuffer, config: JournalConfig) -> Journal:
    """Replay what the journal at ``config.path`` already holds into ``buffer``, then journal its commits.

    If records the buffer lacks were pruned after a checkpoint, that checkpoint is loaded first.
    """
    pruned = pruned_marker(atomic.local_dir(config.path))
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
    journal = Journal(config.path, config.flush_interval_s, buffer.metrics)
    buffer.observer = journal
    return journal


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class ReplayReport:
    """What :func:`replay` restored, and where it stopped early (``None``: it read every record)."""

    items: int
    priority_updates: int
    skipped_records: int
    stopped_at: str | None


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
    if not isinstance(meta.get("inserted"), int) or not isinstance(meta.get("checkpoint"), str):
        raise CheckpointError(f"{path}: not a journal prune marker: {meta!r}")
    return meta


def _reach(meta: dict[str, Any]) -> int:
    """The insert count a checkpoint must hold for this record to be skipped by :func:`replay`."""
    if meta.get("kind") == "items":
        return int(meta["first"]) + int(meta["n"]) - 1
    return int(meta.get("after", 0)) + 1


def _scan_reach(path: Path) -> int:
    """:func:`_reach` of a journal file written by an earlier opening (its intact records)."""
    reach = 0
    try:
        for _, meta, _ in records(bytearray(path.read_bytes())):
            reach = max(reach, _reach(meta))
    except CheckpointError:
        pass  # a torn tail: those records were never durable, so never replayed
    return reach


def replay(directory: str | os.PathLike[str], target: Conduit | ExperienceBuffer) -> ReplayReport:
    """Write the journal's records that follow what ``target``'s buffer holds (its insert count) back into it.

    Records already covered (e.g. by the checkpoint just loaded) are skipped. Raises
    :class:`CheckpointError` if the journal does not continue the buffer (a gap). A torn or corrupt
    record (a crash mid-write) ends its file with a warning; the next file, which the next opening
    started from there, is replayed too, unless it does not continue: then replay stops, with a
    warning. Nothing is journaled again while replaying.
    """
    buffer = target if isinstance(target, ExperienceBuffer) else target.buffer
    base = atomic.local_dir(directory)
    observer, buffer.observer = buffer.observer, None
    items = updates = skipped = 0
    stopped: str | None = None
    start = buffer.inserted
    try:
        for _, path in journal_files(base):
            data = bytearray(path.read_bytes())
            try:
                for offset, meta, tensors in records(data):
                    where = f"{path.name} byte {offset}"
                    if (
                        stopped is not None
                        and meta.get("kind") == "items"
                        and int(meta["first"]) > buffer.inserted + 1
                    ):
                        raise _Discontinued(
                            f"{where}: starts at item {meta['first']}, after the lost records"
                        )
                    done = _apply(buffer, meta, tensors, start, where)
                    items += done if meta.get("kind") == "items" else 0
                    updates += done if meta.get("kind") == "priorities" else 0
                    skipped += 0 if done else 1
            except _NotReplayable:
                raise
            except _Discontinued as e:
                log.warning("journal replay stopped at %s (%s); later records are lost", path.name, e)
                break
            except CheckpointError as e:
                stopped = stopped or f"{path.name}: {e}"
                log.warning("journal replay stopped at %s (%s); the rest of that file is lost", path.name, e)
    finally:
        buffer.observer = observer
    return ReplayReport(items, updates, skipped, stopped)


def _apply(
    buffer: ExperienceBuffer, meta: dict[str, Any], tensors: list[torch.Tensor], start: int, where: str
) -> int:
    kind = meta.get("kind")
    if kind == "priorities":
        if int(meta["after"]) < start or len(tensors) != 3:
            return 0
        return buffer.update_priorities(*[t.clone() for t in tensors])
    if kind != "items":
        raise CheckpointError(f"{where}: unknown record kind {kind!r}")
    first, n = int(meta["first"]), int(meta["n"])
    if first + n - 1 <= buffer.inserted:
        return 0  # already in the buffer
    if first != buffer.inserted + 1:
        raise _NotReplayable(
            f"{where}: the journal does not continue the buffer (record starts at item {first}, the buffer "
            f"holds {buffer.inserted}); load the checkpoint the journal was started from"
        )
    columns: dict[str, Any] = {}
    it = iter(tensors)
    for name, form in meta["cols"]:
        columns[name] = Ragged(next(it).clone(), next(it).clone()) if form == "ragged" else next(it).clone()
    if buffer.sampler.insert_blocker(n) is not None:
        raise _NotReplayable(f"{where}: cannot replay {n} items: {buffer.sampler.insert_blocker(n)}")
    buffer.extend(ColumnBatch(columns, n), version=int(meta["version"]))
    return n
