"""Delivery: sample → gather → operators (collate / pack) → move to the consumer device → split per rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from conduit.batch import ColumnBatch
from conduit.buffer.buffer import ExperienceBuffer, Sample
from conduit.metrics import Metrics
from conduit.ops.operator import Operator, run_chain


@dataclass
class Delivery:
    """One training-ready mini-batch, with what is needed to send priorities back.

    ``parts`` holds the batch split into one contiguous part per consumer rank.
    """

    batch: ColumnBatch
    slots: torch.Tensor
    generations: torch.Tensor
    versions: torch.Tensor
    weights: torch.Tensor | None
    parts: list[ColumnBatch]
    ready: torch.cuda.Event | None = field(default=None, repr=False)

    def wait(self) -> None:
        """Make the current CUDA stream wait for the copy that produced this delivery."""
        if self.ready is not None:
            torch.cuda.current_stream().wait_event(self.ready)


@dataclass(frozen=True)
class DeliveryPlan:
    """How deliveries are built; ``prepare`` makes ``g_del`` of them with one sample and one gather."""

    ops: Sequence[Operator]
    device: torch.device
    ranks: int

    def prepare(
        self,
        buffer: ExperienceBuffer,
        batch_size: int,
        g_del: int,
        metrics: Metrics,
        version: int | None = None,
        stream: torch.cuda.Stream | None = None,
    ) -> list[Delivery]:
        with metrics.span("deliver/sample"):
            sample = buffer.sample(batch_size * g_del, version=version)
        batch = run_chain(self.ops, sample.batch, metrics, "deliver")
        ready = None
        if batch.device != self.device:
            batch, ready = self._move(batch, buffer.storage.tier, metrics, stream)
        return [self._slice(sample, batch, i * batch_size, (i + 1) * batch_size, ready) for i in range(g_del)]

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

    def _slice(
        self, sample: Sample, batch: ColumnBatch, lo: int, hi: int, ready: torch.cuda.Event | None
    ) -> Delivery:
        part = batch.slice(lo, hi)
        return Delivery(
            batch=part,
            slots=sample.slots[lo:hi],
            generations=sample.generations[lo:hi],
            versions=sample.versions[lo:hi],
            weights=None if sample.weights is None else sample.weights[lo:hi].to(self.device),
            parts=part.split(self.ranks) if self.ranks > 1 else [part],
            ready=ready,
        )
