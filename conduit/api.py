"""The public surface a framework calls: ``Conduit`` = buffer + ingestion + delivery + metrics."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conduit.batch import ColumnBatch, validate
from conduit.buffer.buffer import ExperienceBuffer
from conduit.buffer.tiers import check_tier_available
from conduit.config import BufferConfig, SchedulerConfig
from conduit.errors import ClosedError, ConfigError, ShapeError
from conduit.metrics import Metrics
from conduit.ops.delivery import Delivery, DeliveryPlan
from conduit.ops.operator import Operator, run_chain
from conduit.scheduler import AsyncIngestor, Prefetcher
from conduit.schema import Schema


class Conduit:
    """The experience data plane for one stream of experience.

    A framework registers its ingestion operators (run on the way in) and delivery operators (run
    on sampled batches on the way out); ``put`` hands over rollout fragments and ``get`` returns
    training-ready batches on ``device``, split over ``ranks``. With ``overlap="sync"`` everything
    runs inline (the native path's behaviour); with ``"async"`` ingestion and delivery run on
    background workers and ``get`` returns a batch prepared ahead of time.

    Example:
        >>> schema = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
        >>> c = Conduit(schema, BufferConfig(capacity=10_000), SchedulerConfig(overlap="async"))
        >>> c.put(ColumnBatch({"obs": torch.randn(64, 4), "reward": torch.randn(64)}))
        >>> d = c.get(32)           # d.batch, d.slots, d.weights, d.parts
        >>> metrics = c.end_iteration()  # {"exposed_s": ..., "op/get_s": ..., ...}
    """

    def __init__(
        self,
        schema: Schema,
        buffer: BufferConfig | None = None,
        scheduler: SchedulerConfig | None = None,
        ingest: Sequence[Operator] = (),
        deliver: Sequence[Operator] = (),
        device: torch.device | str = "cpu",
        ranks: int = 1,
        stored_schema: Schema | None = None,
        seed: int | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """Args:
        schema: what ``put`` accepts (validated on every put).
        stored_schema: what the buffer stores after the ingestion operators (default: ``schema``).
        device: where ``get`` delivers; ranks: consumer ranks each delivery is split over.
        """
        self.buffer_config = buffer or BufferConfig()
        self.scheduler = scheduler or SchedulerConfig()
        self.device = torch.device(device)
        check_tier_available(str(self.device) if self.device.type == "cuda" else "host")
        if ranks < 1:
            raise ConfigError(f"ranks must be >= 1, got {ranks}")
        self.schema = schema
        self.metrics = metrics or Metrics()
        self.buffer = ExperienceBuffer(stored_schema or schema, self.buffer_config, self.metrics, seed=seed)
        self.ingest_ops = tuple(ingest)
        self.plan = DeliveryPlan(tuple(deliver), self.device, ranks)
        self._closed = False
        self._ingestor: AsyncIngestor | None = None
        self._prefetcher: Prefetcher | None = None
        if self.scheduler.overlap == "async":
            s = self.scheduler
            self._ingestor = AsyncIngestor(self.buffer, self.ingest_ops, s.g_ing, s.depth, self.metrics)
            error_mode = self.buffer_config.rate_limit.mode == "error"
            self._prefetcher = Prefetcher(self.buffer, self.plan, s.g_del, s.depth, self.metrics, error_mode)
            self._ingestor.start()
            self._prefetcher.start()
        self._ready_sync: list[Delivery] = []

    @property
    def timeout_s(self) -> float:
        return self.buffer_config.rate_limit.timeout_s

    def put(self, batch: ColumnBatch, version: int = 0) -> None:
        """Hand over a rollout fragment written by policy ``version`` (validated before it is queued)."""
        self._check_open()
        with self.metrics.span("put", exposed=True):
            validate(self.schema, batch)
            if self._ingestor is not None:
                self._ingestor.put(batch, version, self.timeout_s)
            else:
                self.buffer.extend(run_chain(self.ingest_ops, batch, self.metrics, "ingest"), version=version)

    def flush(self) -> None:
        """Block until every fragment put so far is in the buffer (an on-policy iteration boundary)."""
        self._check_open()
        if self._ingestor is not None:
            with self.metrics.span("flush", exposed=True):
                self._ingestor.flush(self.timeout_s)

    def get(self, batch_size: int, version: int | None = None) -> Delivery:
        """A training-ready batch of ``batch_size`` items on ``device`` (async: prepared ahead)."""
        self._check_open()
        with self.metrics.span("get", exposed=True):
            if self._prefetcher is not None:
                delivery = self._prefetcher.get(batch_size, version, self.timeout_s)
            else:
                if not self._ready_sync or self._ready_sync[0].batch.size != batch_size:
                    self._ready_sync = self.plan.prepare(
                        self.buffer, batch_size, self.scheduler.g_del, self.metrics, version
                    )
                delivery = self._ready_sync.pop(0)
            delivery.wait()
            return delivery

    def update_priorities(self, delivery: Delivery, priorities: torch.Tensor) -> None:
        """Send new priorities for ``delivery``'s items back.

        Sync: applied now. Async: queued and applied by the delivery worker before its next sample.
        Either way an item whose slot was overwritten since it was sampled keeps its new occupant's
        priority (counted as ``count/priority_updates_skipped``).
        """
        self.update_priorities_at(delivery.slots, delivery.generations, priorities)

    def update_priorities_at(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        """:meth:`update_priorities` for raw ``slots``/``generations`` (e.g. several deliveries merged)."""
        self._check_open()
        priorities = priorities.detach().flatten()
        if priorities.shape != slots.shape or generations.shape != slots.shape:
            raise ShapeError(
                f"{priorities.numel()} priorities and {generations.numel()} generations for {slots.numel()} slots"
            )
        with self.metrics.span("update_priorities", exposed=True):
            if self._prefetcher is not None:
                self._prefetcher.update_priorities(slots, generations, priorities.to("cpu"))
            else:
                self.buffer.update_priorities(slots, generations, priorities)

    def end_iteration(self) -> dict[str, float]:
        """This iteration's metrics (exposed_s, per-operator seconds, bytes, queues), then reset."""
        return self.metrics.end_iteration()

    def state_dict(self) -> dict[str, object]:
        """The buffer's contents, priorities and counters (flush first so nothing queued is missed)."""
        self.flush()
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.buffer.load_state_dict(state["buffer"])  # type: ignore[arg-type]

    def close(self, drain: bool = True) -> None:
        """Stop the workers; with ``drain`` every queued fragment is ingested first."""
        if self._closed:
            return
        if drain and self._ingestor is not None and self._ingestor.error is None:
            self._ingestor.flush(self.timeout_s)
        self._closed = True
        for worker in (self._prefetcher, self._ingestor):
            if worker is not None:
                worker.stop()
        self.buffer.close()

    def __enter__(self) -> Conduit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("Conduit was used after close()")
