"""Trainer mode ``conduit`` for verl's V1 trainer (``trainer.v1.trainer_mode=conduit``).

A subclass of verl's sync trainer. With ``trainer.v1.conduit.overlap=async`` (the default) each
step streams: GRPO groups go through old-log-prob, ref, values and advantage as they finish
generating (``streaming.py``), then the actor gets its mini-batches from Conduit's grouped FIFO
buffer (``delivery.py``). With ``overlap=sync`` it is verl's sync step. With the journal on
(``trainer.v1.conduit.journal``, default: when verl saves checkpoints) every finished group is
also journaled by the agent-loop workers (``journal_worker.py``), and a resumed step takes the
interrupted step's journaled groups back instead of generating them (``resume.py``). With
``trainer.v1.conduit.max_staleness=k >= 1`` generation runs ``k`` steps ahead (warm-up batches,
partial-rollout client): with ``rollout_hardware=shared`` the way verl's ``colocate_async`` does it
(generation paused while the trainer works, weights pushed and generation resumed at each step's
end: verl's own hooks); with ``rollout_hardware=separate`` the way ``separate_async`` does it
(generation never pauses for training: in-flight requests are aborted, kept, and resumed on the new
weights only for the push at each step's end), and a group older than ``k`` versions is dropped
(evicted and refilled) or trained with recomputed old-log-probs (``staleness.py``). Knobs:
``config.py``. The verl methods it overrides and calls are reached through ``compat.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from conduit import Metrics
from conduit.piece_policy import PieceChoice, PiecePolicy, piece_tuner
from conduit.tuner_loop import LoopTuner
from conduit_verl import compat
from conduit_verl.checks import check_model_tokenizer, piece_unit, row_unit
from conduit_verl.compat import KVBatchMeta, SyncTrainerBase, register_trainer
from conduit_verl.config import MODE, ConduitTrainerConfig
from conduit_verl.errors import ConfigError

# The streaming modules are imported where they are used: this module is imported by the plugin's
# hook on verl's trainer package, which may fire while one of them is itself being imported (it
# imports compat.py, which imports verl's trainer package); only compat, checks, config and the core
# may be imported at the top.

__all__ = ["MODE", "ConduitTrainer", "ConduitTrainerConfig"]

logger = logging.getLogger(__name__)


def _infer_micro_batches(config: DictConfig) -> dict[str, int | None]:
    """The inference micro-batch sizes a piece must split into (dynamic batch size: none)."""
    arr = config.actor_rollout_ref
    out: dict[str, int | None] = {}
    if not arr.rollout.get("log_prob_use_dynamic_bsz", False):
        out["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] = arr.rollout.get(
            "log_prob_micro_batch_size_per_gpu"
        )
    if not arr.ref.get("log_prob_use_dynamic_bsz", False):
        out["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] = arr.ref.get(
            "log_prob_micro_batch_size_per_gpu"
        )
    critic = config.get("critic", None)
    if critic is not None and critic.get("enable", False) and not critic.get("use_dynamic_bsz", False):
        out["critic.forward_micro_batch_size_per_gpu"] = critic.get("forward_micro_batch_size_per_gpu")
    return out


def _dp_size(config: DictConfig) -> int:
    """Data-parallel ranks a piece is split over: the actor's world over the ranks that share samples
    (FSDP: Ulysses sequence parallel; Megatron: tensor x pipeline x context parallel)."""
    world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    actor = config.actor_rollout_ref.actor
    if actor.get("strategy") == "megatron":
        mg = actor.megatron
        peers = 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            peers *= int(mg.get(key, 1) or 1)
    else:
        peers = int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
    return max(1, world // peers)


def _piece_tuning(
    config: DictConfig,
    cache_dir: str | None,
    groups: int,
    n: int,
    separate: bool = False,
    max_staleness: int = 0,
) -> LoopTuner[PieceChoice]:
    """``piece_groups=auto``'s tuner with its memory between runs: the core's tuner cache, keyed by
    the advantage estimator and responses per prompt (and ``/separate`` where the rollout has its own
    hardware, ``/k<max_staleness>`` where generation runs ahead: groups are then ready at a step's
    start), samples per step, tokens per sample and this machine."""
    from conduit.discovery import fingerprint

    algorithm = f"verl/{config.algorithm.get('adv_estimator', 'gae')}/n{n}" + (
        "/separate" if separate else ""
    )
    algorithm += f"/k{max_staleness}" if max_staleness else ""
    return piece_tuner(cache_dir, algorithm, groups * n, fingerprint())


def _completion_channel(config: DictConfig, journal: bool) -> Any:
    """Start the channel the agent loops report finished groups to (None: keep polling TQ).

    Selects Conduit's notifying agent-loop manager through verl's own
    ``rollout.agent.agent_loop_manager_class`` (with ``journal``: the one whose workers also journal
    each finished group, ``journal_worker.py``); a user's own manager is left alone (the stream
    then falls back to re-reading TransferQueue's metadata every ``poll_interval_s``).
    """
    from conduit_verl.completion import MANAGER_FQN, start_channel
    from conduit_verl.journal_worker import MANAGER_FQN as JOURNAL_FQN

    agent = config.actor_rollout_ref.rollout.agent
    current = agent.get("agent_loop_manager_class", None)
    if current not in (None, MANAGER_FQN, JOURNAL_FQN):
        if journal:
            raise ConfigError(
                f"trainer.v1.conduit.journal needs Conduit's agent-loop manager, but "
                f"rollout.agent.agent_loop_manager_class is {current}; unset it or set journal=false"
            )
        logger.warning("custom agent_loop_manager_class %s: group completion is polled", current)
        return None
    with open_dict(agent):
        agent.agent_loop_manager_class = JOURNAL_FQN if journal else MANAGER_FQN
    return start_channel()


def _check_staleness(config: DictConfig, cfg: ConduitTrainerConfig) -> None:
    """What ``max_staleness >= 1`` cannot run with yet (ConfigError naming it)."""
    k = cfg.max_staleness
    if k == 0:
        return
    correction = config.get("algorithm", {}).get("rollout_correction", None) or {}
    if cfg.on_stale == "recompute" and correction.get("bypass_mode", False):
        raise ConfigError(
            "trainer.v1.conduit.on_stale=recompute trains a stale group with old-log-probs recomputed "
            "by the policy being trained, but algorithm.rollout_correction.bypass_mode=true takes them "
            "from the rollout; set bypass_mode=false or on_stale=drop"
        )


@register_trainer(MODE)
class ConduitTrainer(SyncTrainerBase):
    """verl's sync trainer with Conduit's streaming ingestion and delivery."""

    def __init__(self, config: DictConfig) -> None:
        from conduit_verl.delivery import GroupFifo
        from conduit_verl.gae import check_streamable
        from conduit_verl.group_wait import GroupWait

        self.conduit_config = ConduitTrainerConfig.from_verl(config)
        self.conduit_metrics = Metrics(trace=False)
        self.conduit_in_piece = False
        self.conduit_early: Any = None  # EarlyRows: on-policy streaming with the rollout on its own hardware
        self.conduit_journal: Path | None = None
        self.conduit_restore_metrics: dict[str, float] = {}
        self.conduit_journal_started = False
        self.conduit_staleness: Any = None
        self.conduit_resumed_version: int | None = None  # the weights' version of the checkpoint resumed
        self.conduit_trained_keys: list[str] = []  # the last step's samples (what a checkpoint has trained)
        _check_staleness(config, self.conduit_config)
        super().__init__(config)
        if self.conduit_config.overlap == "sync":
            return  # verl's own step: nothing of the streaming path is built
        if self.conduit_config.journal_on(int(config.trainer.save_freq)):
            from conduit_verl.journal import journal_root
            from conduit_verl.resume import RESUME_SEAMS  # noqa: F401 (checks what the resume needs)

            with open_dict(config.trainer):  # the agent-loop workers find the journal from it
                config.trainer.default_local_dir = os.path.abspath(str(config.trainer.default_local_dir))
            self.conduit_journal = journal_root(config.trainer.default_local_dir)
        check_streamable(config)
        n = int(config.actor_rollout_ref.rollout.n)
        groups = int(config.data.train_batch_size)
        unit = piece_unit(
            groups, n, _infer_micro_batches(config), self.conduit_config.piece_groups, _dp_size(config)
        )
        self.conduit_fifo = GroupFifo(n, 2 * groups * n)
        self.conduit_channel: Any = _completion_channel(config, self.conduit_journal is not None)
        cfg = self.conduit_config
        self.conduit_wait = GroupWait(
            self.conduit_channel,
            unit,
            timeout_s=cfg.rollout_timeout_s,
            on_timeout=cfg.on_timeout,
            poll_s=cfg.stream_poll_s,
            keep_multiple=int(config.actor_rollout_ref.actor.ppo_mini_batch_size),
        )
        separate = cfg.rollout_hardware == "separate"
        tuning = (
            _piece_tuning(config, cfg.tuner_cache, groups, n, separate, cfg.max_staleness)
            if cfg.piece_groups == "auto"
            else None
        )
        self.conduit_policy = PiecePolicy(cfg.piece_groups, groups, unit, tuning, separate_rollout=separate)
        if separate and cfg.max_staleness == 0:
            from conduit_verl.early_rows import EarlyRows

            rows = row_unit(_infer_micro_batches(config), _dp_size(config))
            self.conduit_early = EarlyRows(math.lcm(rows, n * unit), rows)
        from conduit_verl.staleness import StalenessLedger

        self.conduit_staleness = StalenessLedger(cfg.max_staleness, cfg.on_stale, cfg.group_log)

    def conduit_tokenizer_ready(self, tokenizer: Any) -> None:
        # runs first in ``init()``: a model/tokenizer mismatch fails before any worker starts
        check_model_tokenizer(str(self.config.actor_rollout_ref.model.path), tokenizer)

    def conduit_trainer_mode(self) -> str:
        # running ahead, verl's branches on trainer_mode must see an async mode: its async replay
        # buffer (evict and refill), one-prompt dataloader chunks (exact refills)
        return compat.ASYNC_TRAINER_MODE if self.conduit_config.max_staleness > 0 else "sync"

    def conduit_replay_buffer_ready(self, buffer: Any) -> None:
        if self.conduit_config.poll_interval_s is not None:
            compat.set_poll_interval(buffer, self.conduit_config.poll_interval_s)
        cfg = self.conduit_config
        if cfg.max_staleness > 0:
            from conduit_verl.staleness import replay_buffer_decision

            threshold = compat.gate_replay_buffer(
                buffer, replay_buffer_decision(cfg.max_staleness, cfg.on_stale)
            )
            if threshold is not None:
                logger.info(
                    "conduit: verl's trainer.v1.sampler.max_off_policy_threshold=%d is not applied; "
                    "trainer.v1.conduit.max_staleness=%d decides which groups are too old",
                    threshold,
                    cfg.max_staleness,
                )

    # -- bounded staleness (``max_staleness >= 1``): verl's colocate_async hooks, as they are

    def get_llm_client(self) -> Any:
        if self.conduit_config.max_staleness > 0:
            return compat.partial_rollout_client(self)
        return super().get_llm_client()

    def on_train_begin(self) -> None:
        super().on_train_begin()
        if self.conduit_config.max_staleness > 0:  # the next k steps' prompts, ahead of step 1's
            compat.add_warmup_batches(self, self.conduit_config.max_staleness)

    def conduit_disaggregated(self) -> bool:
        """Generation runs ahead on hardware of its own (``max_staleness >= 1`` with
        ``rollout_hardware=separate``): separate_async's schedule, generation never pauses for
        training; with ``rollout_hardware=shared`` it is colocate_async's (paused for the step)."""
        cfg = self.conduit_config
        return cfg.max_staleness > 0 and cfg.rollout_hardware == "separate"

    def on_sample_end(self) -> None:
        if self.conduit_disaggregated():
            compat.separate_sample_end(self)
        elif self.conduit_config.max_staleness > 0:
            compat.async_sample_end(self)
        else:
            super().on_sample_end()

    def on_step_end(self) -> None:
        if self.conduit_disaggregated():
            compat.separate_step_end(self)
        elif self.conduit_config.max_staleness > 0:
            compat.async_step_end(self)
        else:
            super().on_step_end()

    def conduit_batch_multiple(self, dp_size: int) -> int:
        # a streamed piece only needs to split evenly over the actor's dp ranks; the stock
        # multiple (lcm with the PPO mini-batch) would pad small pieces with no-op rows
        if self.conduit_in_piece:
            return dp_size
        return super().conduit_batch_multiple(dp_size)

    def conduit_step(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        if self.conduit_config.overlap == "sync":
            return super().conduit_step(metrics, timing_raw, sample_batch_size)
        from conduit_verl.streaming import stream_step

        return stream_step(self, metrics, timing_raw, sample_batch_size)

    # -- the journal (``trainer.v1.conduit.journal``): resume keeps a killed step's finished groups

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        if self.conduit_journal is None:
            return int(super()._submit_batch_to_rollout(batch))
        from conduit_verl.resume import prune_on_start, submit_with_journal

        if not self.conduit_journal_started:
            self.conduit_journal_started = True
            mode = str(self.config.trainer.get("resume_mode", "auto"))
            prune_on_start(self.conduit_journal, compat.global_step(self), mode)
        report = submit_with_journal(
            self.conduit_journal,
            compat.global_step(self),
            batch,
            super()._submit_batch_to_rollout,
            self.conduit_channel,
            max_version=self.conduit_resumed_version,
        )
        for key, value in report.metrics().items():  # summed over the step's submissions (refills)
            self.conduit_restore_metrics[key] = self.conduit_restore_metrics.get(key, 0.0) + value
        return len(batch)

    def prepare_step(self) -> dict:
        out = dict(super().prepare_step() or {})
        out.update(self.conduit_restore_metrics)
        self.conduit_restore_metrics = {}
        return out

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = super().step(metrics, timing_raw)
        self.conduit_trained_keys = list(batch.keys)
        return batch

    @contextlib.contextmanager
    def _verl_sees_sync(self) -> Iterator[bool]:
        """When generation runs ahead (``max_staleness >= 1``), within the block verl's branches see
        ``trainer_mode`` sync: its checkpoint code then neither writes nor reads TransferQueue's own
        checkpoint (pickle); ``ahead.py`` keeps those rows. Yields whether generation runs ahead."""
        if self.conduit_config.max_staleness == 0:
            yield False
            return
        mode, self.trainer_mode = self.trainer_mode, "sync"
        try:
            yield True
        finally:
            self.trainer_mode = mode

    def _save_checkpoint(self) -> None:
        if self.conduit_config.max_staleness > 0:
            from conduit_verl import ahead
            from conduit_verl.resume import snapshot_ahead

            step = compat.global_step(self)
            folder = Path(self.config.trainer.default_local_dir) / f"global_step_{step}"
            ahead.write(folder, snapshot_ahead(step, self.conduit_trained_keys))  # before verl's tracker
        with self._verl_sees_sync():
            super()._save_checkpoint()
        if self.conduit_journal is not None:  # this step is trained into the checkpoint now
            from conduit_verl.journal import prune

            prune(self.conduit_journal, compat.global_step(self))

    def _load_checkpoint(self) -> Any:
        with self._verl_sees_sync() as ahead:
            out = super()._load_checkpoint()
        step = compat.global_step(self)
        if step > 0:
            self.conduit_resumed_version = step
            if ahead:
                self._restore_ahead(step)
        return out

    def _restore_ahead(self, step: int) -> None:
        """Put back what the checkpoint of ``step`` kept of the prompts drawn ahead (``ahead.py``)."""
        from conduit_verl import ahead
        from conduit_verl.resume import restore_ahead

        trainer = self.config.trainer
        if str(trainer.get("resume_mode", "auto")) == "resume_path":
            folder = Path(str(trainer.resume_from_path))
        else:
            folder = Path(str(trainer.default_local_dir)) / f"global_step_{step}"
        rows = ahead.read(folder)
        if rows is None:
            logger.warning(
                "conduit: checkpoint %s has no %s (not written by trainer mode conduit with "
                "max_staleness >= 1); no prompt drawn ahead of it is restored",
                folder,
                ahead.AHEAD_FILE,
            )
            return
        report = restore_ahead(rows, self.conduit_journal, version=step)
        self._restored_tq_prompt_count = report.prompts  # verl's warm-up adds only what is missing
        if self.conduit_channel is not None:
            for _ in range(report.finished):
                self.conduit_channel.finished.remote("train")
        self.conduit_restore_metrics.update(report.metrics())
        logger.warning(
            "conduit: resumed at step %d with %d prompt group(s) drawn ahead put back (%d finished, %d "
            "of them journaled after the checkpoint; %d journaled with newer weights generated again)",
            step,
            report.prompts,
            report.finished,
            report.from_journal,
            report.newer_weights,
        )
