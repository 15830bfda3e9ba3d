"""Overlap: background ingestion and delivery workers that run vectorised kernels off the caller's path.

The workers only call torch kernels (which release the GIL) and wait on condition variables; they do
no per-item Python work, so they do not steal the interpreter from the learner. Errors raised in a
worker are kept and re-raised to the caller at its next call — nothing is dropped silently.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

import torch

from conduit.batch import ColumnBatch
from conduit.buffer.buffer import ExperienceBuffer
from conduit.errors import ClosedError, ConduitError, InsufficientDataError
from conduit.metrics import Metrics
from conduit.ops.delivery import Delivery, DeliveryPlan
from conduit.ops.operator import Operator, run_chain


class _Worker:
    """A daemon thread with a condition variable, a pending error and orderly shutdown."""

    def __init__(self, name: str) -> None:
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run_guarded, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 — kept and re-raised to the caller
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def run(self) -> None:
        raise NotImplementedError

    def raise_pending(self) -> None:
        if self.error is not None:
            err = self.error
            if isinstance(err, ConduitError):
                raise type(err)(f"background {self.thread.name} failed: {err}") from err
            raise ConduitError(f"background {self.thread.name} failed: {err!r}") from err

    def stop(self, timeout: float = 10.0) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout)


class AsyncIngestor(_Worker):
    """Takes fragments from ``put`` and ingests them ``g_ing`` at a time on a background thread."""

    def __init__(
        self, buffer: ExperienceBuffer, ops: Sequence[Operator], g_ing: int, depth: int, metrics: Metrics
    ) -> None:
        super().__init__("conduit-ingest")
        self.buffer, self.ops, self.g_ing, self.metrics = buffer, ops, g_ing, metrics
        self.capacity = depth * g_ing
        self.queue: collections.deque[tuple[ColumnBatch, int]] = collections.deque()
        self.busy = 0  # fragments taken from the queue and not yet committed
        self.flushing = 0

    def put(self, batch: ColumnBatch, version: int, timeout: float) -> None:
        with self.cond:
            ok = self.cond.wait_for(
                lambda: self.closed or self.error is not None or len(self.queue) < self.capacity, timeout
            )
            self.raise_pending()
            if self.closed:
                raise ClosedError("put() after close()")
            if not ok:
                raise InsufficientDataError(
                    f"ingestion queue stayed full ({self.capacity} fragments) for {timeout:g}s"
                )
            self.queue.append((batch, version))
            self.metrics.set_gauge("ingest_queue", len(self.queue))
            self.cond.notify_all()

    def flush(self, timeout: float) -> None:
        """Wait until every fragment put so far is committed to the buffer."""
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            try:
                ok = self.cond.wait_for(
                    lambda: self.error is not None or (not self.queue and not self.busy), timeout
                )
            finally:
                self.flushing -= 1
            self.raise_pending()
            if not ok:
                raise InsufficientDataError(
                    f"flush() timed out after {timeout:g}s with {len(self.queue)} fragments queued"
                )

    def run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: self.closed or len(self.queue) >= self.g_ing or (self.queue and self.flushing > 0)
                )
                if self.closed and not self.queue:
                    return
                version = self.queue[0][1]
                group: list[ColumnBatch] = []
                while self.queue and len(group) < self.g_ing and self.queue[0][1] == version:
                    group.append(self.queue.popleft()[0])
                self.busy = len(group)
                self.metrics.set_gauge("ingest_queue", len(self.queue))
                self.cond.notify_all()
            try:
                with self.metrics.span("ingest/batch"):
                    batch = run_chain(self.ops, ColumnBatch.cat(group), self.metrics, "ingest")
                    self.buffer.extend(batch, version=version)
            finally:
                with self.cond:
                    self.busy = 0
                    self.cond.notify_all()


class Prefetcher(_Worker):
    """Keeps up to ``depth`` deliveries of the last requested size ready ahead of the learner."""

    def __init__(
        self,
        buffer: ExperienceBuffer,
        plan: DeliveryPlan,
        g_del: int,
        depth: int,
        metrics: Metrics,
        error_mode: bool,
    ) -> None:
        super().__init__("conduit-deliver")
        self.buffer, self.plan, self.g_del, self.depth, self.metrics = buffer, plan, g_del, depth, metrics
        self.ready: collections.deque[Delivery] = collections.deque()
        self.batch_size: int | None = None
        self.version: int | None = None
        self.blocked_reason: str | None = None
        self.error_mode = error_mode
        self.inflight = False  # a delivery is being prepared at self.batch_size
        self.priorities: collections.deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = (
            collections.deque()
        )
        self.stream = torch.cuda.Stream(plan.device) if plan.device.type == "cuda" else None

    def get(self, batch_size: int, version: int | None, timeout: float) -> Delivery:
        with self.cond:
            self.raise_pending()
            if self.batch_size is not None and batch_size != self.batch_size:
                if self.buffer.sampler.consumes and (self.ready or self.inflight):
                    raise ConduitError(
                        f"async delivery of consume-once data was prepared for batch size {self.batch_size}; "
                        f"requesting {batch_size} would reorder items — keep the batch size constant"
                    )
                self.ready.clear()  # samples with replacement: nothing is lost by dropping them
            self.batch_size, self.version = batch_size, version
            self.cond.notify_all()
            ok = self.cond.wait_for(
                lambda: (
                    bool(self.ready)
                    or self.error is not None
                    or self.closed
                    or (self.error_mode and self.blocked_reason is not None)
                ),
                timeout,
            )
            self.raise_pending()
            if self.ready:
                if self.ready[0].batch.size != batch_size:
                    raise ConduitError(
                        f"async delivery of consume-once data was prepared for batch size {self.ready[0].batch.size}; "
                        f"requesting {batch_size} would reorder items — keep the batch size constant"
                    )
                delivery = self.ready.popleft()
                self.metrics.set_gauge("delivery_ready", len(self.ready))
                self.cond.notify_all()
                return delivery
            if self.closed:
                raise ClosedError("get() after close()")
            reason = self.blocked_reason or "no delivery became ready"
            if not ok:
                raise InsufficientDataError(f"get() timed out after {timeout:g}s: {reason}")
            raise InsufficientDataError(f"get() refused: {reason}")

    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        """Queue a priority update; the worker applies it before its next sample, in order."""
        with self.cond:
            self.raise_pending()
            self.priorities.append((slots, generations, priorities))
            self.cond.notify_all()

    def _apply_priorities(self) -> None:
        with self.cond:
            pending = list(self.priorities)
            self.priorities.clear()
        for slots, generations, priorities in pending:
            with self.metrics.span("deliver/update_priorities"):
                self.buffer.update_priorities(slots, generations, priorities)

    def _has_room(self) -> bool:
        return self.batch_size is not None and len(self.ready) + self.g_del <= max(self.depth, self.g_del)

    def run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or bool(self.priorities) or self._has_room())
                if self.closed:
                    return
                batch_size, version, room = self.batch_size, self.version, self._has_room()
                self.inflight = room
            self._apply_priorities()
            if not room:
                continue
            try:
                self._prepare(batch_size, version)
            finally:
                with self.cond:
                    self.inflight = False
                    self.cond.notify_all()

    def _prepare(self, batch_size: int | None, version: int | None) -> None:
        """Prepare ``g_del`` deliveries once the buffer can serve them (or note why it cannot)."""
        assert batch_size is not None
        reason = self.buffer.wait_sampleable(batch_size * self.g_del, timeout=0.5)
        with self.cond:
            self.blocked_reason = reason
            self.cond.notify_all()
        if reason is not None:
            return
        try:
            with self.metrics.span("deliver/batch"):
                out = self.plan.prepare(
                    self.buffer, batch_size, self.g_del, self.metrics, version, self.stream
                )
        except InsufficientDataError as e:  # another reader got there first; try again
            with self.cond:
                self.blocked_reason = str(e)
            return
        with self.cond:
            # Samples with replacement at an outdated size are dropped (nothing is lost); consume-once
            # data is always kept, and get() reports a size mismatch instead of reordering items.
            if batch_size == self.batch_size or self.buffer.sampler.consumes:
                self.ready.extend(out)
            self.metrics.set_gauge("delivery_ready", len(self.ready))
            self.cond.notify_all()
