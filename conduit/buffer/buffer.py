"""The experience buffer: storage on a tier + writer + sampler + rate limiter, thread-safe."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch

from conduit.batch import ColumnBatch, validate
from conduit.buffer.rate_limiter import RateLimiter
from conduit.buffer.samplers import FifoSampler, PrioritizedSampler, Sampler, UniformSampler
from conduit.buffer.storage import RingStorage
from conduit.buffer.writers import GroupedWriter, RingWriter
from conduit.config import BufferConfig
from conduit.errors import CapacityError, ClosedError, InsufficientDataError, ShapeError, StaleDataError
from conduit.metrics import Metrics
from conduit.schema import Schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """Items read from the buffer, with what is needed to update their priorities later."""

    batch: ColumnBatch
    slots: torch.Tensor
    generations: torch.Tensor
    versions: torch.Tensor
    weights: torch.Tensor | None


class ExperienceBuffer:
    """Stores experience on one tier and serves samples of committed items.

    Example:
        >>> schema = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
        >>> buf = ExperienceBuffer(schema, BufferConfig(capacity=1000, sampler="prioritized"))
        >>> buf.extend(ColumnBatch({"obs": torch.zeros(8, 4), "reward": torch.zeros(8)}))
        >>> s = buf.sample(4)
        >>> buf.update_priorities(s.slots, s.generations, torch.rand(4))
    """

    def __init__(
        self,
        schema: Schema,
        config: BufferConfig | None = None,
        metrics: Metrics | None = None,
        seed: int | None = None,
    ) -> None:
        self.config = config or BufferConfig()
        cfg = self.config
        self.storage = RingStorage(schema, cfg.capacity, cfg.tier, cfg.disk_path, cfg.capacity_bytes)
        device = self.storage.device
        self.metrics = metrics or Metrics(trace=False)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(seed)
        self.sampler: Sampler
        if cfg.sampler == "uniform":
            self.sampler = UniformSampler(cfg.capacity, device, generator)
        elif cfg.sampler == "fifo":
            self.sampler = FifoSampler(cfg.capacity, device)
        else:
            self.sampler = PrioritizedSampler(
                cfg.capacity, device, cfg.alpha, cfg.beta, cfg.priority_eps, generator
            )
        self.writer = (
            GroupedWriter(cfg.capacity, device, cfg.group_size)
            if cfg.writer == "grouped"
            else RingWriter(cfg.capacity, device)
        )
        self.limiter = RateLimiter(cfg.rate_limit)
        self.sampled = 0
        self._cond = threading.Condition(threading.RLock())
        self._closed = False

    # -- properties ------------------------------------------------------------------------------

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
        validate(self.schema, batch)
        n = batch.size
        self.writer.check(n)
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

    def _insert_blocker(self, n: int) -> str | None:
        if self.sampler.consumes:
            free = self.config.capacity - self.sampler.available()
            if n > free:
                return (
                    f"only {free} free slots for {n} items: unconsumed on-policy items are never overwritten"
                )
        return self.limiter.insert_blocker(n, self.writer.inserted, self.sampled)

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
        if n < 1:
            raise InsufficientDataError(f"sample size must be >= 1, got {n}")
        if out is not None:
            self._check_out(out, n)
        with self._cond:
            if self._sample_blocker(n) is not None:
                self._wait(lambda: self._sample_blocker(n), "sample")
            check_stale = (
                self.sampler.consumes
                and version is not None
                and self.config.rate_limit.max_staleness is not None
            )
            if check_stale and self.config.rate_limit.mode == "error":
                self._check_staleness(n, version)  # type: ignore[arg-type]
            slots, weights = self.sampler.sample(n)
            if check_stale:
                slots = self._drop_stale(slots, n, version)  # type: ignore[arg-type]
            batch = self.storage.read(slots, out)
            meta = self.storage.meta.index_select(0, slots)
            self.sampled += n
            if self.sampler.consumes or self.config.rate_limit.samples_per_insert is not None:
                self._cond.notify_all()  # a writer may wait for room or for the ratio
        generations, versions = meta[:, 0], meta[:, 1]
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

    def _sample_blocker(self, n: int) -> str | None:
        return self.limiter.sample_blocker(
            n, self.sampler.available(), self.writer.inserted, self.sampled, self.sampler.consumes
        )

    def _drop_stale(self, slots: torch.Tensor, n: int, version: int) -> torch.Tensor:
        kept = self._fresh(slots, version)
        while kept.numel() < n:
            need = n - kept.numel()
            self._wait(lambda need=need: self._sample_blocker(need), "sample")
            more, _ = self.sampler.sample(need)
            kept = torch.cat([kept, self._fresh(more, version)])
        return kept

    def _fresh(self, slots: torch.Tensor, version: int) -> torch.Tensor:
        bound = self.config.rate_limit.max_staleness
        assert bound is not None
        fresh = slots[self.storage.version.index_select(0, slots) + bound >= version]
        evicted = slots.numel() - fresh.numel()
        if evicted:
            self.metrics.incr("stale_evicted", evicted)
            log.warning(
                "evicted %d stale item(s) (max_staleness=%d, consumer version %d)", evicted, bound, version
            )
        return fresh

    def _check_staleness(self, n: int, version: int) -> None:
        """Error mode: refuse, before consuming anything, a read that would include stale items."""
        bound = self.config.rate_limit.max_staleness
        assert bound is not None and isinstance(self.sampler, FifoSampler)
        oldest = int(self.storage.version.index_select(0, self.sampler.peek(n)).min())
        if oldest + bound < version:
            raise StaleDataError(
                f"the next {n} items include version {oldest}, older than max_staleness={bound} allows "
                f"for consumer version {version}"
            )

    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> int:
        """Set new priorities for sampled items; returns how many were applied.

        Items whose slot was overwritten since they were sampled (their generation changed) are
        skipped and counted (``count/priority_updates_skipped``), so updates from batches that were in
        flight while the ring moved on never touch the newer items.
        """
        self._check_open()
        if not (slots.shape == generations.shape == priorities.shape):
            raise CapacityError(
                f"update_priorities: slots {tuple(slots.shape)}, generations {tuple(generations.shape)} and "
                f"priorities {tuple(priorities.shape)} must have the same shape"
            )
        with self._cond:
            dev = self.storage.device
            slots, generations = slots.to(dev), generations.to(dev)
            if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.config.capacity):
                raise CapacityError(f"update_priorities: slots must lie in [0, {self.config.capacity})")
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
        if self.config.rate_limit.mode == "error":
            raise InsufficientDataError(f"{what} refused: {reason}")
        deadline = time.monotonic() + self.config.rate_limit.timeout_s
        while reason is not None:
            if self._closed:
                raise ClosedError(f"buffer closed while a {what} was waiting: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise InsufficientDataError(
                    f"{what} timed out after {self.config.rate_limit.timeout_s:g}s waiting: {reason}"
                )
            self._cond.wait(timeout=min(left, 0.5))
            reason = blocker()

    def wait_sampleable(self, n: int, timeout: float) -> str | None:
        """Wait up to ``timeout`` seconds until a sample of ``n`` could run; the reason if it still cannot."""
        deadline = time.monotonic() + timeout
        with self._cond:
            reason = self._sample_blocker(n)
            while reason is not None and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
                reason = self._sample_blocker(n)
            self._check_open()
            return reason

    def grow_column(self, name: str, max_len: int) -> None:
        """Raise ragged column ``name``'s maximum length in place (an explicit, one-copy operation)."""
        with self._cond:
            self.storage.grow_ragged(name, max_len)

    def state_dict(self) -> dict[str, object]:
        with self._cond:
            return {
                "storage": self.storage.state_dict(),
                "sampler": self.sampler.state_dict(),
                "inserted": self.writer.inserted,
                "sampled": self.sampled,
            }

    def load_state_dict(self, state: dict[str, object]) -> None:
        with self._cond:
            self.storage.load_state_dict(state["storage"])  # type: ignore[arg-type]
            self.sampler.load_state_dict(state["sampler"])  # type: ignore[arg-type]
            self.writer.inserted = int(state["inserted"])  # type: ignore[call-overload]
            self.sampled = int(state["sampled"])  # type: ignore[call-overload]

    def close(self) -> None:
        """Refuse further use and wake any caller that is waiting."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the buffer was used after close()")
