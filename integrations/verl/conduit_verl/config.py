"""Knobs of the ``conduit`` trainer mode, read from ``trainer.v1.conduit`` and validated."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

from conduit.errors import ConfigError

MODE = "conduit"
#: keys renamed since a release: the old key fails with an error that names the new one
RENAMED = {"g_ing": "piece_groups"}


@dataclass(frozen=True)
class ConduitTrainerConfig:
    """Knobs read from ``trainer.v1.conduit``; unknown keys and out-of-range values raise ConfigError.

    Args:
        overlap: ``async`` streams GRPO groups through the ingestion stages while others still
            generate; ``sync`` runs verl's whole-batch stages (the sync trainer's behaviour).
        piece_groups: prompt groups a streamed ingestion piece waits for (old-log-prob, ref, values,
            advantage; a piece also takes every group already finished); ``auto`` (default)
            chooses it every step from measured piece costs and group finish times
            (``conduit/piece_policy.py``); 0 = the whole batch in one piece. (The core's ``g_ing`` is
            another quantity: rollout fragments per ingestion-operator call; ``g_ing`` here is an
            error that names this key.)
        g_del: PPO mini-batches per ``update_actor`` call; 0 = all of them in one call (verl's).
        poll_interval_s: how often the streaming wait re-reads TransferQueue's metadata; in
            ``sync`` overlap, the replay buffer's poll period (None = verl's 2 s).
        rollout_timeout_s: the longest the streaming wait goes with no prompt group finishing (a
            hung request, a dead agent loop or rollout server) before ``on_timeout`` applies; it
            logs the unfinished groups every 30 s meanwhile.
        on_timeout: ``error`` raises :class:`~conduit_verl.errors.RolloutTimeoutError` naming the
            unfinished groups; ``drop`` ends the step with the whole groups that finished (see
            ``group_wait.GroupWait``).
        journal: journal every finished GRPO group under ``trainer.default_local_dir`` as it lands,
            so a trainer killed mid-step resumes with the step's finished groups kept, generating
            only the others (``journal.py``, ``resume.py``); None (default) = on when verl saves
            checkpoints (``trainer.save_freq > 0``). Needs ``overlap=async``.
        tuner_cache: the directory where ``piece_groups=auto`` keeps its decision per workload signature,
            so a later run of the same workload starts from it instead of measuring both schedules
            again (the core's ``LoopTuner``); None (default) = the core tuner's ``~/.cache/conduit/tuner``.
        rollout_hardware: where generation runs, for ``piece_groups=auto``: ``shared`` (default, verl's
            hybrid engine: the rollout shares the actor's devices or cores, so ingestion overlapped
            with generation slows generation too, and ``auto`` counts that loss) or ``separate``
            (the rollout servers have hardware of their own: overlapped ingestion costs generation
            nothing, so ``auto`` streams wherever the ingestion it hides pays, without measuring
            whole-batch steps; and with ``max_staleness=0`` each response's per-sample stages —
            old and reference log-probs, values — run as soon as it finishes, before its group
            does: ``early_rows.py``, counted as ``conduit/early_rows``; with ``max_staleness >= 1``
            generation never pauses for training, as in verl's ``separate_async``).
        max_staleness: the bound on how old a prompt group may be when it is trained on, in policy
            versions: a group generated (any of its tokens) by weights of version ``v`` may be
            trained on by versions up to ``v + max_staleness`` (the core's FIFO staleness rule,
            ``conduit.buffer.samplers.is_stale``). 0 (default) is the on-policy streaming step.
            ``k >= 1``: generation for the next ``k`` steps runs ahead (``k`` warm-up batches, verl's
            partial-rollout client; with ``rollout_hardware=shared`` generation pauses while the
            trainer works and resumes on the new weights at each step's end, as verl's
            ``colocate_async``; with ``separate`` it never pauses for training, and requests in
            flight at the weight push resume on the new weights, as verl's ``separate_async``),
            finished groups still stream through ingestion,
            and verl's own ``max_off_policy_threshold`` is not applied (``staleness.py``).
            Needs ``overlap=async``. A checkpoint keeps the prompts drawn ahead (finished groups and
            pending prompts) in Conduit's format, never TransferQueue's pickle (``ahead.py``).
        on_stale: what happens to a group over ``max_staleness`` (``k >= 1``): ``drop`` (default)
            evicts it before ingestion and generates a fresh prompt in its place (verl's evict and
            refill), counted as ``conduit/stale_dropped``; ``recompute`` trains on it with its
            old-log-probs recomputed by the policy being trained (never the rollout's), counted as
            ``conduit/stale_recomputed`` (not with ``algorithm.rollout_correction.bypass_mode``).
        group_log: a JSONL file that gets one line per trained prompt group (step, uid, the weight
            versions that generated it, the version trained on, its staleness); None (default) =
            none. Every step also logs ``conduit/staleness/{min,median,mean,max}``.
    """

    overlap: Literal["sync", "async"] = "async"
    piece_groups: int | Literal["auto"] = "auto"
    g_del: int = 0
    poll_interval_s: float | None = None
    rollout_timeout_s: float = 600.0
    on_timeout: Literal["error", "drop"] = "error"
    journal: bool | None = None
    tuner_cache: str | None = None
    rollout_hardware: Literal["shared", "separate"] = "shared"
    max_staleness: int = 0
    on_stale: Literal["drop", "recompute"] = "drop"
    group_log: str | None = None

    def __post_init__(self) -> None:
        k = self.max_staleness
        checks = (  # (valid, key, what it must be), in the order they are reported
            (self.overlap in ("sync", "async"), "overlap", "'sync' or 'async'"),
            (self.piece_groups == "auto" or _count(self.piece_groups), "piece_groups",
             "an int >= 0 or 'auto'"),
            (_count(self.g_del), "g_del", "an int >= 0"),
            (self.poll_interval_s is None or _positive(self.poll_interval_s), "poll_interval_s",
             "a finite number > 0"),
            (_positive(self.rollout_timeout_s), "rollout_timeout_s",
             "a finite number > 0 (a wait is never unbounded)"),
            (self.on_timeout in ("error", "drop"), "on_timeout", "'error' or 'drop'"),
            (self.tuner_cache is None or _nonempty_str(self.tuner_cache), "tuner_cache",
             "a directory path or null"),
            (self.rollout_hardware in ("shared", "separate"), "rollout_hardware",
             "'shared' (the rollout shares the actor's devices or cores) or 'separate' (it has its own)"),
            (self.journal is None or isinstance(self.journal, bool), "journal", "true, false or null"),
            (_count(k), "max_staleness",
             "an int >= 0 (policy versions a trained group may lag; 0 = on-policy)"),
            (self.on_stale in ("drop", "recompute"), "on_stale", "'drop' or 'recompute'"),
            (self.group_log is None or _nonempty_str(self.group_log), "group_log", "a file path or null"),
        )  # fmt: skip
        for valid, key, must in checks:
            if not valid:
                raise ConfigError(f"trainer.v1.{MODE}.{key} must be {must}, got {getattr(self, key)!r}")
        if k > 0 and self.overlap == "sync":
            raise ConfigError(
                f"trainer.v1.conduit.max_staleness={k} needs overlap=async (the streaming step); "
                "overlap=sync runs verl's on-policy whole-batch stages"
            )

    @property
    def stream_poll_s(self) -> float:
        """The streaming wait's metadata re-read period (default 10 ms)."""
        return self.poll_interval_s if self.poll_interval_s is not None else 0.01

    def journal_on(self, save_freq: int) -> bool:
        """Whether finished groups are journaled, given verl's ``trainer.save_freq``."""
        if self.journal is None:
            return self.overlap == "async" and save_freq > 0
        return self.journal

    @classmethod
    def from_verl(cls, config: DictConfig) -> ConduitTrainerConfig:
        """Read and validate ``config.trainer.v1.conduit`` (absent → defaults)."""
        raw: Any = config.trainer.v1.get(MODE, None)
        knobs: dict[str, Any] = {}
        if raw is not None:
            container = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw
            if not isinstance(container, dict):
                raise ConfigError(f"trainer.v1.{MODE} must be a mapping, got {type(container).__name__}")
            knobs = {str(k): v for k, v in container.items()}
        allowed = {f.name for f in fields(cls)}
        for key in knobs:
            if key in RENAMED:
                raise ConfigError(
                    f"trainer.v1.{MODE}.{key} was renamed trainer.v1.{MODE}.{RENAMED[key]} (the same values: "
                    f"prompt groups per streamed piece, 0 or 'auto'); the core's {key} counts rollout "
                    f"fragments per ingestion call, another quantity"
                )
            if key not in allowed:
                raise ConfigError(
                    f"Unknown key trainer.v1.{MODE}.{key}; allowed keys: {', '.join(sorted(allowed))}"
                )
        out = cls(**knobs)
        if out.overlap == "sync":
            unused: list[str] = sorted(
                k
                for k in (
                    "piece_groups",
                    "g_del",
                    "rollout_timeout_s",
                    "on_timeout",
                    "tuner_cache",
                    "rollout_hardware",
                    "group_log",
                )
                if k in knobs
            )
            if knobs.get("journal"):  # journaling needs the streaming step's agent-loop manager
                unused.append("journal")
            if unused:
                raise ConfigError(
                    f"trainer.v1.{MODE}.{unused[0]} does not apply with overlap=sync (verl's whole-batch "
                    "stages run); remove it or use overlap=async"
                )
        if "on_stale" in knobs and out.max_staleness == 0:
            raise ConfigError(
                f"trainer.v1.{MODE}.on_stale applies with max_staleness >= 1 (with 0 every group is "
                "trained by the policy that generated it); remove it or set max_staleness"
            )
        return out


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _nonempty_str(x: object) -> bool:
    return isinstance(x, str) and bool(x)
