"""The experience buffer: storage on a tier + writer + sampler + rate limiter, thread-safe."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conduit.batch import ColumnBatch, validate
from conduit.buffer.base import Sampler, Storage, Writer
from conduit.buffer.rate_limiter import RateLimiter
from conduit.buffer.writers import RingWriter
from conduit.errors import (
    CheckpointError,
    ClosedError,
    ConfigError,
    InsufficientDataError,
    PriorityError,
    ShapeError,
)
from conduit.metrics import Metrics
from conduit.schema import Schema


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

    Build one from a config (``BufferConfig(...).build(schema)``, or a preset such as
    ``BufferConfig.prioritized_replay(100_000).build(schema)``) or compose the parts yourself.

    Example:
        >>> schema = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
        >>> buf = BufferConfig(capacity=1000, sampler="prioritized").build(schema)
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
    ) -> None:
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
        self._cond = threading.Condition(threading.RLock())
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

    def __len__(self) -> int:
        """Items a sample can draw from now (FIFO: items not yet consumed)."""
        return self.sampler.available()

    # -- writing ---------------------------------------------------------------------------------

    def extend(self, batch: ColumnBatch, version: int = 0) -> torch.Tensor:
        """Validate and commit ``batch`` (tagged with policy ``version``); returns its slots.

        Raises a :class:`~conduit.errors.SchemaError` subclass on a schema mismatch and
        :class:`~conduit.errors.CapacityError` when the write cannot fit; the buffer is then unchanged.
        """
        self._check_open()
        self.check_write(batch)
        n = batch.size
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        with self._cond:
            self._wait(lambda: self._insert_blocker(n), "insert")
            first_generation = self.writer.inserted + 1
            slots = self.writer.reserve(n)
            self.storage.write(slots, batch, version, first_generation)
            self.sampler.on_insert(slots, self.writer.inserted)
            self._cond.notify_all()
        self.metrics.incr("inserted", n)
        self.metrics.add_bytes(f"{batch.device.type}->{self.storage.tier}", batch.nbytes)
        return slots

    def check_write(self, batch: ColumnBatch) -> None:
        """Raise what :meth:`extend` would raise for ``batch`` before waiting (schema, size, groups)."""
        validate(self.schema, batch)
        self.writer.check(batch.size)

    def _insert_blocker(self, n: int) -> str | None:
        return self.sampler.insert_blocker(n) or self.limiter.insert_blocker(
            n, self.writer.inserted, self.sampled
        )

    # -- reading ---------------------------------------------------------------------------------

    def sample(self, n: int, version: int | None = None, out: ColumnBatch | None = None) -> Sample:
        """Read ``n`` committed items (FIFO: the next ``n``, consumed exactly once).

        ``out`` (optional) is a batch from an earlier sample of the same size whose fixed columns are
        reused as the destination of the gather — for steady-state consumers that are done with it.

        ``version`` is the consumer's policy version; with ``rate_limit.max_staleness`` set, FIFO
        items written more than ``max_staleness`` versions earlier are evicted and counted
        (``count/stale_evicted``) in block mode, or raise :class:`StaleDataError` in error mode.
        """
        self._check_open()
        check_size(n)
        if out is not None:
            self._check_out(out, n)
        with self._cond:
            self.sampler.before_sample(n, version)
            if self._sample_blocker(n) is not None:
                self._wait(lambda: self._sample_blocker(n, version), "sample")
            slots, weights = self.sampler.sample(n)
            batch = self.storage.read(slots, out)
            generations = self.storage.generation.index_select(0, slots)
            versions = self.storage.version.index_select(0, slots)
            self.sampled += n
            self._cond.notify_all()  # a writer may wait for room or for the ratio
        self.metrics.incr("sampled", n)
        return Sample(batch, slots, generations, versions, weights)

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
            if dst.device != self.storage.device:
                raise ShapeError(
                    f"sample(out=...): column {col.name!r} is on {dst.device}, not {self.storage.device}"
                )

    def _sample_blocker(self, n: int, version: int | None = None) -> str | None:
        if version is not None:
            self.sampler.before_sample(n, version)  # items may have gone stale while waiting
        return self.limiter.sample_blocker(
            n, self.writer.inserted, self.sampled
        ) or self.sampler.sample_blocker(n)

    def check_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        """Raise what :meth:`update_priorities` would raise, without changing anything."""
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
        if slots.numel():
            lo, hi = torch.aminmax(slots)
            if int(lo) < 0 or int(hi) >= self.capacity:
                raise PriorityError(f"update_priorities: slots must lie in [0, {self.capacity})")
        if not bool(torch.isfinite(priorities).all()):
            raise PriorityError("update_priorities: priorities must be finite (got NaN or inf)")

    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> int:
        """Set new priorities for sampled items; returns how many were applied.

        Items whose slot was overwritten since they were sampled (their generation changed) are
        skipped and counted (``count/priority_updates_skipped``), so updates from batches that were in
        flight while the ring moved on never touch the newer items.
        """
        self._check_open()
        self.check_priorities(slots, generations, priorities)
        with self._cond:
            dev = self.storage.device
            slots, generations = slots.to(dev), generations.to(dev)
            live = self.storage.generation.index_select(0, slots) == generations
            self.sampler.update_priorities(slots, priorities.to(dev), live)
        applied = int(live.sum())
        if applied < slots.numel():
            self.metrics.incr("priority_updates_skipped", slots.numel() - applied)
        return applied

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
                self._cond.wait(timeout=min(left, 0.5))
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
                self._cond.wait(timeout=left)
                reason = self._sample_blocker(n)
            self._check_open()
            return reason

    def wake(self) -> None:
        """Wake every waiter so it re-checks its condition (e.g. a ``wait_sampleable`` cancel)."""
        with self._cond:
            self._cond.notify_all()

    def grow_column(self, name: str, max_len: int) -> None:
        """Raise ragged column ``name``'s maximum length in place (an explicit, one-copy operation)."""
        with self._cond:
            self.storage.grow_ragged(name, max_len)  # type: ignore[attr-defined]

    def state_dict(self, first_undelivered: int | None = None) -> dict[str, object]:
        """Contents, sampler state and counters; items sampled from ``first_undelivered`` on count as unconsumed."""
        with self._cond:
            return {
                "storage": self.storage.state_dict(),
                "sampler": self.sampler.state_dict(first_undelivered),
                "inserted": self.writer.inserted,
                "sampled": self.sampled,
            }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`; a state that does not fit raises :class:`CheckpointError` first."""
        if not isinstance(state, dict) or not {"storage", "sampler", "inserted", "sampled"} <= set(state):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(
                f"not a buffer state: expected storage, sampler, inserted, sampled; got {got}"
            )
        for key in ("inserted", "sampled"):
            if not isinstance(state[key], int) or state[key] < 0:  # type: ignore[operator]
                raise CheckpointError(f"buffer state {key}={state[key]!r} is not a count")
        with self._cond:
            self.storage.check_state(state["storage"])  # type: ignore[arg-type]
            self.sampler.check_state(state["sampler"])  # type: ignore[arg-type]
            self.storage.load_state_dict(state["storage"])  # type: ignore[arg-type]
            self.sampler.load_state_dict(state["sampler"])  # type: ignore[arg-type]
            self.writer.inserted = int(state["inserted"])  # type: ignore[call-overload]
            self.sampled = int(state["sampled"])  # type: ignore[call-overload]
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse further use and wake any caller that is waiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the buffer was used after close()")


def check_size(n: int) -> None:
    """Raise :class:`ConfigError` unless ``n`` is a positive int (a sample or batch size)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"batch size must be an int >= 1, got {n!r}")
