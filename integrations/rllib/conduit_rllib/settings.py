"""The plugin's knobs, stored on the RLlib config as a plain dict under ``config.conduit``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from conduit import SchedulerConfig
from conduit.errors import ConfigError

ATTR = "conduit"


@dataclass(frozen=True)
class ConduitSettings:
    """How the plugin drives Conduit.

    Args:
        overlap: ``sync`` (inline, RLlib's behaviour) or ``async`` (ingestion and delivery on
            background workers, deliveries prepared ``depth`` ahead). PPO is on-policy and delivers
            each iteration's batch whole, so it always runs its delivery inline.
        depth: deliveries (and queued fragments) kept ready in async mode.
        g_ing: fragments per ingestion-operator call.
        g_del: mini-batches sampled and gathered per delivery call.
        seed: seed of Conduit's sampler (``None``: RLlib's ``config.seed``).
    """

    overlap: str = "sync"
    depth: int = 2
    g_ing: int = 1
    g_del: int = 1
    seed: int | None = None

    def __post_init__(self) -> None:
        self.scheduler()  # validates the knobs, naming a bad one

    def scheduler(self, force_sync: bool = False) -> SchedulerConfig:
        overlap = "sync" if force_sync else self.overlap
        return SchedulerConfig(overlap=overlap, depth=self.depth, g_ing=self.g_ing, g_del=self.g_del)

    @classmethod
    def of(cls, config: Any) -> ConduitSettings:
        """The settings stored on an RLlib ``AlgorithmConfig`` (defaults if ``enable`` was not called)."""
        raw = getattr(config, ATTR, None) or {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown conduit setting(s) {unknown}; known: {sorted(known)}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
