"""Delivery: sample → gather → operators (collate / pack) → move to the consumer device → lay out per rank.

A consumer asks with a :class:`Request`: ``size`` items as one mini-batch split over the ranks, or (PPO)
``size`` items laid out as ``num_minibatches`` minibatches of ``minibatch_size`` rows per rank, with a
fresh permutation per epoch. Prepared deliveries wait in a :class:`ReadyQueue`; a request of another
shape is served from the items already prepared (merged and re-cut in order), so a consume-once item is
delivered exactly once whatever sizes the caller asks for, and no sampled item is wasted.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from conduit.batch import ColumnBatch
from conduit.buffer.buffer import ExperienceBuffer, check_size
from conduit.errors import ConfigError
from conduit.metrics import Metrics
from conduit.ops.operator import Operator, run_chain


@dataclass(frozen=True)
class Request:
    """What a consumer asks for; ``minibatch_size``/``num_minibatches`` set ask for an epoch layout."""

    size: int
    version: int | None = None
    minibatch_size: int | None = None
    num_minibatches: int | None = None

    def __post_init__(self) -> None:
        check_size(self.size)
        if (self.minibatch_size is None) != (self.num_minibatches is None):
            raise ConfigError("an epoch request needs both minibatch_size and num_minibatches")
        if self.minibatch_size is not None:
            check_size(self.minibatch_size)
            check_size(self.num_minibatches)  # type: ignore[arg-type]

    @property
    def layout(self) -> tuple[int, int | None, int | None]:
        """What makes two requests' deliveries interchangeable (the consumer version does not)."""
        return (self.size, self.minibatch_size, self.num_minibatches)


@dataclass(frozen=True)
class Part:
    """Items with what is needed to send their priorities back: a whole delivery or one rank's share."""

    batch: ColumnBatch
    slots: torch.Tensor
    generations: torch.Tensor
    versions: torch.Tensor
    weights: torch.Tensor | None

    @property
    def size(self) -> int:
        return self.batch.size

    def slice(self, lo: int, hi: int) -> Part:
        w = None if self.weights is None else self.weights[lo:hi]
        return Part(
            self.batch.slice(lo, hi), self.slots[lo:hi], self.generations[lo:hi], self.versions[lo:hi], w
        )

    def index(self, idx: torch.Tensor) -> Part:
        w = None if self.weights is None else self.weights.index_select(0, idx.to(self.weights.device))
        meta = [t.index_select(0, idx.to(t.device)) for t in (self.slots, self.generations, self.versions)]
        return Part(self.batch.index(idx), meta[0], meta[1], meta[2], w)

    def split(self, parts: int) -> list[Part]:
        """``parts`` contiguous shares whose sizes differ by at most one (as ``ColumnBatch.split``)."""
        bounds = [0]
        for b in self.batch.split(parts):
            bounds.append(bounds[-1] + b.size)
        return [self.slice(bounds[i], bounds[i + 1]) for i in range(parts)]

    @staticmethod
    def cat(parts: Sequence[Part]) -> Part:
        if len(parts) == 1:
            return parts[0]
        weights = None if parts[0].weights is None else torch.cat([p.weights for p in parts])  # type: ignore[misc]
        return Part(
            ColumnBatch.cat([p.batch for p in parts]),
            torch.cat([p.slots for p in parts]),
            torch.cat([p.generations for p in parts]),
            torch.cat([p.versions for p in parts]),
            weights,
        )


@dataclass
class Delivery:
    """One training-ready delivery: its items, and one :class:`Part` per consumer rank.

    Plain requests: ``parts[r]`` is rank ``r``'s contiguous share of ``batch``. Epoch requests:
    ``parts[r]`` holds rank ``r``'s rows in minibatch order for all epochs (``num_minibatches`` slices
    of ``minibatch_size`` rows each). Every part carries its own slots, generations and weights.
    """

    items: Part
    parts: list[Part]
    layout: tuple[int, int | None, int | None] | None = None
    ready: torch.cuda.Event | None = field(default=None, repr=False)

    @property
    def batch(self) -> ColumnBatch:
        return self.items.batch

    @property
    def slots(self) -> torch.Tensor:
        return self.items.slots

    @property
    def generations(self) -> torch.Tensor:
        return self.items.generations

    @property
    def versions(self) -> torch.Tensor:
        return self.items.versions

    @property
    def weights(self) -> torch.Tensor | None:
        return self.items.weights

    @property
    def minibatch_size(self) -> int | None:
        return None if self.layout is None else self.layout[1]

    @property
    def num_minibatches(self) -> int | None:
        return None if self.layout is None else self.layout[2]

    def to_tensordict(self):  # noqa: ANN201  (tensordict is typed loosely)
        """The delivered batch as a ``TensorDict`` (shared memory; ragged columns as jagged tensors)."""
        return self.items.batch.to_tensordict()

    def wait(self) -> None:
        """Make the current CUDA stream wait for the copy that produced this delivery."""
        if self.ready is not None:
            torch.cuda.current_stream().wait_event(self.ready)
            self.ready = None


#: passes over its items one epoch delivery may lay out (``num_minibatches * minibatch_size`` rows per
#: rank at most this many times the rank's share): its rows are gathered, so they are bounded first
MAX_EPOCHS = 1024


def epoch_index(
    n: int, num_minibatches: int, minibatch_size: int, generator: torch.Generator
) -> torch.Tensor:
    """Row order for ``num_minibatches`` minibatches over ``n`` rows: a fresh permutation per epoch."""
    total = num_minibatches * minibatch_size
    epochs = math.ceil(total / n)
    perms = torch.argsort(torch.rand(epochs, n, generator=generator), dim=1)
    return perms.reshape(-1)[:total]


class DeliveryPlan:
    """How deliveries are built: delivery operators, consumer device, ranks, and the epoch shuffle's seed."""

    def __init__(
        self, ops: Sequence[Operator], device: torch.device, ranks: int, seed: int | None = None
    ) -> None:
        self.ops, self.device, self.ranks = tuple(ops), device, ranks
        self.generator = torch.Generator()
        self.generator.manual_seed(0 if seed is None else seed)
        # Items drawn from the buffer whose delivery (operators, move) failed: the next draw starts with
        # them, so a consume-once item is never lost to a failing delivery operator. Only the thread that
        # draws (sync: under the scheduler's lock; async: the delivery worker) touches it.
        self.held: Part | None = None

    @property
    def held_items(self) -> int:
        return 0 if self.held is None else self.held.size

    def batches(self, buffer: ExperienceBuffer, request: Request, limit: int) -> int:
        """How many deliveries one draw prepares: up to ``limit`` (consume-once: no more than are available;
        with replacement: no more than one draw of ``buffer.max_batch`` items holds)."""
        if request.minibatch_size is not None:
            return 1
        if buffer.sampler.consumes:
            return max(1, min(limit, (len(buffer) + self.held_items) // request.size))
        return max(1, min(limit, buffer.max_batch // request.size))

    def prepare(
        self,
        buffer: ExperienceBuffer,
        request: Request,
        count: int,
        metrics: Metrics,
        stream: torch.cuda.Stream | None = None,
    ) -> list[Delivery]:
        """``count`` deliveries for ``request`` from one sample, one gather and one move."""
        items, ready = self.draw(buffer, request.size * count, request.version, metrics, stream)
        n = request.size
        return [self.lay_out(items.slice(i * n, (i + 1) * n), request, ready) for i in range(count)]

    def draw(
        self,
        buffer: ExperienceBuffer,
        n: int,
        version: int | None,
        metrics: Metrics,
        stream: torch.cuda.Stream | None = None,
    ) -> tuple[Part, torch.cuda.Event | None]:
        """Sample ``n`` items, run the delivery operators and move them to the consumer device.

        Items held from a failed delivery come first; if the operators or the move fail, the drawn
        items are held again (in order) and the error is raised: nothing drawn is lost.
        """
        with metrics.span("deliver/sample"):
            raw = self._sample(buffer, n, version)
        try:
            batch = run_chain(self.ops, raw.batch, metrics, "deliver")
            ready = None
            if batch.device != self.device:
                batch, ready = self._move(batch, buffer.storage.tier, metrics, stream)
            weights = None if raw.weights is None else raw.weights.to(self.device)
        except BaseException:
            self.held = raw if self.held is None else Part.cat([raw, self.held])
            raise
        return Part(batch, raw.slots, raw.generations, raw.versions, weights), ready

    def _sample(self, buffer: ExperienceBuffer, n: int, version: int | None) -> Part:
        """``n`` raw items: the held ones first, then fresh ones from the buffer."""
        held = self.held
        if held is not None and held.size >= n:
            self.held = held.slice(n, held.size) if held.size > n else None
            return held.slice(0, n) if held.size > n else held
        # slots stay taken until delivered (``release``); raises with ``held`` kept
        s = buffer.sample(n - self.held_items, version=version, hold=True)
        fresh = Part(s.batch, s.slots, s.generations, s.versions, s.weights)
        self.held = None
        return fresh if held is None else Part.cat([held, fresh])

    def lay_out(self, items: Part, request: Request, ready: torch.cuda.Event | None) -> Delivery:
        """Cut ``items`` into the request's per-rank parts."""
        if request.minibatch_size is None:
            parts = items.split(self.ranks) if self.ranks > 1 else [items]
        else:
            assert request.num_minibatches is not None
            if items.size < self.ranks:
                raise ConfigError(
                    f"an epoch delivery of {items.size} items cannot be split over {self.ranks} ranks"
                )
            parts = []
            for share in items.split(self.ranks):
                idx = epoch_index(share.size, request.num_minibatches, request.minibatch_size, self.generator)
                parts.append(share.index(idx.to(share.slots.device)))
        return Delivery(items, parts, request.layout, ready)

    def _move(
        self, batch: ColumnBatch, tier: str, metrics: Metrics, stream: torch.cuda.Stream | None
    ) -> tuple[ColumnBatch, torch.cuda.Event | None]:
        """One copy of the whole batch: consolidate (pinned when going to CUDA), then move."""
        with metrics.span("deliver/move"):
            to_cuda = self.device.type == "cuda"
            packed = batch.consolidate(pin_memory=to_cuda and batch.device.type == "cpu")
            metrics.add_bytes(f"{tier}->{self.device}", packed.nbytes)
            if stream is not None:
                with torch.cuda.stream(stream):
                    moved = packed.to(self.device, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
                return moved.unpack(), event
            return packed.to(self.device, non_blocking=False).unpack(), None


class ReadyQueue:
    """Prepared deliveries in sampling order; serves any request from them without losing an item."""

    def __init__(self) -> None:
        self.entries: collections.deque[Delivery] = collections.deque()
        self.items = 0

    def push(self, deliveries: Sequence[Delivery]) -> None:
        self.entries.extend(deliveries)
        self.items += sum(d.items.size for d in deliveries)

    def take(self, request: Request, plan: DeliveryPlan) -> Delivery | None:
        """The next delivery for ``request``, re-cut from what is prepared; None if too few items are ready."""
        if self.entries and self.entries[0].layout == request.layout:
            d = self.entries.popleft()
            self.items -= d.items.size
            return d
        if self.items < request.size or not self.entries:
            return None
        pieces, got = [], 0
        while got < request.size:
            d = self.entries.popleft()
            d.wait()
            pieces.append(d.items)
            got += d.items.size
        self.items -= got
        merged = Part.cat(pieces)
        if got > request.size:
            rest = merged.slice(request.size, got)
            self.entries.appendleft(Delivery(rest, [rest]))  # no layout: always re-cut
            self.items += rest.size
        return plan.lay_out(merged.slice(0, request.size), request, None)

    def first_slot(self, plan: DeliveryPlan | None = None) -> int | None:
        """The slot of the oldest prepared item, else of ``plan``'s oldest held item (None: neither)."""
        if self.entries:
            return int(self.entries[0].items.slots[0])
        if plan is not None and plan.held is not None:
            return int(plan.held.slots[0])
        return None

    def clear(self) -> None:
        self.entries.clear()
        self.items = 0
