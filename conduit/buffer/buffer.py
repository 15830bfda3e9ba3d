"""The experience buffer: storage on a tier + writer + sampler + rate limiter, thread-safe."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from conduit.batch import ColumnBatch, validate
from conduit.buffer import priority_kernels
from conduit.buffer.base import MAX_COUNT, Sampler, Storage, Writer
from conduit.buffer.migration import MigrationReport, migrate_columns
from conduit.buffer.rate_limiter import RateLimiter
from conduit.buffer.writers import RingWriter
from conduit.config import NONFINITE
from conduit.errors import (
    CapacityError,
    CheckpointError,
    ClosedError,
    ConfigError,
    InsufficientDataError,
    PriorityError,
    ShapeError,
    VersionError,
)
from conduit.metrics import Metrics
from conduit.schema import Schema

#: bytes of items one draw with replacement may gather beyond the buffer's capacity (see ``max_batch``)
MAX_BATCH_BYTES = 1 << 30
#: bytes a drawn item takes besides its stored row: its slot, generation, version and weight
SAMPLE_META_BYTES = 32


class Replanner(Protocol):
    """What keeps a buffer's placement planned (``conduit.placer.Placer``): growth goes through it."""

    def grow(self, column: str, max_len: int) -> MigrationReport: ...


@dataclass(frozen=True)
class Sample:
    """Items read from the buffer, with what is needed to update their priorities later."""

    batch: ColumnBatch
    slots: torch.Tensor
    generations: torch.Tensor
    versions: torch.Tensor
    weights: torch.Tensor | None


class ExperienceBuffer:
    """Storage + writer + sampler + rate limiter behind one lock: whole writes in, committed items out.

    Build one from a config (``build_buffer(BufferConfig(...), schema)``, or a preset such as
    ``build_buffer(BufferConfig.prioritized_replay(100_000), schema)``) or compose the parts yourself.

    Example:
        >>> schema = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
        >>> buf = build_buffer(BufferConfig(capacity=1000, sampler="prioritized"), schema)
        >>> buf.extend(ColumnBatch({"obs": torch.zeros(8, 4), "reward": torch.zeros(8)}))
        >>> s = buf.sample(4)
        >>> buf.update_priorities(s.slots, s.generations, torch.rand(4))
    """

    def __init__(
        self,
        storage: Storage,
        sampler: Sampler,
        *,
        writer: Writer | None = None,
        limiter: RateLimiter | None = None,
        metrics: Metrics | None = None,
        nonfinite: str = "reject",
    ) -> None:
        """``nonfinite``: ``"reject"`` or ``"count"`` NaN/inf in checked columns and priorities
        (see :class:`~conduit.config.BufferConfig`)."""
        if nonfinite not in NONFINITE:
            raise ConfigError(f"nonfinite must be one of {NONFINITE}, got {nonfinite!r}")
        self.nonfinite = nonfinite
        self.storage = storage
        self.sampler = sampler
        self.writer = writer or RingWriter(storage.capacity, storage.device)
        self.limiter = limiter or RateLimiter()
        if self.writer.capacity != storage.capacity or getattr(sampler, "capacity", storage.capacity) != (
            storage.capacity
        ):
            raise ConfigError(
                f"storage, writer and sampler disagree on capacity: {storage.capacity}, "
                f"{self.writer.capacity}, {getattr(sampler, 'capacity', None)}"
            )
        self.metrics = metrics or Metrics(trace=False)
        self.sampler.attach(storage, self.metrics)
        self.sampled = 0
        self.insert_waiting: str | None = None  # why a write is waiting right now (None: none is)
        self.last_version: int | None = None  # versions written never decrease (the FIFO relies on it)
        self._cond = threading.Condition(threading.RLock())
        self._waiters = 0  # threads in self._cond.wait: a sample wakes them only if there are any
        if self.sampler.has_priorities:
            priority_kernels.warm()
        self.moving = threading.Lock()  # one migration or column growth at a time
        self.observer: Any = None  # e.g. a conduit.persist Journal: told of each commit, under the lock
        self.placer: Replanner | None = None  # set by build_buffer for tier="auto": keeps placement planned
        # Whose writes the slots hold: within one lineage a generation names one write, so a checkpoint
        # segment of the same lineage with the same generations holds the same bytes (conduit.persist).
        self.lineage = new_lineage()
        self.parent: tuple[str, int] | None = None  # (lineage, insert count) of the state last loaded
        self._closed = False

    # -- properties ------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    @property
    def schema(self) -> Schema:
        return self.storage.schema

    @property
    def inserted(self) -> int:
        return self.writer.inserted

    @property
    def max_batch(self) -> int:
        """The most items one :meth:`sample` (a runtime's ``get``) may ask for.

        A consume-once sampler: the capacity (it never holds more). A sampler that draws with
        replacement: the capacity or as many items as :data:`MAX_BATCH_BYTES` (1 GiB) holds, whichever
        is more, an item counting its stored row (ragged columns at their maximum length) and
        :data:`SAMPLE_META_BYTES`. E.g. 4 float32 observations and an int64 id: 1 GiB / 56 B, about
        19 million items; 84x84x4 uint8 frames: the capacity, or 3,000-odd if that is fewer."""
        if self.sampler.consumes:
            return self.capacity
        return max(self.capacity, MAX_BATCH_BYTES // (self.schema.nbytes_per_item + SAMPLE_META_BYTES))

    def check_batch(self, n: int, what: str = "sample") -> None:
        """Raise unless ``n`` is a batch size this buffer serves: :class:`ConfigError` for anything but a
        positive int or more than :attr:`max_batch` with replacement, :class:`CapacityError` for more
        than a consume-once buffer holds. Checked before anything is drawn or allocated."""
        check_size(n, what)
        bound = self.max_batch
        if n <= bound:
            return
        if self.sampler.consumes:
            raise CapacityError(
                f"{what}({n}): a consume-once buffer of capacity {self.capacity} never holds {n} items; "
                f"ask for at most {self.capacity}"
            )
        raise ConfigError(
            f"{what}({n}): at most {bound} items per draw (max_batch: the capacity {self.capacity} or "
            f"{MAX_BATCH_BYTES} bytes of {self.schema.nbytes_per_item + SAMPLE_META_BYTES}-byte items, "
            "whichever is more); ask for fewer"
        )

    def __len__(self) -> int:
        """Items a sample can draw from now (FIFO: items not yet consumed)."""
        return self.sampler.available()

    # -- writing ---------------------------------------------------------------------------------

    def extend(self, batch: ColumnBatch, version: int = 0) -> torch.Tensor:
        """Validate and commit ``batch`` (tagged with policy ``version``); returns its slots.

        Raises a :class:`~conduit.errors.SchemaError` subclass on a schema mismatch (an empty batch:
        :class:`~conduit.errors.ShapeError`), :class:`~conduit.errors.NonFiniteError` for NaN/inf in a
        checked column (``nonfinite="reject"``), :class:`~conduit.errors.CapacityError` when the write
        cannot fit and :class:`~conduit.errors.VersionError` for a version older than the last write;
        the buffer is then unchanged.
        A ring over items that are never consumed overwrites the oldest and counts them
        (``count/overwritten``).
        """
        self._check_open()
        nonfinite = self.check_write(batch)
        n = batch.size
        with self._cond:
            self._check_version(version)
            self._wait(lambda: self._insert_blocker(n), "insert")
            self.last_version = version
            # a ring over items never consumed drops the oldest ones: counted, never silent
            overwritten = (
                0 if self.sampler.consumes else min(n, max(0, self.writer.inserted + n - self.capacity))
            )
            if self.observer is not None:  # a journal that cannot take the write refuses it before the commit
                self.observer.check()
            first_generation = self.writer.inserted + 1
            slots = self.writer.reserve(n)
            self.storage.write(slots, batch, version, first_generation)
            self.sampler.on_insert(slots, self.writer.inserted)
            if self.observer is not None:  # enqueues only: never raises after the commit
                self.observer.committed(batch, slots, version, first_generation)
            self._cond.notify_all()
        self.metrics.incr("inserted", n)
        if overwritten:
            self.metrics.incr("overwritten", overwritten)
        if nonfinite:
            self.metrics.incr("nonfinite_values", nonfinite)
        self.metrics.add_bytes(f"{batch.device.type}->{self.storage.tier}", batch.nbytes)
        return slots

    def check_write(self, batch: ColumnBatch) -> int:
        """Raise what :meth:`extend` would raise for ``batch`` before waiting (schema, size, groups,
        NaN/inf); returns the non-finite values counted (``nonfinite="count"``)."""
        nonfinite = validate(self.schema, batch, self.nonfinite)
        self.writer.check(batch.size)
        return nonfinite

    def _check_version(self, version: int) -> None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise VersionError(f"extend: version must be an int, got {version!r}")
        if self.last_version is not None and version < self.last_version:
            raise VersionError(
                f"extend: policy version went backwards ({self.last_version} -> {version}); versions never decrease"
            )

    def insert_refusal(self, n: int, in_flight: tuple[int, int] = (0, 0)) -> str | None:
        """Why a write of ``n`` items could not run now (None: it could), without waiting.

        ``in_flight`` is ``(items, insert count when they were taken)`` of a write under way: its items
        count too unless the insert count has moved past them — decided under the buffer's lock, so a
        commit landing during the check is never counted twice."""
        with self._cond:
            k, base = in_flight
            return self._insert_blocker(n + (k if k and self.writer.inserted == base else 0))

    def _insert_blocker(self, n: int) -> str | None:
        return self.sampler.insert_blocker(n) or self.limiter.insert_blocker(
            n, self.writer.inserted, self.sampled
        )

    # -- reading ---------------------------------------------------------------------------------

    def sample(
        self, n: int, version: int | None = None, out: ColumnBatch | None = None, hold: bool = False
    ) -> Sample:
        """Read ``n`` committed items (FIFO: the next ``n``, consumed exactly once); ``n`` is checked
        first (:meth:`check_batch`: at most :attr:`max_batch`).

        ``out`` (optional) is a batch from an earlier sample of the same size whose fixed columns are
        reused as the destination of the gather — for steady-state consumers that are done with it.

        ``hold=True`` (a runtime that delivers later): a consume-once sampler keeps the items' slots
        taken until :meth:`release` says they were delivered, so no write overwrites them meanwhile.

        ``version`` is the consumer's policy version; with ``rate_limit.max_staleness`` set, FIFO
        items written more than ``max_staleness`` versions earlier are evicted and counted
        (``count/stale_evicted``) in block mode, or raise :class:`StaleDataError` in error mode.
        """
        self._check_open()
        self.check_batch(n)
        if out is not None:
            self._check_out(out, n)
        with self._cond:
            self.sampler.before_sample(n, version)
            if self._sample_blocker(n) is not None:
                self._wait(lambda: self._sample_blocker(n, version), "sample")
            slots, weights = self.sampler.sample(n)
            if hold:
                self.sampler.hold(n)
            batch = self.storage.read(slots, out)
            generations, versions = self.storage.read_meta(slots)
            self.sampled += n
            if self._waiters:
                self._cond.notify_all()  # a writer may wait for room or for the ratio
        self.metrics.incr("sampled", n)
        return Sample(batch, slots, generations, versions, weights)

    def release(self, n: int) -> None:
        """The oldest ``n`` items sampled with ``hold=True`` were delivered: their slots are free."""
        with self._cond:
            self.sampler.release(n)
            if self._waiters:
                self._cond.notify_all()  # a writer may wait for room

    def _check_out(self, out: ColumnBatch, n: int) -> None:
        for col in self.schema:
            if col.ragged:
                continue
            dst = out.columns.get(col.name)
            want = (n, *col.shape)
            if not isinstance(dst, torch.Tensor) or tuple(dst.shape) != want or dst.dtype != col.dtype:
                got = None if not isinstance(dst, torch.Tensor) else (tuple(dst.shape), dst.dtype)
                raise ShapeError(
                    f"sample(out=...): column {col.name!r} must be {want} {col.dtype}, got {got}"
                )
            # a column on another device than ``dst`` (moved by a re-plan) is gathered anew

    def _sample_blocker(self, n: int, version: int | None = None) -> str | None:
        if version is not None:
            self.sampler.before_sample(n, version)  # items may have gone stale while waiting
        return self.limiter.sample_blocker(
            n, self.writer.inserted, self.sampled
        ) or self.sampler.sample_blocker(n)

    def check_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        """Raise what :meth:`update_priorities` would raise, without changing anything.

        Negative priorities raise (a priority is a magnitude, e.g. ``|TD error|``; zero is allowed:
        ``priority_eps`` keeps every item drawable). NaN/inf raise unless ``nonfinite="count"``.
        """
        self._check_priority_args(slots, generations, priorities)
        self._raise_priority_faults(*self._priority_faults(slots, priorities))

    def _priority_faults(self, slots: torch.Tensor, priorities: torch.Tensor) -> tuple[int, int, int, float]:
        """``(first bad slot index or -1, non-finite, negative, lowest negative)``."""
        if priority_kernels.fusable(slots, priorities):
            return priority_kernels.scan(slots, priorities, self.capacity)
        lo, hi = torch.aminmax(slots) if slots.numel() else (torch.tensor(0), torch.tensor(0))
        bad_slot = 0 if int(lo) < 0 or int(hi) >= self.capacity else -1
        nonfinite = int((~torch.isfinite(priorities)).sum())
        neg = priorities[priorities < 0]
        return bad_slot, nonfinite, neg.numel(), float(neg.min()) if neg.numel() else 0.0

    def _check_priority_args(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        for name, t in (("slots", slots), ("generations", generations), ("priorities", priorities)):
            if not isinstance(t, torch.Tensor):
                raise ShapeError(f"update_priorities: {name} must be a tensor, got {type(t).__name__}")
        if not self.sampler.has_priorities:
            raise PriorityError(
                f"{type(self.sampler).__name__} has no priorities; use sampler='prioritized' to update them"
            )
        if not (slots.shape == generations.shape == priorities.shape) or slots.dim() != 1:
            raise ShapeError(
                f"update_priorities: slots {tuple(slots.shape)}, generations {tuple(generations.shape)} and "
                f"priorities {tuple(priorities.shape)} must be 1-D and of the same shape"
            )
        if slots.dtype != torch.int64 or generations.dtype != torch.int64:
            raise ShapeError(f"update_priorities: slots and generations must be int64, got {slots.dtype}")
        if not priorities.is_floating_point():
            raise ShapeError(f"update_priorities: priorities must be floating point, got {priorities.dtype}")

    def _raise_priority_faults(self, bad_slot: int, nonfinite: int, negative: int, lowest: float) -> None:
        if bad_slot >= 0:
            raise PriorityError(f"update_priorities: slots must lie in [0, {self.capacity})")
        if nonfinite and self.nonfinite == "reject":
            raise PriorityError("update_priorities: priorities must be finite (got NaN or inf)")
        if negative:
            raise PriorityError(
                "update_priorities: priorities must be >= 0 (pass a magnitude such as |TD error|), "
                f"got minimum {lowest}"
            )

    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> int:
        """Set new priorities for sampled items; returns how many were applied.

        Items whose slot was overwritten since they were sampled (their generation changed) are
        skipped and counted (``count/priority_updates_skipped``), so updates from batches that were in
        flight while the ring moved on never touch the newer items. With ``nonfinite="count"``,
        NaN/inf entries are skipped too (the item keeps its priority) and counted
        (``count/nonfinite_priorities``). Checked before anything changes: see :meth:`check_priorities`.
        """
        self._check_open()
        self._check_priority_args(slots, generations, priorities)
        with self._cond:
            dev = self.storage.device
            if slots.device != dev or generations.device != dev or priorities.device != dev:
                slots, generations, priorities = slots.to(dev), generations.to(dev), priorities.to(dev)
            if self.observer is not None:  # refused before anything changes (see extend)
                self.observer.check()
            stored = self.storage.generation
            reject = self.nonfinite == "reject"
            fused = self.sampler.update_checked(slots, generations, stored, priorities, self.capacity, reject)
            if fused is not None:  # checked, compared and applied in one pass (the CPU prioritized path)
                bad_slot, nonfinite, negative, lowest, applied = fused
                if applied < 0:
                    self._raise_priority_faults(bad_slot, nonfinite, negative, lowest)
            else:  # the step-by-step path (CUDA, non-contiguous input)
                self._raise_priority_faults(*self._priority_faults(slots, priorities))
                finite = torch.isfinite(priorities)
                live = (stored.index_select(0, slots) == generations) & finite
                applied, nonfinite = int(live.sum()), int(priorities.numel() - finite.sum())
                self.sampler.update_priorities(slots, priorities, live)
            if self.observer is not None:
                self.observer.priorities_updated(slots, generations, priorities, self.writer.inserted)
        if nonfinite:
            self.metrics.incr("nonfinite_priorities", nonfinite)
        if applied + nonfinite < slots.numel():
            self.metrics.incr("priority_updates_skipped", slots.numel() - applied - nonfinite)
        return applied

    def restore_consumed(self, inserted: int, head: int, version: int | None = None) -> None:
        """Journal replay of a consume-once buffer: items up to ``inserted`` were committed, those up to
        ``head`` consumed (and need no storage: they are never read again); ``version`` the last
        written. Moves the insert count and the FIFO head forward only."""
        with self._cond:
            sampler = self.sampler.state_dict()
            if sampler.get("kind") != "fifo":
                raise CheckpointError(
                    f"restore_consumed needs a FIFO buffer, this one is {sampler.get('kind')!r}"
                )
            old_head = sampler["head"]
            assert isinstance(old_head, int)
            if not (
                self.writer.inserted <= inserted
                and old_head <= head <= inserted
                and inserted - head <= self.capacity
            ):
                raise CheckpointError(
                    f"cannot move a FIFO at head {old_head}, insert count {self.writer.inserted} to head "
                    f"{head}, insert count {inserted} (capacity {self.capacity})"
                )
            self.sampler.load_state_dict({"kind": "fifo", "head": head, "tail": inserted})
            self.writer.inserted = inserted
            if version is not None and (self.last_version is None or version > self.last_version):
                self.last_version = version
            self._cond.notify_all()

    # -- blocking, growth, state, close ----------------------------------------------------------

    def _wait(self, blocker, what: str) -> None:  # noqa: ANN001
        reason = blocker()
        if reason is None:
            return
        if self.limiter.config.mode == "error":
            raise InsufficientDataError(f"{what} refused: {reason}")
        timeout = self.limiter.config.timeout_s
        deadline = time.monotonic() + timeout
        try:
            while reason is not None:
                if what == "insert":
                    self.insert_waiting = reason
                if self._closed:
                    raise ClosedError(f"buffer closed while a {what} was waiting: {reason}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InsufficientDataError(f"{what} timed out after {timeout:g}s waiting: {reason}")
                self._sleep(min(left, 0.5))
                reason = blocker()
        finally:
            if what == "insert":
                self.insert_waiting = None

    def wait_sampleable(
        self, n: int, timeout: float, cancel: Callable[[], bool] = lambda: False
    ) -> str | None:
        """Wait up to ``timeout`` seconds until a sample of ``n`` could run; the reason if it still cannot.

        ``cancel`` is checked at every wake-up (see :meth:`wake`); when it returns True the wait ends early.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            reason = self._sample_blocker(n)
            while reason is not None and not self._closed and not cancel():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._sleep(left)
                reason = self._sample_blocker(n)
            self._check_open()
            return reason

    def _sleep(self, timeout: float) -> None:
        """``self._cond.wait`` (lock held), counted in ``_waiters``."""
        self._waiters += 1
        try:
            self._cond.wait(timeout=timeout)
        finally:
            self._waiters -= 1

    def wake(self) -> None:
        """Wake every waiter so it re-checks its condition (e.g. a ``wait_sampleable`` cancel)."""
        with self._cond:
            self._cond.notify_all()

    def grow_column(self, name: str, max_len: int) -> MigrationReport:
        """Raise ragged column ``name``'s maximum length (one copy, online as in :meth:`migrate`);
        with a placer, the columns are re-planned for the new size in the same copy."""
        self._check_open()
        if self.placer is not None:
            return self.placer.grow(name, max_len)
        with self.moving:
            return migrate_columns(self.storage, self.writer, self._cond, self.metrics, {}, {name: max_len})

    def migrate(self, moves: Mapping[str, str], max_lens: Mapping[str, int] | None = None) -> MigrationReport:
        """Move columns to other tiers (``{column: tier}``) while writes and samples go on; widen the
        ragged columns in ``max_lens`` in the same copy.

        Each column is copied without the lock; then, under the lock, the rows written meanwhile are
        copied again and the column switches over, so no read sees a half-moved column and no item is
        lost. The report gives the bytes moved and the longest pause (time under the lock).
        """
        self._check_open()
        with self.moving:
            return migrate_columns(self.storage, self.writer, self._cond, self.metrics, moves, max_lens)

    def state_dict(self, first_undelivered: int | None = None) -> dict[str, object]:
        """Contents, sampler state and counters; items sampled from ``first_undelivered`` on count as unconsumed.

        Not the :attr:`lineage` (an identity, not contents): a checkpoint read adds the saved one as
        ``"lineage"``, which :meth:`load_state_dict` takes as the new lineage's parent."""
        with self._cond:
            return {
                "storage": self.storage.state_dict(),
                "sampler": self.sampler.state_dict(first_undelivered),
                "inserted": self.writer.inserted,
                "sampled": self.sampled,
            }

    def check_state(self, state: dict[str, object]) -> None:
        """Raise :class:`CheckpointError` unless ``state`` (a :meth:`state_dict`) fits this buffer and is
        consistent (storage, sampler and counters agree); changes nothing."""
        if not isinstance(state, dict) or not {"storage", "sampler", "inserted", "sampled"} <= set(state):
            got = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(
                f"not a buffer state: expected storage, sampler, inserted, sampled; got {got}"
            )
        for key in ("inserted", "sampled"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
                raise CheckpointError(f"buffer state {key}={str(value)[:40]} is not a count")
        if state.get("lineage") is not None and not is_lineage(state["lineage"]):
            raise CheckpointError(f"buffer state lineage {str(state['lineage'])[:40]!r} is not 32 hex digits")
        inserted, sampler = state["inserted"], state["sampler"]
        assert isinstance(inserted, int)
        self.sampler.check_state(sampler, inserted)  # type: ignore[arg-type]
        live = self.sampler.live(sampler, inserted)  # type: ignore[arg-type]
        self.storage.check_state(state["storage"], inserted, live)  # type: ignore[arg-type]

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`; a state that does not fit raises :class:`CheckpointError` first
        (:meth:`check_state`), and the buffer is then unchanged.

        The buffer starts a new :attr:`lineage` whose :attr:`parent` is the state's (lineage, insert
        count): a checkpoint may reuse the parent's segments up to that count, never another buffer's,
        and two buffers loaded from one state never reuse each other's later writes."""
        with self._cond:
            self.check_state(state)
            self.storage.load_state_dict(state["storage"])  # type: ignore[arg-type]
            self.sampler.load_state_dict(state["sampler"])  # type: ignore[arg-type]
            self.writer.inserted = int(state["inserted"])  # type: ignore[call-overload]
            self.last_version = None  # the runtime keeps (and restores) its own version order
            self.sampled = int(state["sampled"])  # type: ignore[call-overload]
            lineage = state.get("lineage")
            self.parent = (lineage, self.writer.inserted) if isinstance(lineage, str) else None
            self.lineage = new_lineage()
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse further use and wake any caller that is waiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the buffer was used after close()")


def new_lineage() -> str:
    """A fresh lineage id: 128 random bits as 32 hex digits."""
    return os.urandom(16).hex()


def is_lineage(value: object) -> bool:
    """Whether ``value`` is a lineage id (32 lowercase hex digits)."""
    return isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def check_size(n: int, what: str = "") -> None:
    """Raise :class:`ConfigError` (naming the call ``what``) unless ``n`` is a positive int (a batch size)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{what}{': ' if what else ''}batch size must be an int >= 1, got {n!r}")
