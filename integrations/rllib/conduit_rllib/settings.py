"""The plugin's knobs, stored on the RLlib config as a plain dict under ``config.conduit``.

(Storing and reading that attribute is an RLlib seam: ``compat.store_settings`` / ``stored_settings``.)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from conduit import SchedulerConfig
from conduit.errors import ConfigError

log = logging.getLogger("conduit_rllib")
OVERLAPS = ("sync", "async", "auto")


@dataclass(frozen=True)
class ConduitSettings:
    """How the plugin drives Conduit.

    Args:
        overlap: ``sync`` (inline, RLlib's behaviour), ``async`` (ingestion and delivery on
            background workers, deliveries prepared ``depth`` ahead; PPO's GAE runs on the ingestion
            worker and its epochs of minibatches are laid out by the delivery worker) or ``auto``:
            for DQN the core's cost model and tuner choose overlap, ``stage_steps``, ``g_del`` and
            ``depth`` after a measured warm-up (``dqn_tuning.py``; knobs set here stay pinned); PPO
            runs ``sync`` under ``auto`` (not tuned yet). ``auto`` is the default.
        depth: deliveries (and queued fragments) kept ready in async mode (``None``: ``2 * g_del``).
        g_ing: fragments per ingestion-operator call.
        g_del: mini-batches sampled and gathered per delivery call (``None``: 8 for async DQN, whose
            training steps each take one small batch, else 1). DQN only: PPO raises if it is set.
        seed: seed of Conduit's sampler (``None``: RLlib's ``config.seed``).
        stage_steps: DQN env steps staged before one ``put`` (and priority updates queued before one
            send). ``None``: 1 in sync mode (every transition is sampleable in the step that collected
            it, as in RLlib) and 32 in async mode (one put and one priority update per 32 steps).
        pins: buffer column → memory tier kept by hand (``{"obs": "disk"}``); the other columns are
            placed by Conduit's planner (``BufferConfig(tier="auto")``), which is the default.
        memory_budget: bytes of RAM the replay may take (``BufferConfig.memory_budget``): DQN's
            transition rows first, a frame store (frame stacking) the rest; what does not fit goes to
            the disk tier (memmap). ``None``: the machine's free memory.
        disk_path: directory of the disk tier (``None``: the temporary directory).
    """

    overlap: str = "auto"
    depth: int | None = None
    g_ing: int = 1
    g_del: int | None = None
    seed: int | None = None
    stage_steps: int | None = None
    pins: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    memory_budget: int | None = None
    disk_path: str | None = None

    def __post_init__(self) -> None:
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ConfigError(f"conduit setting memory_budget must be an int >= 0 (bytes), got {budget!r}")
        if self.disk_path is not None and (not isinstance(self.disk_path, str) or not self.disk_path):
            raise ConfigError(f"conduit setting disk_path must be a directory path, got {self.disk_path!r}")
        if not isinstance(self.pins, dict) or not all(isinstance(k, str) for k in self.pins):
            raise ConfigError(f"conduit setting pins must map column names to tiers, got {self.pins!r}")
        if self.overlap not in OVERLAPS:
            raise ConfigError(f"conduit setting overlap must be one of {OVERLAPS}, got {self.overlap!r}")
        self.scheduler()  # validates the knobs, naming a bad one
        if self.stage_steps is not None and self.stage_steps < 1:
            raise ConfigError(f"stage_steps must be >= 1, got {self.stage_steps}")

    def stage_steps_for(self, algo: str) -> int:
        if self.stage_steps is not None:
            return self.stage_steps
        return 32 if self.overlap == "async" and algo == "dqn" else 1

    def scheduler(self, algo: str = "") -> SchedulerConfig:
        """The core's scheduler knobs for ``algo`` ("dqn" or "ppo"); a knob that does not apply raises."""
        if algo == "ppo":
            for name in ("g_del", "stage_steps"):
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"conduit setting {name}={getattr(self, name)!r} does not apply to PPO (it delivers "
                        "each iteration once, as epochs of minibatches); remove it"
                    )
        g_del = self.g_del
        if g_del is None:
            g_del = 8 if self.overlap == "async" and algo == "dqn" else 1
        depth = self.depth if self.depth is not None else 2 * g_del
        overlap = self.overlap
        if overlap == "auto":  # DQN: the warm-up probe before the tuner chooses (dqn_tuning.py)
            overlap = "sync"
            if algo == "ppo":
                log.info("conduit overlap='auto' runs PPO sync: the tuner covers DQN's knobs so far")
        return SchedulerConfig(overlap=overlap, depth=depth, g_ing=self.g_ing, g_del=g_del)

    @classmethod
    def of(cls, config: Any) -> ConduitSettings:
        """The settings stored on an RLlib ``AlgorithmConfig`` (defaults if ``enable`` was not called)."""
        from conduit_rllib.compat import stored_settings

        raw = stored_settings(config)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown conduit setting(s) {unknown}; known: {sorted(known)}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
