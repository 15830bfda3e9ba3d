"""Trainer mode ``conduit`` for verl's V1 trainer (``trainer.v1.trainer_mode=conduit``).

For now it behaves exactly like ``sync``; its knobs live under ``trainer.v1.conduit.*`` and are
validated here. Conduit's streaming ingestion/delivery will override the stage methods listed in
``integrations/verl/NOTES.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

MODE = "conduit"


@dataclass(frozen=True)
class ConduitTrainerConfig:
    """Knobs read from ``trainer.v1.conduit``; unknown keys are an error."""

    overlap: Literal["sync", "async"] = "sync"
    g_ing: int = 0  # groups per ingestion call; 0 = the whole batch (verl's behaviour)
    g_del: int = 0  # mini-batches per delivery; 0 = the whole batch
    depth: int = 1  # delivered batches kept ready
    poll_interval_s: float | None = None  # replay-buffer poll period; None = verl's default (2 s)

    def __post_init__(self) -> None:
        if self.overlap not in ("sync", "async"):
            raise ValueError(f"trainer.v1.conduit.overlap must be 'sync' or 'async', got {self.overlap!r}")
        for name in ("g_ing", "g_del"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.v1.conduit.{name} must be >= 0, got {getattr(self, name)}")
        if self.poll_interval_s is not None and self.poll_interval_s <= 0:
            raise ValueError(f"trainer.v1.conduit.poll_interval_s must be > 0, got {self.poll_interval_s}")
        if self.depth < 1:
            raise ValueError(f"trainer.v1.conduit.depth must be >= 1, got {self.depth}")

    @classmethod
    def from_verl(cls, config: DictConfig) -> ConduitTrainerConfig:
        """Read and validate ``config.trainer.v1.conduit`` (absent → defaults)."""
        raw: Any = config.trainer.v1.get(MODE, None)
        knobs: dict[str, Any] = {}
        if raw is not None:
            container = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw
            if not isinstance(container, dict):
                raise ValueError(f"trainer.v1.{MODE} must be a mapping, got {type(container).__name__}")
            knobs = {str(k): v for k, v in container.items()}
        allowed = {f.name for f in fields(cls)}
        for key in knobs:
            if key not in allowed:
                raise ValueError(
                    f"Unknown key trainer.v1.{MODE}.{key}; allowed keys: {', '.join(sorted(allowed))}"
                )
        return cls(**knobs)


@register_trainer(MODE)
class ConduitTrainer(PPOTrainerSync):
    """The sync trainer, with Conduit's knobs; the streaming stages plug in here."""

    def __init__(self, config: DictConfig) -> None:
        self.conduit_config = ConduitTrainerConfig.from_verl(config)
        super().__init__(config)

    def _build_replay_buffer(self) -> Any:
        # verl branches on ``trainer_mode == "sync"`` (replay buffer, refill, checkpoints);
        # this mode keeps sync semantics, so it reports itself as "sync" to those branches.
        self.trainer_mode = "sync"
        buffer = super()._build_replay_buffer()
        if self.conduit_config.poll_interval_s is not None and hasattr(buffer, "poll_interval"):
            buffer.poll_interval = self.conduit_config.poll_interval_s
        return buffer
