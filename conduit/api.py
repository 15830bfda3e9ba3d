"""The public surface a framework calls: ``Conduit`` = buffer + ingestion + delivery + metrics."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from tensordict import TensorDictBase

from conduit.batch import ColumnBatch, validate
from conduit.buffer.buffer import check_size
from conduit.buffer.tiers import check_tier_available
from conduit.build_buffer import build_buffer
from conduit.config import BufferConfig, SchedulerConfig
from conduit.errors import (
    CheckpointError,
    ClosedError,
    ConfigError,
    SchemaError,
    ShapeError,
    VersionError,
)
from conduit.metrics import Metrics
from conduit.ops.delivery import MAX_EPOCHS, Delivery, DeliveryPlan, Part, Request
from conduit.ops.operator import Operator
from conduit.persist.checkpoint import CheckpointReport, covered_items, load_checkpoint, save_checkpoint
from conduit.persist.journal import Journal, open_journal, replay
from conduit.scheduler import BackgroundScheduler, InlineScheduler, Scheduler
from conduit.schema import Schema

T = TypeVar("T")


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
        self.scheduler_config = scheduler or SchedulerConfig()
        self.device = torch.device(device)
        check_tier_available(str(self.device) if self.device.type == "cuda" else "host")
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ConfigError(f"ranks must be an int >= 1, got {ranks!r}")
        self.schema = schema
        self.ranks = ranks
        self.metrics = metrics or Metrics()
        reader = str(self.device) if self.device.type == "cuda" else "host"
        self.buffer = build_buffer(
            self.buffer_config, stored_schema or schema, self.metrics, seed=seed, reader=reader
        )
        plan = DeliveryPlan(tuple(deliver), self.device, ranks, seed)
        kind = BackgroundScheduler if self.scheduler_config.overlap == "async" else InlineScheduler
        self._scheduler: Scheduler = kind(self.buffer, tuple(ingest), plan, self.scheduler_config)
        self._closed = False
        self._put_version: int | None = None
        self._get_version: int | None = None
        self._version_lock = threading.Lock()
        self.journal: Journal | None = None
        if self.buffer_config.journal is not None:  # durable experience: recover what it holds, then append
            try:
                self.journal = open_journal(self.buffer, self.buffer_config.journal)
            except BaseException:
                self._scheduler.stop()  # no worker outlives a failed construction
                raise
            self._put_version = self.buffer.last_version  # puts go on from the replayed experience
        # Dropped without close(): stop the workers (they hold the scheduler, never the Conduit) and
        # flush the journal, so neither the threads nor the buffer outlive the Conduit.
        self._finalizer = weakref.finalize(self, _release, self._scheduler, self.journal)

    @property
    def timeout_s(self) -> float:
        return self.buffer_config.rate_limit.timeout_s

    def put(self, batch: ColumnBatch | TensorDictBase, version: int = 0) -> None:
        """Hand over a rollout fragment written by policy ``version`` (validated before it is queued).

        ``batch`` is a :class:`ColumnBatch` or a ``TensorDict`` with batch size ``[N]`` (verl's and
        TorchRL's carrier; jagged nested tensors become ragged columns, without a copy).

        Raises a :class:`~conduit.errors.SchemaError` subclass on a schema mismatch,
        :class:`~conduit.errors.CapacityError` for a write larger than the buffer (or not whole groups:
        :class:`~conduit.errors.ShapeError`), :class:`~conduit.errors.VersionError` for a version older
        than the last put — in both overlap modes, before anything is queued or stored.
        """
        self._check_open()
        with self.metrics.span("put", exposed=True):
            if isinstance(batch, TensorDictBase):
                batch = ColumnBatch.from_tensordict(batch)
            if not isinstance(batch, ColumnBatch):
                raise SchemaError(f"put() takes a ColumnBatch or a TensorDict, got {type(batch).__name__}")
            validate(self.schema, batch, self.buffer.nonfinite)  # counted once, when stored
            self.buffer.writer.check(batch.size)  # ingestion operators keep the item count
            with self._version_lock:
                self._put_version = _advance(self._put_version, version, "put")
            self._scheduler.put(batch, version, self.timeout_s)

    def flush(self) -> None:
        """Block until every fragment put so far is in the buffer (an on-policy iteration boundary)."""
        self._check_open()
        with self.metrics.span("flush", exposed=True):
            self._scheduler.flush(self.timeout_s)

    def get(self, batch_size: int, version: int | None = None) -> Delivery:
        """A training-ready batch of ``batch_size`` items on ``device`` (async: prepared ahead).

        ``delivery.parts[r]`` is rank ``r``'s share, with its own slots and weights. ``batch_size`` must be
        an int in ``[1, buffer.max_batch]`` (the capacity; with replacement, or the items 1 GiB holds if
        that is more): else :class:`~conduit.errors.ConfigError` naming it (a consume-once buffer:
        :class:`~conduit.errors.CapacityError`), raised here in both overlap modes.
        """
        return self._get(Request(batch_size, self._consumer(version)))

    def get_epochs(
        self,
        size: int,
        *,
        num_epochs: int,
        minibatch_size: int | None = None,
        num_minibatches: int | None = None,
        version: int | None = None,
    ) -> Delivery:
        """``size`` items laid out for ``num_epochs`` epochs of minibatches (PPO), prepared like ``get``.

        Each rank gets a contiguous share of the items; ``delivery.parts[r]`` holds that share's rows in
        minibatch order — ``num_minibatches`` slices of ``minibatch_size`` rows, a fresh permutation per
        epoch. ``minibatch_size`` defaults to the largest share (one minibatch per epoch);
        ``num_minibatches`` to ``ceil(num_epochs * share / minibatch_size)`` (pass it to keep several
        buffers in step). ``size`` is bounded as in ``get`` (``buffer.max_batch``), the layout to
        :data:`~conduit.ops.delivery.MAX_EPOCHS` passes over each share.
        """
        check_size(size, "get_epochs")
        check_size(num_epochs, "get_epochs num_epochs")
        if size < self.ranks:  # checked before drawing: a refused layout must not consume items
            raise ConfigError(f"an epoch delivery of {size} items cannot be split over {self.ranks} ranks")
        share = -(-size // self.ranks)
        mb = share if minibatch_size is None else minibatch_size
        check_size(mb, "get_epochs minibatch_size")
        k = -(-num_epochs * share // mb) if num_minibatches is None else num_minibatches
        check_size(k, "get_epochs num_minibatches")
        if k * mb > MAX_EPOCHS * share:  # the layout's rows are allocated per rank: bounded first
            raise ConfigError(
                f"get_epochs: {k} minibatches of {mb} rows are {k * mb} rows per rank, more than "
                f"{MAX_EPOCHS} passes over its {share} items allow; lay out at most {MAX_EPOCHS * share}"
            )
        return self._get(Request(size, self._consumer(version), mb, k))

    @property
    def shuffle_generator(self) -> torch.Generator:
        """The generator of ``get_epochs``' permutations (saved in :meth:`state_dict`)."""
        return self._scheduler.plan.generator

    def _get(self, request: Request) -> Delivery:
        self._check_open()
        self.buffer.check_batch(request.size, "get")  # in the caller, before a worker draws or allocates
        with self.metrics.span("get", exposed=True):
            delivery = self._scheduler.get(request, self.timeout_s)
            delivery.wait()
            self.buffer.release(request.size)  # delivered: a consume-once buffer may reuse the slots
            if self.journal is not None:  # consume-once: how far deliveries reached survives a restart
                self.journal.delivered(delivery.generations, self.buffer.inserted)
            return delivery

    def _consumer(self, version: int | None) -> int | None:
        if version is None:
            return None
        with self._version_lock:
            self._get_version = _advance(self._get_version, version, "get")
        return version

    def update_priorities(self, delivery: Delivery | Part, priorities: torch.Tensor) -> None:
        """Send new priorities for ``delivery``'s (or one rank part's) items back.

        Sync: applied now. Async: queued and applied by the delivery worker before its next sample.
        Either way an item whose slot was overwritten since it was sampled keeps its new occupant's
        priority (counted as ``count/priority_updates_skipped``). Bad updates (shape, NaN/inf, slots
        outside the buffer, a sampler without priorities) raise before anything is queued.
        """
        self.update_priorities_at(delivery.slots, delivery.generations, priorities)

    def update_priorities_at(
        self, slots: torch.Tensor, generations: torch.Tensor, priorities: torch.Tensor
    ) -> None:
        """:meth:`update_priorities` for raw ``slots``/``generations`` (e.g. several deliveries merged)."""
        self._check_open()
        if not isinstance(priorities, torch.Tensor):
            raise ShapeError(f"priorities must be a tensor, got {type(priorities).__name__}")
        priorities = priorities.detach().flatten().to("cpu")
        with self.metrics.span("update_priorities", exposed=True):
            self._scheduler.update_priorities(
                slots, generations, priorities
            )  # checked before anything changes

    def end_iteration(self) -> dict[str, float]:
        """This iteration's metrics (exposed_s, per-operator seconds, bytes, queues), then reset."""
        return self.metrics.end_iteration()

    def state_dict(self) -> dict[str, object]:
        """Everything needed to resume: contents, priorities (queued updates applied), counters, and the
        items sampled but not yet delivered (they count as unconsumed), with ingestion flushed first."""
        return self.snapshot(lambda first, runtime: {"buffer": self.buffer.state_dict(first), **runtime})

    def snapshot(self, fn: Callable[[int | None, dict[str, object]], T]) -> T:
        """``fn(first_undelivered, runtime)`` run with ingestion flushed and delivery paused (how
        :meth:`state_dict` and ``conduit.persist`` take a consistent state); ``runtime`` is the state
        kept outside the buffer (delivery generator, versions)."""
        self._check_open()
        return self._scheduler.quiesced(
            lambda first: fn(
                first,
                {
                    "delivery": {"generator": self._scheduler.plan.generator.get_state()},
                    "versions": {"put": self._put_version, "get": self._get_version},
                },
            ),
            self.timeout_s,
        )

    def save(self, directory: str | os.PathLike[str]) -> CheckpointReport:
        """Save a checkpoint under ``directory`` in Conduit's safe format (occupied slots only, only what
        changed since the previous one; see :func:`conduit.persist.save_checkpoint`). With a journal,
        once the checkpoint is durable, the journal files the kept checkpoints hold are removed."""
        report = save_checkpoint(self, directory)
        if self.journal is not None:
            self.journal.prune(covered_items(directory), directory)
        return report

    def load(self, directory: str | os.PathLike[str]) -> str:
        """Restore the newest intact checkpoint under ``directory``, then the journal's later records (if
        a journal is configured); returns the checkpoint's path. Raises ``CheckpointError``, unchanged,
        when nothing intact fits."""
        path = load_checkpoint(self, directory)
        if self.buffer_config.journal is not None:
            replay(self.buffer_config.journal.path, self)
            last = self.buffer.last_version
            if last is not None and (self._put_version is None or last > self._put_version):
                self._put_version = last
        return path

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict` (checked first: a state of another shape raises ``CheckpointError``)."""
        self._check_open()
        if not isinstance(state, dict) or "buffer" not in state:
            raise CheckpointError(
                f"not a Conduit state: expected a dict with 'buffer', got {type(state).__name__}"
            )

        generator, versions = _runtime_state(state)  # checked before anything changes

        def load(first: int | None) -> None:
            # checks everything, then loads
            self.buffer.load_state_dict(state["buffer"])  # type: ignore[arg-type]
            self._scheduler.discard_prepared()  # prepared items belonged to the replaced contents
            if generator is not None:
                self._scheduler.plan.generator.set_state(generator)
            if versions is not None:
                self._put_version, self._get_version = versions

        self._scheduler.quiesced(load, self.timeout_s)

    def close(self, drain: bool = True) -> None:
        """Stop the workers; with ``drain`` every queued fragment is ingested first.

        Raises :class:`~conduit.errors.ConduitError` if ``drain`` could not ingest everything (e.g. a
        consume-once buffer full of undelivered items); the workers are stopped either way.
        """
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            self._scheduler.close(drain, self.timeout_s)
        finally:
            if self.journal is not None:
                self.journal.close()

    def __enter__(self) -> Conduit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("Conduit was used after close()")


def _release(scheduler: Scheduler, journal: Journal | None) -> None:
    """What a Conduit dropped without ``close()`` does: signal its workers to end, close its journal."""
    scheduler.stop()
    if journal is not None:
        journal.close()


def _runtime_state(
    state: dict[str, object],
) -> tuple[torch.Tensor | None, tuple[int | None, int | None] | None]:
    """The delivery generator's state and the ``(put, get)`` versions of a Conduit state, checked:
    :class:`CheckpointError` naming what is wrong, before anything is loaded."""
    generator = None
    delivery = state.get("delivery")
    if isinstance(delivery, dict) and delivery.get("generator") is not None:
        generator = delivery["generator"]
        try:
            torch.Generator().set_state(generator)  # a scratch generator: the state must fit one
        except (TypeError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"the delivery generator's state does not load: {e}") from e
    versions = state.get("versions")
    if versions is None:
        return generator, None
    if not isinstance(versions, dict):
        raise CheckpointError(f"versions must be a dict, got {type(versions).__name__}")
    put, get = versions.get("put"), versions.get("get")
    for name, v in (("put", put), ("get", get)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise CheckpointError(f"versions[{name!r}] must be a count >= 0 or None, got {v!r}")
    return generator, (put, get)


def _advance(last: int | None, version: int, who: str) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise VersionError(f"{who}: version must be an int, got {version!r}")
    if last is not None and version < last:
        raise VersionError(
            f"{who}: policy version went backwards ({last} -> {version}); versions never decrease"
        )
    return version
