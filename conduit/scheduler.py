"""Overlap: *when* ingestion and delivery run. One interface, two implementations with one semantics.

- :class:`InlineScheduler` (``overlap="sync"``) runs the ingestion operators and the delivery inside
  the caller's ``put``/``get`` — the native path's behaviour.
- :class:`BackgroundScheduler` (``overlap="async"``) runs them on two background threads: ingestion
  takes fragments ``g_ing`` at a time, delivery keeps up to ``depth`` deliveries ready. The threads
  only call torch kernels (which release the GIL) and wait on one condition variable; they do no
  per-item Python work, so they do not steal the interpreter from the learner.

Both serve a request from prepared deliveries first (:class:`~conduit.ops.delivery.ReadyQueue`), so a
consume-once item is delivered exactly once whatever batch sizes the caller asks for. Inputs are
validated by the runtime on the caller's thread before they reach a scheduler.

Failures have one outcome in both modes. A fragment refused for its data (an ingestion operator raising,
NaN in a checked column) raises its error once — sync: from that ``put``; async: from the next ``put``,
``flush`` or ``get`` — and the runtime goes on. A delivery operator that raises leaves the drawn items
held for the next ``get`` (nothing consume-once is lost) and raises to the getter. Waiting getters are
served in arrival order. Only a worker that dies (an error that is not a ``ConduitError``) ends the async
runtime: its error is raised to every caller from then on.
"""

from __future__ import annotations

import collections
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from conduit.batch import ColumnBatch
from conduit.buffer.buffer import ExperienceBuffer
from conduit.config import SchedulerConfig
from conduit.errors import ClosedError, ConduitError, InsufficientDataError, StaleDataError
from conduit.ops.delivery import Delivery, DeliveryPlan, ReadyQueue, Request
from conduit.ops.operator import Operator, run_chain

T = TypeVar("T")


class Scheduler(ABC):
    """Runs ingestion and delivery for one buffer; ``Conduit`` calls it after validating the input."""

    def __init__(
        self,
        buffer: ExperienceBuffer,
        ingest: Sequence[Operator],
        plan: DeliveryPlan,
        config: SchedulerConfig,
    ) -> None:
        self.buffer, self.ingest, self.plan, self.config = buffer, tuple(ingest), plan, config
        self.metrics = buffer.metrics
        self.ready = ReadyQueue()
        self._start()

    @abstractmethod
    def _start(self) -> None:
        """Set up what the implementation needs (locks, threads)."""

    @abstractmethod
    def put(self, batch: ColumnBatch, version: int, timeout: float) -> None: ...

    @abstractmethod
    def flush(self, timeout: float) -> None:
        """Return once every fragment put so far is in the buffer."""

    @abstractmethod
    def get(self, request: Request, timeout: float) -> Delivery: ...

    @abstractmethod
    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        """Apply (sync) or queue (async: applied before the next sample, in order) a priority update."""

    @abstractmethod
    def quiesced(self, fn: Callable[[int | None], T], timeout: float) -> T:
        """Run ``fn(first_undelivered_slot)`` with ingestion flushed, priorities applied, delivery paused."""

    @abstractmethod
    def close(self, drain: bool, timeout: float) -> None:
        """Stop; with ``drain`` ingest what is queued first (raises if it cannot)."""

    @abstractmethod
    def stop(self) -> None:
        """Tell the workers to end and wake every waiter, without waiting (safe from a finalizer)."""

    def discard_prepared(self) -> None:
        """Drop prepared and held items (call quiesced: they belonged to contents being replaced)."""
        self.ready.clear()
        self.plan.held = None


class InlineScheduler(Scheduler):
    """``overlap="sync"``: everything runs in the caller's thread; a lock keeps concurrent callers whole."""

    def _start(self) -> None:
        self._lock = threading.RLock()
        self._turns = threading.Condition()
        self._getters: collections.deque[object] = collections.deque()  # waiting gets, in arrival order

    def put(self, batch: ColumnBatch, version: int, timeout: float) -> None:
        self.buffer.extend(run_chain(self.ingest, batch, self.metrics, "ingest"), version=version)

    def flush(self, timeout: float) -> None:
        return None

    def get(self, request: Request, timeout: float) -> Delivery:
        ticket = object()
        with self._turns:  # getters take turns in arrival order (a lock alone grants it in any order)
            self._getters.append(ticket)
            try:
                self._turns.wait_for(lambda: self._getters[0] is ticket)
            except BaseException:  # interrupted while waiting: give up the place in the line
                self._getters.remove(ticket)
                self._turns.notify_all()
                raise
        try:
            return self._get(request)
        finally:
            with self._turns:
                self._getters.popleft()
                self._turns.notify_all()

    def _get(self, request: Request) -> Delivery:
        with self._lock:
            delivery = self.ready.take(request, self.plan)
            if delivery is not None:
                return delivery
            short = request.size - self.ready.items
            if self.ready.items:  # top up what is prepared, then cut the request from it
                items, ready = self.plan.draw(self.buffer, short, request.version, self.metrics)
                self.ready.push([Delivery(items, [items], None, ready)])
            else:
                count = self.plan.batches(self.buffer, request, self.config.g_del)
                with self.metrics.span("deliver/batch"):
                    self.ready.push(self.plan.prepare(self.buffer, request, count, self.metrics))
            delivery = self.ready.take(request, self.plan)
            assert delivery is not None
            return delivery

    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        self.buffer.update_priorities(slots, generations, priorities)

    def quiesced(self, fn: Callable[[int | None], T], timeout: float) -> T:
        with self._lock:
            return fn(self.ready.first_slot(self.plan))

    def close(self, drain: bool, timeout: float) -> None:
        self.stop()

    def stop(self) -> None:
        self.buffer.close()  # not under the lock: a get() blocked in the buffer must wake and raise


@dataclass(eq=False)
class _Ticket:
    """One waiting ``get``: getters are served in the order they arrived."""

    request: Request


class BackgroundScheduler(Scheduler):
    """``overlap="async"``: an ingestion thread and a delivery thread around one condition variable."""

    def _start(self) -> None:
        buffer, plan, config = self.buffer, self.plan, self.config
        self.cond = threading.Condition()
        self.error: BaseException | None = None  # a worker died: raised to every caller, for good
        self.closed = False
        # ingestion
        self.queue: collections.deque[tuple[ColumnBatch, int]] = collections.deque()
        self.queue_limit = config.depth * config.g_ing
        self.busy = 0  # fragments taken from the queue and not yet committed
        self.uncommitted = 0  # items queued (put, not yet taken by the ingest worker)
        self.ingesting = (0, 0)  # (items being ingested, the buffer's insert count when taken)
        self.flushing = 0
        self.refused: list[ConduitError] = []  # fragments ingestion refused, not yet reported
        # delivery
        self.getters: collections.deque[_Ticket] = collections.deque()  # waiting gets, in arrival order
        self.request: Request | None = None  # what the delivery thread prepares for (first getter's)
        self.inflight = False  # the delivery thread is preparing or applying priorities
        self.paused = 0
        self.refusal: ConduitError | None = None  # why the last preparation could not run (error mode)
        self.failed: ConduitError | None = None  # a delivery that failed, not yet reported to a getter
        self.priorities: collections.deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = (
            collections.deque()
        )
        self.error_mode = buffer.limiter.config.mode == "error"
        self.stream = torch.cuda.Stream(plan.device) if plan.device.type == "cuda" else None
        self.threads = [
            threading.Thread(
                target=self._guard, args=(self._ingest_loop,), name="conduit-ingest", daemon=True
            ),
            threading.Thread(
                target=self._guard, args=(self._deliver_loop,), name="conduit-deliver", daemon=True
            ),
        ]
        for t in self.threads:
            t.start()

    # -- caller side -----------------------------------------------------------------------------

    def put(self, batch: ColumnBatch, version: int, timeout: float) -> None:
        with self.cond:
            ok = self.cond.wait_for(
                lambda: (
                    self.closed
                    or self.error is not None
                    or bool(self.refused)
                    or len(self.queue) < self.queue_limit
                ),
                timeout,
            )
            self._raise_pending()
            if not ok:
                raise InsufficientDataError(
                    f"ingestion queue stayed full ({self.queue_limit} fragments) for {timeout:g}s"
                )
            if self.error_mode:  # refuse here, as sync does, rather than fail the worker later
                reason = self.buffer.insert_refusal(self.uncommitted + batch.size, self.ingesting)
                if reason is not None:
                    raise InsufficientDataError(f"put refused: {reason}")
            self.uncommitted += batch.size
            self.queue.append((batch, version))
            self.metrics.set_gauge("ingest_queue", len(self.queue))
            self.cond.notify_all()

    def flush(self, timeout: float) -> None:
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            try:
                ok = self.cond.wait_for(self._drained, timeout)
            finally:
                self.flushing -= 1
            self._raise_pending()
            if not ok:
                reason = self.buffer.insert_waiting or "ingestion did not finish"
                raise InsufficientDataError(
                    f"flush() timed out after {timeout:g}s with {len(self.queue) + self.busy} fragment(s) "
                    f"not ingested: {reason}"
                )

    def get(self, request: Request, timeout: float) -> Delivery:
        deadline = time.monotonic() + timeout
        ticket = _Ticket(request)
        with self.cond:
            self._raise_pending()
            self.getters.append(ticket)
            try:
                return self._serve(ticket, timeout, deadline)
            finally:
                self.getters.remove(ticket)
                self.cond.notify_all()  # the next getter (if any) takes its turn

    def _serve(self, ticket: _Ticket, timeout: float, deadline: float) -> Delivery:
        """Wait for ``ticket``'s turn, then for its delivery (call with ``cond`` held)."""
        request = ticket.request
        while True:
            self._raise_pending()
            if self.getters[0] is ticket:
                if self.request != request:
                    # Only the delivery thread draws, and it appends in draw order: whatever it prepared
                    # for the old request is served first, re-cut to this one.
                    self.request, self.refusal = request, None
                    self.buffer.wake()  # the delivery thread may be waiting for the old request's items
                    self.cond.notify_all()
                delivery = self.ready.take(request, self.plan)
                if delivery is not None:
                    self.metrics.set_gauge("delivery_ready", len(self.ready.entries))
                    return delivery
                if self.failed is not None:  # reported once; the delivery thread then tries again
                    err, self.failed = self.failed, None
                    raise type(err)(f"delivery failed (the items are kept for the next get): {err}") from err
                if self.error_mode and self.refusal is not None:
                    if isinstance(self.refusal, InsufficientDataError) and not self.inflight:
                        if self._shortfall_reason(request) is None:  # the refusal is outdated
                            self.refusal = None
                            self.cond.notify_all()
                            continue
                    raise type(self.refusal)(f"get() refused: {self.refusal}")
            left = deadline - time.monotonic()
            if left <= 0:
                ahead = self.getters.index(ticket)
                reason = (
                    f"{ahead} earlier get() call(s) still waiting"
                    if ahead
                    else self.refusal or self._shortfall_reason(request) or "no delivery became ready"
                )
                raise InsufficientDataError(f"get() timed out after {timeout:g}s: {reason}")
            self.cond.wait(left)

    def _shortfall_reason(self, request: Request) -> str | None:
        """Why the buffer cannot supply what ``request`` still lacks now (None: it can)."""
        need = request.size - self.ready.items - self.plan.held_items
        return None if need <= 0 else self.buffer.wait_sampleable(need, 0)

    def update_priorities(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        self.buffer.check_priorities(slots, generations, priorities)  # on the caller's thread, as sync does
        with self.cond:
            self._raise_pending()
            self.priorities.append((slots, generations, priorities))
            self.cond.notify_all()

    def quiesced(self, fn: Callable[[int | None], T], timeout: float) -> T:
        self.flush(timeout)
        with self.cond:
            self.paused += 1
            self.buffer.wake()
            try:
                ok = self.cond.wait_for(lambda: not self.inflight or self.error is not None, timeout)
                self._raise_pending()
                if not ok:
                    raise InsufficientDataError(f"the delivery worker did not pause within {timeout:g}s")
                self._apply_priorities(self._take_priorities())
                return fn(self.ready.first_slot(self.plan))
            finally:
                self.paused -= 1
                self.cond.notify_all()

    def close(self, drain: bool, timeout: float) -> None:
        left, reason = 0, ""
        if drain:
            deadline = time.monotonic() + timeout
            with self.cond:
                self.flushing += 1
                self.cond.notify_all()
                # Wait for the queue to drain, unless the write waits for room nobody will make now.
                while not self._drained() and self.error is None and time.monotonic() < deadline:
                    if self.buffer.insert_waiting is not None:
                        break
                    self.cond.wait(0.05)
                self.flushing -= 1
                left = 0 if self.error is not None else len(self.queue) + self.busy
                reason = self.buffer.insert_waiting or "timed out"
        self.stop()
        for t in self.threads:
            t.join(5.0)
        if left:
            raise ConduitError(
                f"close(drain=True): {left} queued fragment(s) could not be ingested: {reason}"
            )

    def stop(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.buffer.close()  # wakes a write or a wait_sampleable blocked in the buffer

    # -- workers ---------------------------------------------------------------------------------

    def _drained(self) -> bool:
        return self.error is not None or (not self.queue and not self.busy)

    def _raise_pending(self) -> None:
        """Raise a dead worker's error (always), ``ClosedError``, or the fragments refused since the last
        call (once)."""
        if self.error is not None:
            err = self.error
            if isinstance(err, ConduitError):
                raise type(err)(f"background worker failed: {err}") from err
            raise ConduitError(f"background worker failed: {err!r}") from err
        if self.closed:
            raise ClosedError("Conduit was used after close()")
        if self.refused:
            first, more = self.refused[0], len(self.refused) - 1
            self.refused.clear()
            also = f" ({more} more fragment(s) refused since)" if more else ""
            raise type(first)(f"{first}{also}; this call did nothing, the runtime goes on") from first

    def _guard(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except BaseException as e:  # noqa: BLE001 — kept and raised to every caller
            with self.cond:
                if not self.closed:
                    self.error = e
                self.cond.notify_all()

    def _ingest_loop(self) -> None:
        g_ing, capacity = self.config.g_ing, self.buffer.capacity
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: (
                        self.closed or len(self.queue) >= g_ing or (bool(self.queue) and self.flushing > 0)
                    )
                )
                if self.closed:
                    return
                version = self.queue[0][1]
                group: list[ColumnBatch] = [self.queue.popleft()[0]]
                total = group[0].size
                while (
                    self.queue
                    and len(group) < g_ing
                    and self.queue[0][1] == version
                    and total + self.queue[0][0].size <= capacity
                ):
                    total += self.queue[0][0].size
                    group.append(self.queue.popleft()[0])
                self.busy = len(group)
                # in flight: counted by put's check until the buffer's insert count shows the commit
                self.uncommitted -= total
                self.ingesting = (total, self.buffer.inserted)
                self.metrics.set_gauge("ingest_queue", len(self.queue))
                self.cond.notify_all()
            try:
                with self.metrics.span("ingest/batch"):
                    self._ingest(group, version)
            finally:
                with self.cond:
                    self.busy = 0
                    self.ingesting = (0, 0)
                    self.cond.notify_all()

    def _ingest(self, group: list[ColumnBatch], version: int) -> None:
        """Run the ingestion operators on ``group`` and commit it. A fragment refused for its data (a
        ``ConduitError``: an operator failing, NaN in a checked column) is noted for the next caller, as
        sync would raise it; when a group fails, its fragments are retried one by one, so only the bad
        ones are refused. Anything else (and ``ClosedError``) ends the worker."""
        try:
            self.buffer.extend(
                run_chain(self.ingest, ColumnBatch.cat(group), self.metrics, "ingest"), version
            )
            return
        except ClosedError:
            raise
        except ConduitError as e:
            if len(group) == 1:
                self._refuse(e, group[0], version)
                return
        left = sum(b.size for b in group)
        for fragment in group:  # the failure path only: one fragment at a time, as sync would
            with self.cond:
                self.ingesting = (left, self.buffer.inserted)
            try:
                self.buffer.extend(run_chain(self.ingest, fragment, self.metrics, "ingest"), version)
            except ClosedError:
                raise
            except ConduitError as e:
                self._refuse(e, fragment, version)
            left -= fragment.size

    def _refuse(self, error: ConduitError, fragment: ColumnBatch, version: int) -> None:
        refused = type(error)(
            f"ingestion refused a fragment of {fragment.size} item(s) (version {version}): {error}"
        )
        refused.__cause__ = error
        with self.cond:
            self.refused.append(refused)
            self.cond.notify_all()
        self.metrics.incr("ingest_refused", fragment.size)

    def _room(self) -> int:
        """Deliveries the next draw may prepare (0: enough is ready): up to ``g_del``, within ``depth``."""
        req = self.request
        if req is None:
            return 0
        g_del = 1 if req.minibatch_size is not None else self.config.g_del
        free = max(self.config.depth, g_del) * req.size - self.ready.items
        if self.ready.items < req.size:  # never leave a request unservable
            return max(1, min(g_del, free // req.size))
        return min(g_del, free // req.size)

    def _take_priorities(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The queued priority updates, in order (call with ``cond`` held)."""
        pending = list(self.priorities)
        self.priorities.clear()
        return pending

    def _apply_priorities(self, pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        for slots, generations, priorities in pending:
            with self.metrics.span("deliver/update_priorities"):
                self.buffer.update_priorities(slots, generations, priorities)

    def _deliver_loop(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: (
                        self.closed
                        or (
                            not self.paused
                            and (bool(self.priorities) or (self.failed is None and self._room() > 0))
                        )
                    )
                )
                if self.closed:
                    return
                request, have = self.request, self.ready.items
                room = self._room() if self.failed is None else 0  # after a failure: wait for a getter
                pending = self._take_priorities()
                self.inflight = True
            out: list[Delivery] = []
            try:
                self._apply_priorities(pending)
                if room and request is not None:
                    out = self._prepare(request, room, have)
            finally:
                with self.cond:  # pushed before inflight clears: a pause never misses prepared items
                    self.ready.push(out)
                    self.metrics.set_gauge("delivery_ready", len(self.ready.entries))
                    self.inflight = False
                    self.cond.notify_all()

    def _prepare(self, request: Request, room: int, have: int) -> list[Delivery]:
        """Deliveries for ``request`` once the buffer can serve them (or the refusal noted for ``get``).

        With ``have`` items already prepared but fewer than the request, only the shortfall is drawn
        (the caller's ``get`` cuts the request from both), so consume-once data never waits for more
        items than the request needs. Items held from a failed delivery count towards it. A failing
        delivery (an operator) is noted for the next getter; its items are held, not lost.
        """

        def moved_on() -> bool:
            return self.closed or bool(self.paused) or self.request != request

        short = request.size - have if 0 < have < request.size else 0
        need = (short or request.size) - self.plan.held_items
        reason = None
        if need > 0:
            reason = self.buffer.wait_sampleable(need, timeout=0.5, cancel=moved_on)
        if reason is not None or moved_on():
            with self.cond:
                if self.request == request:  # a refusal of an older request never fails a newer one
                    self.refusal = None if reason is None else InsufficientDataError(reason)
                self.cond.notify_all()
            return []
        try:
            with self.metrics.span("deliver/batch"):
                if short:
                    items, ready = self.plan.draw(
                        self.buffer, short, request.version, self.metrics, self.stream
                    )
                    out = [Delivery(items, [items], None, ready)]
                else:
                    count = self.plan.batches(self.buffer, request, room)
                    out = self.plan.prepare(self.buffer, request, count, self.metrics, self.stream)
        except (
            InsufficientDataError,
            StaleDataError,
        ) as e:  # error mode refused, or a reader got there first
            with self.cond:
                if self.request == request:
                    self.refusal = e
                self.cond.notify_all()
            return []
        except ClosedError:
            return []
        except ConduitError as e:  # a delivery operator failed: the next getter hears of it
            with self.cond:
                self.failed = e
                self.cond.notify_all()
            return []
        with self.cond:
            self.refusal = None
        return out
