"""Online column migration: move a buffer's columns between tiers while it keeps serving.

For each column: note the insert count ``g0`` (under the lock), copy the whole column to the new tier
without the lock, then take the lock, copy again the rows written since ``g0`` (their slot's
generation is above ``g0``) and switch the column over. Writes and samples run during the bulk copy;
the pause is the re-copy of those rows plus the switch, reported per column.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from conduit.buffer.base import Storage, Writer
from conduit.buffer.tiers import check_tier_available
from conduit.errors import ConfigError
from conduit.metrics import Metrics


@dataclass(frozen=True)
class ColumnMove:
    """One column's move: tiers, bytes, rows re-copied under the lock, and seconds."""

    column: str
    src: str
    dst: str
    nbytes: int
    recopied_rows: int
    copy_s: float
    pause_s: float


@dataclass(frozen=True)
class MigrationReport:
    """What a migration did; ``max_pause_s`` is the longest time the buffer's lock was held."""

    moves: tuple[ColumnMove, ...] = field(default_factory=tuple)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.moves)

    @property
    def max_pause_s(self) -> float:
        return max((m.pause_s for m in self.moves), default=0.0)

    @property
    def seconds(self) -> float:
        return sum(m.copy_s + m.pause_s for m in self.moves)


def migrate_columns(
    storage: Storage,
    writer: Writer,
    lock: threading.Condition,
    metrics: Metrics,
    moves: Mapping[str, str],
    max_lens: Mapping[str, int] | None = None,
) -> MigrationReport:
    """Move ``storage``'s columns to the tiers in ``moves`` and widen the ragged columns in
    ``max_lens``, in the order given (see the module docstring). ``lock`` is the buffer's lock (held
    for the re-copy and switch); the caller holds the buffer's one-migration-at-a-time lock."""
    tiers: dict[str, str] = getattr(storage, "tiers", {})
    max_lens = dict(max_lens or {})
    unknown = sorted((set(moves) | set(max_lens)) - set(tiers))
    if unknown:
        raise ConfigError(f"migrate: unknown column(s) {unknown}; the buffer stores {sorted(tiers)}")
    for tier in set(moves.values()):
        check_tier_available(tier)
    done: list[ColumnMove] = []
    for name in dict.fromkeys([*moves, *max_lens]):
        src, dst = tiers[name], moves.get(name, tiers[name])
        max_len = max_lens.get(name)
        if src == dst and max_len in (None, storage.schema[name].max_len):
            continue
        with lock:
            g0 = writer.inserted
        t0 = time.perf_counter()
        new = storage.copy_column(name, dst, max_len)  # type: ignore[attr-defined]
        t1 = time.perf_counter()
        with lock:
            t2 = time.perf_counter()
            dirty = torch.nonzero(storage.generation > g0).flatten()
            storage.install_column(name, dst, new, dirty)  # type: ignore[attr-defined]
            pause = time.perf_counter() - t2
        nbytes = sum(t.nbytes for t in new.values())
        done.append(ColumnMove(name, src, dst, nbytes, int(dirty.numel()), t1 - t0, pause))
        metrics.incr("migrated_bytes", nbytes)
        metrics.add_bytes(f"{src}->{dst}", nbytes)
    report = MigrationReport(tuple(done))
    if done:
        metrics.incr("migrations", 1)
        metrics.add_time("migration_copy", sum(m.copy_s for m in done))
        metrics.add_time("migration_pause", sum(m.pause_s for m in done))
        metrics.set_gauge("migration_max_pause_s", report.max_pause_s)
    return report
