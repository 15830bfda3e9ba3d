"""Frozen, validated configuration: the buffer's shape and the scheduler's knobs.

Every config can be built from a plain dict (``from_dict``); an unknown key or an out-of-range value
raises :class:`~conduit.errors.ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Self

from conduit.errors import ConfigError

TIER_PATTERN = re.compile(r"^(host|pinned|shm|disk|cuda(:\d+)?)$")
SAMPLERS = ("uniform", "fifo", "prioritized")
WRITERS = ("ring", "grouped")
OVERLAPS = ("sync", "async")
LIMIT_MODES = ("block", "error")


class _FromDict:
    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Self:
        """Build from a dict; unknown keys raise ``ConfigError`` naming them."""
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} key(s) {unknown}; known keys: {sorted(known)}")
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
            if sub is not None and isinstance(data.get(f.name), dict) and hasattr(sub, "from_dict"):
                data[f.name] = sub.from_dict(data[f.name])  # type: ignore[attr-defined]
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class RateLimit(_FromDict):
    """When sampling may proceed.

    Args:
        min_size: items that must be committed before the first sample.
        samples_per_insert: if set, the target ratio of sampled items to inserted items
            (Reverb's SampleToInsertRatio): a sample may run ahead of ``spi * inserted`` by at most
            ``tolerance`` items, and an insert ahead of ``sampled / spi`` by at most ``tolerance / spi``.
        tolerance: slack of the ratio, in sampled items.
        mode: ``"block"`` waits (up to ``timeout_s``) for the condition; ``"error"`` raises at once.
        timeout_s: how long ``block`` mode waits before raising.
        max_staleness: on-policy bound: an item written by policy version ``v`` may be consumed by
            versions up to ``v + max_staleness``; older items are evicted and counted (block mode) or
            raise :class:`~conduit.errors.StaleDataError` (error mode).
    """

    min_size: int = 1
    samples_per_insert: float | None = None
    tolerance: float = 0.0
    mode: str = "block"
    timeout_s: float = 60.0
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        _check(self.min_size >= 0, f"rate_limit.min_size must be >= 0, got {self.min_size}")
        _check(
            self.samples_per_insert is None or self.samples_per_insert > 0,
            f"rate_limit.samples_per_insert must be > 0, got {self.samples_per_insert}",
        )
        _check(self.tolerance >= 0, f"rate_limit.tolerance must be >= 0, got {self.tolerance}")
        _check(self.mode in LIMIT_MODES, f"rate_limit.mode must be one of {LIMIT_MODES}, got {self.mode!r}")
        _check(self.timeout_s > 0, f"rate_limit.timeout_s must be > 0, got {self.timeout_s}")
        _check(
            self.max_staleness is None or self.max_staleness >= 0,
            f"rate_limit.max_staleness must be >= 0, got {self.max_staleness}",
        )


@dataclass(frozen=True)
class BufferConfig(_FromDict):
    """The experience buffer: storage tier and size, writer, sampler and rate limiter.

    Args:
        capacity: items the ring holds.
        capacity_bytes: optional byte budget of the tier; construction fails if the ring would exceed it.
        tier: ``host`` (pageable), ``pinned``, ``shm`` (shared memory), ``disk`` (memmap), ``cuda[:N]``.
        disk_path: directory for the ``disk`` tier (a temporary directory if not given).
        writer: ``ring`` (oldest overwritten) or ``grouped`` (groups of ``group_size`` land atomically).
        group_size: items per group for the grouped writer (e.g. GRPO's n responses per prompt).
        sampler: ``uniform``, ``fifo`` (consume-once, on-policy) or ``prioritized`` (proportional).
        alpha: prioritization exponent; beta: importance-weight exponent; priority_eps: added to
            every priority so none is zero.
    """

    capacity: int = 100_000
    capacity_bytes: int | None = None
    tier: str = "host"
    disk_path: str | None = None
    writer: str = "ring"
    group_size: int = 1
    sampler: str = "uniform"
    alpha: float = 0.6
    beta: float = 0.4
    priority_eps: float = 1e-6
    rate_limit: RateLimit = field(default_factory=RateLimit)

    def __post_init__(self) -> None:
        _check(
            isinstance(self.capacity, int) and self.capacity >= 1,
            f"capacity must be >= 1, got {self.capacity}",
        )
        _check(
            self.capacity_bytes is None or self.capacity_bytes >= 1,
            f"capacity_bytes must be >= 1, got {self.capacity_bytes}",
        )
        _check(
            bool(TIER_PATTERN.match(self.tier)),
            f"unknown tier {self.tier!r}; use host, pinned, shm, disk or cuda[:N]",
        )
        _check(self.writer in WRITERS, f"writer must be one of {WRITERS}, got {self.writer!r}")
        _check(self.sampler in SAMPLERS, f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        _check(self.group_size >= 1, f"group_size must be >= 1, got {self.group_size}")
        _check(
            self.writer == "grouped" or self.group_size == 1,
            "group_size only applies to writer='grouped'",
        )
        _check(self.alpha >= 0, f"alpha must be >= 0, got {self.alpha}")
        _check(self.beta >= 0, f"beta must be >= 0, got {self.beta}")
        _check(self.priority_eps > 0, f"priority_eps must be > 0, got {self.priority_eps}")
        if isinstance(self.rate_limit, dict):
            object.__setattr__(self, "rate_limit", RateLimit.from_dict(self.rate_limit))


@dataclass(frozen=True)
class SchedulerConfig(_FromDict):
    """When experience handling runs.

    Args:
        overlap: ``sync`` runs operators inline in the caller (the native path's behaviour);
            ``async`` runs them on a background worker and keeps up to ``depth`` batches ready.
        depth: queue depth of async ingestion and of prepared deliveries.
        g_ing: rollout fragments per ingestion-operator call.
        g_del: mini-batches prepared per delivery call (one sample + gather for all of them).
    """

    overlap: str = "sync"
    depth: int = 2
    g_ing: int = 1
    g_del: int = 1

    def __post_init__(self) -> None:
        _check(self.overlap in OVERLAPS, f"overlap must be one of {OVERLAPS}, got {self.overlap!r}")
        _check(1 <= self.depth <= 1024, f"depth must be in [1, 1024], got {self.depth}")
        _check(1 <= self.g_ing <= 4096, f"g_ing must be in [1, 4096], got {self.g_ing}")
        _check(1 <= self.g_del <= 4096, f"g_del must be in [1, 4096], got {self.g_del}")
