"""One streaming step of the ``conduit`` trainer mode (replaces verl's ``_step_once``).

verl's sync step waits for the whole batch, then runs old-log-prob, ref, values and advantage on
it one stage after another. Here, as soon as ``g_ing`` GRPO groups have finished generating (the
agent loops report each one: ``completion.py``), they run through those stages (Conduit
``Operator``s, one call per piece; a piece takes every group already finished if more than
``g_ing`` are; a piece's TransferQueue writes go out in one put: ``piece_writes.py``) while the
other groups are still generating. Finished groups land in Conduit's grouped FIFO buffer, and
once every group has its old-log-prob (all must come from the pre-update policy), the
mini-batches are handed to ``update_actor``. PPO (GAE): values and the GAE recursion run per
piece, the batch whitening of the advantages once after the last piece (``gae.py``). Exposed time
(DESIGN.md §4) is kept in Conduit's ``Metrics``: ingestion of the last piece and delivery are
exposed; ingestion of earlier pieces overlaps generation.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import ray
import torch

from conduit import ColumnBatch, Metrics, Operator
from conduit.ops.operator import run_chain
from conduit_verl import compat
from conduit_verl.checks import check_groups, check_response_lengths
from conduit_verl.compat import KVBatchMeta, marked_timer
from conduit_verl.delivery import GroupFifo
from conduit_verl.gae import per_piece, uses_gae, whiten_advantages
from conduit_verl.piece_policy import PiecePolicy
from conduit_verl.piece_writes import piece_writes

logger = logging.getLogger(__name__)

#: how often a streaming wait with no reports re-reads TQ's metadata (a lost report, failed groups)
CHANNEL_TIMEOUT_S = 5.0


class _Piece:
    """The piece the ingestion operators are working on (its TransferQueue keys and metrics)."""

    def __init__(self, meta: KVBatchMeta) -> None:
        self.meta = meta
        self.metrics: dict[str, Any] = {}


def _stage(name: str, method: Any, piece: _Piece, timing_raw: dict) -> Operator:
    """A verl stage method as a Conduit operator; verl's timer ``name`` accumulates per piece."""

    def fn(rows: ColumnBatch) -> ColumnBatch:
        with marked_timer(name, timing_raw):
            piece.meta = method(piece.meta, metrics=piece.metrics)
        return rows

    return Operator(name, fn)


def ingest_operators(trainer: Any, piece: _Piece, timing_raw: dict) -> list[Operator]:
    """The per-piece stages verl's ``_step_once`` runs between sampling and the updates."""

    def method(fn: Any) -> Any:
        return functools.partial(fn, trainer)

    ops: list[Operator] = []
    if compat.colocated_reward(trainer):
        ops.append(_stage("reward", method(compat.compute_reward_colocate), piece, timing_raw))
    ops.append(_stage("old_log_prob", method(compat.compute_old_log_prob), piece, timing_raw))
    if compat.uses_reference_policy(trainer):
        ops.append(_stage("ref", method(compat.compute_ref_log_prob), piece, timing_raw))
    if compat.uses_critic(trainer):
        ops.append(_stage("values", method(compat.compute_values), piece, timing_raw))
    adv = method(compat.compute_advantage)
    # GAE: the recursion per piece (per trajectory: exact), the batch whitening after the last piece
    ops.append(_stage("adv", per_piece(adv) if uses_gae(trainer.config) else adv, piece, timing_raw))
    return ops


class GroupWait:
    """Waits for the next piece's groups: on the completion channel, or by re-reading TQ.

    One per trainer (the channel's count runs over the whole job). ``next_piece`` returns how many
    groups to take: at least ``g_ing`` (never over what is left), or every group already finished
    if more, so a piece catches up when generation runs ahead of ingestion; always whole multiples
    of ``unit`` groups (whole inference micro-batches).
    """

    def __init__(self, channel: Any, unit: int = 1, partition_id: str = "train") -> None:
        self.channel = channel
        self.unit = unit
        self.partition_id = partition_id
        self.taken = ray.get(channel.wait.remote(partition_id, 0, 0.0)) if channel is not None else 0
        self.step_first = self.taken

    def next_piece(self, buffer: Any, g_ing: int, remaining: int) -> int:
        want = min(g_ing, remaining)
        ready = self._wait_channel(buffer, want) if self.channel is not None else None
        if ready is None:  # polled: verl's replay-buffer view of TQ (finished prompt groups)
            ready = compat.finished_groups(buffer, self.partition_id)
        return min(remaining, max(want, ready // self.unit * self.unit))

    def _wait_channel(self, buffer: Any, want: int) -> int | None:
        """Block until ``want`` more groups are reported; the number ready (None: channel lost).

        Every ``CHANNEL_TIMEOUT_S`` without enough reports, TQ's metadata is read once: a group
        reported lost, or failed groups (verl's sampler refills them), end the wait there too.
        """
        while True:
            try:
                done = ray.get(
                    self.channel.wait.remote(self.partition_id, self.taken + want, CHANNEL_TIMEOUT_S)
                )
            except ray.exceptions.RayActorError:
                logger.warning("conduit: the completion channel died; waiting for groups by polling TQ")
                self.channel = None
                return None
            if done - self.taken >= want:
                return done - self.taken
            finished = compat.finished_groups(buffer, self.partition_id)
            if finished >= want or compat.any_failed_group(buffer, self.partition_id):
                return finished

    def took(self, groups: int) -> None:
        """``groups`` were sampled out of the replay buffer."""
        self.taken += groups

    def step_finish_times(self, t0_wall: float) -> list[float]:
        """Seconds from ``t0_wall`` at which this step's groups finished (empty when polled)."""
        if self.channel is None:
            return []
        count, since, self.step_first = self.taken - self.step_first, self.step_first, self.taken
        try:
            times = ray.get(self.channel.finish_times.remote(self.partition_id, since))[:count]
        except ray.exceptions.RayActorError:
            self.channel = None
            return []
        return [t - t0_wall for t in times]


def merge_metrics(parts: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Sample-weighted mean of numeric metrics over pieces (others: the last value)."""
    out: dict[str, Any] = {}
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}
    for size, metrics in parts:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0.0) + float(value) * size
                weights[key] = weights.get(key, 0) + size
            else:
                out[key] = value
    out.update({k: sums[k] / max(weights[k], 1) for k in sums})
    return out


def stream_step(trainer: Any, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
    """Sample, ingest and deliver one step's ``sample_batch_size`` prompt groups, streaming."""
    cfg = trainer.conduit_config
    conf = trainer.config
    n = int(conf.actor_rollout_ref.rollout.n)
    max_response = int(conf.actor_rollout_ref.rollout.response_length)
    m: Metrics = trainer.conduit_metrics
    fifo: GroupFifo = trainer.conduit_fifo
    version = compat.global_step(trainer)
    buffer = compat.replay_buffer(trainer)
    parts: list[tuple[int, dict[str, Any]]] = []
    t0, t0_wall = time.perf_counter(), time.time()
    taken = 0
    waiter: GroupWait = trainer.conduit_wait
    policy: PiecePolicy = trainer.conduit_policy
    g_ing = policy.begin_step(t0)
    with compat.poll_interval(buffer, cfg.stream_poll_s):
        compat.on_sample_begin(trainer)
        while taken < sample_batch_size:
            with m.span("wait_rollout"):
                want = waiter.next_piece(buffer, g_ing, sample_batch_size - taken)
                meta, off_policy = compat.sample_groups(buffer, version, "train", want)
            waiter.took(want)
            taken += want
            last = taken >= sample_batch_size
            if last:
                timing_raw["gen"] = time.perf_counter() - t0
            meta.extra_info["temperature"] = conf.actor_rollout_ref.rollout.temperature
            check_response_lengths(meta.keys, meta.tags, max_response)
            check_groups(meta.keys, meta.tags, n)
            piece = _Piece(meta)
            piece.metrics.update(off_policy)
            t_piece = time.perf_counter()
            with m.span("ingest_tail" if last else "ingest", exposed=last):
                trainer.conduit_in_piece = True
                try:
                    piece.meta = compat.balance_batch(trainer, piece.meta, piece.metrics)
                finally:
                    trainer.conduit_in_piece = False
                rows = ColumnBatch({"row": torch.arange(len(piece.meta))})
                with piece_writes(piece.meta) as writes:
                    run_chain(ingest_operators(trainer, piece, timing_raw), rows, m, "ingest")
                m.incr("tq_puts_saved", writes.puts_saved)
                groups = check_groups(piece.meta.keys, piece.meta.tags, n)
                fifo.put(piece.meta, groups, version)
            policy.record_piece(want, time.perf_counter() - t_piece)
            parts.append((len(piece.meta), piece.metrics))
            m.set_gauge("ready_samples", len(fifo))
    compat.on_sample_end(trainer)
    policy.record_step(waiter.step_finish_times(t0_wall))
    metrics.update(merge_metrics(parts))
    metrics["conduit/pieces"] = len(parts)
    metrics["conduit/g_ing"] = g_ing
    metrics["conduit/streamed"] = float(g_ing < sample_batch_size)
    batch = fifo.all_samples()
    batch.extra_info = dict(fifo.pieces[0].extra_info or {})
    if uses_gae(conf):
        # verl whitens GAE advantages over the whole batch: once, after the last piece (exposed)
        with m.span("whiten", exposed=True), marked_timer("adv", timing_raw):
            whiten_advantages(batch)
    deliver(trainer, fifo, batch, metrics, timing_raw, version)
    fifo.reset()
    metrics.update({f"conduit/{k}": v for k, v in m.end_iteration().items()})
    return batch


def deliver(
    trainer: Any, fifo: GroupFifo, batch: KVBatchMeta, metrics: dict, timing_raw: dict, version: int
) -> None:
    """Critic update on the whole batch, then the actor's mini-batches from the FIFO, in order."""
    conf = trainer.config
    m: Metrics = trainer.conduit_metrics
    if compat.uses_critic(trainer):
        with marked_timer("update_critic", timing_raw):
            compat.update_critic(trainer, batch, metrics)
    update = conf.trainer.critic_warmup <= compat.global_step(trainer)
    n = int(conf.actor_rollout_ref.rollout.n)
    mini = int(conf.actor_rollout_ref.actor.ppo_mini_batch_size) * n
    per_call = mini * trainer.conduit_config.g_del if trainer.conduit_config.g_del else len(fifo)
    metrics["conduit/t_update_start_wall"] = time.time()
    calls: list[tuple[int, dict[str, Any]]] = []
    while len(fifo):
        with m.span("deliver", exposed=True):
            mb = fifo.take(min(per_call, len(fifo)), version)
            mb.extra_info = dict(batch.extra_info or {})
        if update:
            out: dict[str, Any] = {}
            with marked_timer("update_actor", timing_raw):
                compat.update_actor(trainer, mb, out)
            calls.append((len(mb), out))
    metrics.update(merge_metrics(calls))
    metrics["conduit/update_calls"] = len(calls)
