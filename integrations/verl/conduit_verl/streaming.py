"""One streaming step of the ``conduit`` trainer mode (replaces verl's ``_step_once``).

verl's sync step waits for the whole batch, then runs old-log-prob, ref, values and advantage on
it one stage after another. Here, as soon as ``piece_groups`` GRPO groups have finished generating
(the agent loops report each one: ``completion.py``), they run through those stages (verl's own
stage methods, one call each per piece: :func:`run_stages`; a piece takes every group already
finished if more than ``piece_groups`` are; a piece's TransferQueue writes go out in one put:
``piece_writes.py``) while the other groups are still generating. Each ingested piece is put into a
Conduit (``delivery.py``), and once every group has its old-log-prob (all must come from the
pre-update policy), the mini-batches it delivers are handed to ``update_actor``. PPO (GAE): values
and the GAE recursion run per piece, the batch whitening of the advantages once after the last
piece (``gae.py``). Exposed time (DESIGN.md §4) is kept in Conduit's ``Metrics``: ingestion of the
last piece and delivery are exposed; ingestion of earlier pieces overlaps generation. Every sampled
group's weight versions go through the staleness ledger (``staleness.py``: checked against
``max_staleness``, reported).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from conduit import Metrics
from conduit.ops.operator import failure_named
from conduit.piece_policy import PiecePolicy
from conduit_verl import compat
from conduit_verl.checks import check_groups, check_response_lengths
from conduit_verl.compat import KVBatchMeta, marked_timer
from conduit_verl.delivery import GroupFifo
from conduit_verl.early_rows import EarlyRows
from conduit_verl.gae import per_piece, uses_gae, whiten_advantages
from conduit_verl.group_wait import GroupWait
from conduit_verl.piece_writes import piece_writes
from conduit_verl.staleness import StalenessLedger


class _Piece:
    """A piece being ingested: its TransferQueue keys (replaced by each stage's result) and metrics."""

    def __init__(self, meta: KVBatchMeta) -> None:
        self.meta = meta
        self.metrics: dict[str, Any] = {}


#: a verl stage: ``(name, fn)``, ``fn(meta, metrics=...)`` returns the piece's keys with its new fields
Stage = tuple[str, Callable[..., KVBatchMeta]]


def sample_stages(trainer: Any) -> list[Stage]:
    """The stages that need one response each (not its group): a colocated reward, old log-probs,
    reference log-probs, values."""
    stages: list[Stage] = []
    if compat.colocated_reward(trainer):
        stages.append(("reward", functools.partial(compat.compute_reward_colocate, trainer)))
    stages.append(("old_log_prob", functools.partial(compat.compute_old_log_prob, trainer)))
    if compat.uses_reference_policy(trainer):
        stages.append(("ref", functools.partial(compat.compute_ref_log_prob, trainer)))
    if compat.uses_critic(trainer):
        stages.append(("values", functools.partial(compat.compute_values, trainer)))
    return stages


def advantage_stage(trainer: Any) -> Stage:
    """The group stage: advantages (GAE: the recursion per piece, per trajectory: exact; the batch
    whitening after the last piece)."""
    adv = functools.partial(compat.compute_advantage, trainer)
    return ("adv", per_piece(adv) if uses_gae(trainer.config) else adv)


def run_stages(stages: list[Stage], piece: _Piece, timing_raw: dict, m: Metrics) -> int:
    """Run ``stages`` on ``piece`` in order, each timed as ``ingest/<name>`` (and by verl's timer
    ``name``), with the piece's TransferQueue writes in one put; the puts saved. A failing stage
    raises :class:`~conduit.errors.OperatorError` naming it."""
    with piece_writes(piece.meta) as writes:
        for name, fn in stages:
            with m.span(f"ingest/{name}"), marked_timer(name, timing_raw):
                with failure_named(f"verl stage {name!r} failed on a piece of {len(piece.meta)} samples"):
                    piece.meta = fn(piece.meta, metrics=piece.metrics)
    return writes.puts_saved


def _balanced(trainer: Any, meta: KVBatchMeta, metrics: dict) -> KVBatchMeta:
    """verl's balance over the data-parallel ranks, padded only to a multiple of the ranks."""
    trainer.conduit_in_piece = True
    try:
        return compat.balance_batch(trainer, meta, metrics)
    finally:
        trainer.conduit_in_piece = False


def _tokens(tags: Iterable[dict[str, Any]]) -> int:
    """Tokens of the responses with ``tags`` (their ``seq_len``; 1 where untagged)."""
    return sum(int(tag.get("seq_len", 1)) for tag in tags)


def ingest_piece(trainer: Any, piece: _Piece, timing_raw: dict, m: Metrics) -> tuple[int, int]:
    """Run a group piece's stages (with early rows, the per-sample ones only on its rows not yet
    done); (TransferQueue puts saved, tokens the per-sample stages ran on)."""
    early: EarlyRows | None = trainer.conduit_early
    if early is None or not early.active:
        stages = [*sample_stages(trainer), advantage_stage(trainer)]
        return run_stages(stages, piece, timing_raw, m), _tokens(piece.meta.tags)
    saved = tokens = 0
    rest = early.rest(piece.meta)
    if rest is not None:
        part = _Piece(rest)
        saved += run_stages(sample_stages(trainer), part, timing_raw, m)
        piece.metrics.update(part.metrics)
        tokens = _tokens(rest.tags)
    return saved + run_stages([advantage_stage(trainer)], piece, timing_raw, m), tokens


def early_ingestion(
    trainer: Any, timing_raw: dict, m: Metrics, parts: list[tuple[int, dict[str, Any]]]
) -> Callable[[KVBatchMeta], None]:
    """What :class:`EarlyRows` runs on responses whose groups have not finished: the per-sample
    stages (overlapped with generation), their metrics added to the step's ``parts``."""

    def run(meta: KVBatchMeta) -> None:
        t0 = time.perf_counter()
        with m.span("ingest_early"):
            part = _Piece(_balanced(trainer, meta, {}))
            m.incr("tq_puts_saved", run_stages(sample_stages(trainer), part, timing_raw, m))
        trainer.conduit_policy.record_rows(time.perf_counter() - t0, _tokens(part.meta.tags))
        parts.append((len(part.meta), part.metrics))

    return run


#: the replay buffer's per-sample-call counts (groups evicted, surplus discarded): summed over pieces
COUNT_SUFFIXES = ("/evicted_samples", "/discarded_surplus_samples")


def merge_metrics(parts: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Sample-weighted mean of numeric metrics over pieces (others: the last value); the replay
    buffer's eviction counts are summed, the extremes of its evicted groups' staleness kept."""
    out: dict[str, Any] = {}
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}
    for size, metrics in parts:
        for key, value in metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                out[key] = value
            elif key.endswith(COUNT_SUFFIXES):
                out[key] = out.get(key, 0) + value
            elif key.endswith(("_staleness/max", "_staleness/min")):
                pick = max if key.endswith("max") else min
                out[key] = pick(out.get(key, value), value)
            else:
                sums[key] = sums.get(key, 0.0) + float(value) * size
                weights[key] = weights.get(key, 0) + size
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
    ledger: StalenessLedger = trainer.conduit_staleness
    piece_groups = policy.begin_step(t0)
    early: EarlyRows | None = trainer.conduit_early
    if early is not None:
        # early rows belong to streaming: a whole-batch step (the policy's "whole" arm) is verl's
        # schedule, so the policy's two arms are streaming with early rows vs none of it
        early.begin_step(active=piece_groups < sample_batch_size)
    if early is not None and early.active:
        run_early = early_ingestion(trainer, timing_raw, m, parts)
        info = {"temperature": conf.actor_rollout_ref.rollout.temperature}
        waiter.idle = lambda: early.ingest(version, info, run_early)
    with compat.poll_interval(buffer, cfg.stream_poll_s):
        compat.on_sample_begin(trainer)
        while taken < sample_batch_size:
            with m.span("wait_rollout"):
                want = waiter.next_piece(buffer, piece_groups, sample_batch_size - taken)
                if want == 0:  # on_timeout=drop with nothing more finished: end with what was taken
                    break
                meta, off_policy = compat.sample_groups(buffer, version, "train", want)
            stale_evicted, evicted = compat.evicted_groups(off_policy)
            waiter.took(want + evicted)  # evicted groups had finished too: the channel counted them
            ledger.dropped(stale_evicted)
            ledger.admit(meta.keys, meta.tags, version)
            taken += want
            last = taken >= sample_batch_size or waiter.short
            if last:
                timing_raw["gen"] = time.perf_counter() - t0
            meta.extra_info["temperature"] = conf.actor_rollout_ref.rollout.temperature
            check_response_lengths(meta.keys, meta.tags, max_response)
            check_groups(meta.keys, meta.tags, n)
            piece = _Piece(meta)
            piece.metrics.update(off_policy)
            t_piece = time.perf_counter()
            with m.span("ingest_tail" if last else "ingest", exposed=last):
                piece.meta = _balanced(trainer, piece.meta, piece.metrics)
                saved, ran = ingest_piece(trainer, piece, timing_raw, m)
                m.incr("tq_puts_saved", saved)
                groups = check_groups(piece.meta.keys, piece.meta.tags, n)
                fifo.put(piece.meta, groups, version)
            work = [_tokens(piece.meta.tags[r] for r in g) for g in groups]
            policy.record_piece(
                want, time.perf_counter() - t_piece, overlapped=not last, work=work, tokens=ran
            )
            parts.append((len(piece.meta), piece.metrics))
            m.set_gauge("ready_samples", len(fifo))
            if last:
                break
    timing_raw.setdefault("gen", time.perf_counter() - t0)
    compat.on_sample_end(trainer)
    # groups generated ahead (max_staleness >= 1) may have finished before the step began: ready at 0
    finish = [max(0.0, f) for f in waiter.step_finish_times(t0_wall)]
    policy.record_step(finish, ended=time.perf_counter() - t0)
    metrics.update(merge_metrics(parts))
    metrics["conduit/pieces"] = len(parts)
    metrics["conduit/piece_groups"] = piece_groups
    metrics["conduit/streamed"] = float(piece_groups < sample_batch_size)
    metrics["conduit/dropped_groups"] = sample_batch_size - taken
    if early is not None:
        waiter.idle = None
        metrics["conduit/early_rows"] = early.rows
        metrics["conduit/early_calls"] = early.calls
    metrics.update({f"conduit/policy/{k}": v for k, v in policy.report().items()})
    batch = fifo.all_samples()
    batch.extra_info = dict(fifo.pieces[0].extra_info or {})
    if uses_gae(conf):
        # verl whitens GAE advantages over the whole batch: once, after the last piece (exposed)
        with m.span("whiten", exposed=True), marked_timer("adv", timing_raw):
            whiten_advantages(batch)
    deliver(trainer, fifo, batch, metrics, timing_raw, version)
    metrics.update(fifo.end_step())
    metrics.update(ledger.end_step(version))
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
