"""Frozen, validated configuration: the buffer's shape and the scheduler's knobs.

Every config can be built from a plain dict (``from_dict``); an unknown key or an out-of-range value
raises :class:`~conduit.errors.ConfigError` naming it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from conduit.errors import ConfigError

TIER_PATTERN = re.compile(r"^(host|pinned|shm|disk|cuda(:\d+)?)$")
SAMPLERS = ("uniform", "fifo", "prioritized")
WRITERS = ("ring", "grouped")
OVERLAPS = ("sync", "async")
LIMIT_MODES = ("block", "error")
NONFINITE = ("reject", "count")


class _FromDict:
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Self:
        """Build from a dict (or any mapping, e.g. a hydra ``DictConfig``); unknown keys raise
        ``ConfigError`` naming them."""
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(f"{cls.__name__}.from_dict takes a dict, got {type(data).__name__}")
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} key(s) {unknown}; known keys: {sorted(known)}")
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
            if sub is not None and isinstance(data.get(f.name), Mapping) and hasattr(sub, "from_dict"):
                data[f.name] = sub.from_dict(data[f.name])  # type: ignore[attr-defined]
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload, no-any-return]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


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
        _check(
            _is_int(self.min_size) and self.min_size >= 0,
            f"rate_limit.min_size must be an int >= 0, got {self.min_size!r}",
        )
        _check(
            self.samples_per_insert is None
            or (_is_real(self.samples_per_insert) and self.samples_per_insert > 0),
            f"rate_limit.samples_per_insert must be a finite number > 0, got {self.samples_per_insert!r}",
        )
        _check(
            _is_real(self.tolerance) and self.tolerance >= 0,
            f"rate_limit.tolerance must be a finite number >= 0, got {self.tolerance!r}",
        )
        _check(self.mode in LIMIT_MODES, f"rate_limit.mode must be one of {LIMIT_MODES}, got {self.mode!r}")
        _check(
            _is_real(self.timeout_s) and self.timeout_s > 0,
            f"rate_limit.timeout_s must be a finite number > 0 (waits are never unbounded), got {self.timeout_s!r}",
        )
        _check(
            self.max_staleness is None or (_is_int(self.max_staleness) and self.max_staleness >= 0),
            f"rate_limit.max_staleness must be an int >= 0, got {self.max_staleness!r}",
        )


@dataclass(frozen=True)
class JournalConfig(_FromDict):
    """Durable experience: every committed write (and priority update) is appended to a journal.

    Args:
        path: the journal's directory (created if missing). A ``Conduit`` built with a journal that
            already holds records replays them (``Conduit.load`` first restores a checkpoint).
        flush_interval_s: how often a background thread writes and fsyncs the queued records; a crash
            loses at most about this long of committed experience.
    """

    path: str
    flush_interval_s: float = 0.25

    def __post_init__(self) -> None:
        _check(
            isinstance(self.path, str) and bool(self.path) and "://" not in self.path,
            f"journal.path must be a local directory path, got {self.path!r}",
        )
        _check(
            _is_real(self.flush_interval_s) and 0 < self.flush_interval_s <= 60,
            f"journal.flush_interval_s must be a number in (0, 60], got {self.flush_interval_s!r}",
        )


@dataclass(frozen=True)
class BufferConfig(_FromDict):
    """The experience buffer: storage tier and size, writer, sampler and rate limiter.

    Args:
        capacity: items the ring holds.
        capacity_bytes: optional byte budget of the tier; construction fails if the ring would exceed it.
        memory_budget: with ``tier="auto"``, bytes of RAM (host, pinned and shm tiers together) the
            planner may give this buffer's columns; the rest go to the ``disk`` tier (memmap). ``None``:
            what the machine has free (``conduit.discovery``). See ``conduit.placer.within_memory_budget``.
        tier: ``auto`` (default: each column on the tier the placement planner chooses from this
            machine's measured tiers and links, re-planned as columns grow: ``conduit.placer``), or
            one tier for every column: ``host`` (pageable), ``pinned``, ``shm`` (shared memory),
            ``disk`` (memmap), ``cuda[:N]``.
        pins: column → tier, kept by hand (with ``auto``, the planner places the other columns).
        disk_path: directory for the ``disk`` tier (a temporary directory if not given).
        writer: ``ring`` (oldest overwritten) or ``grouped`` (groups of ``group_size`` land atomically).
        group_size: items per group for the grouped writer (e.g. GRPO's n responses per prompt).
        sampler: ``uniform``, ``fifo`` (consume-once, on-policy) or ``prioritized`` (proportional).
        alpha: prioritization exponent (0: uniform; higher samples large errors more often).
        beta: importance-weight exponent (1: full correction of the prioritization's bias).
        priority_eps: added to every priority so none is zero.
        rate_limit: a :class:`RateLimit` (a dict is accepted): when samples may be drawn.
        nonfinite: NaN/inf in columns marked ``check_finite`` and in priority updates: ``"reject"``
            raises before anything changes; ``"count"`` stores the items (a priority update skips
            those entries) and counts them (``count/nonfinite_values``, ``count/nonfinite_priorities``).
        journal: optional :class:`JournalConfig` (a dict is accepted): make committed experience durable.
    """

    capacity: int = 100_000
    capacity_bytes: int | None = None
    memory_budget: int | None = None
    tier: str = "auto"
    pins: Mapping[str, str] = field(default_factory=dict)
    disk_path: str | None = None
    writer: str = "ring"
    group_size: int = 1
    sampler: str = "uniform"
    alpha: float = 0.6
    beta: float = 0.4
    priority_eps: float = 1e-6
    rate_limit: RateLimit = field(default_factory=RateLimit)
    nonfinite: str = "reject"
    journal: JournalConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rate_limit, Mapping):
            object.__setattr__(self, "rate_limit", RateLimit.from_dict(self.rate_limit))
        if isinstance(self.journal, Mapping):
            object.__setattr__(self, "journal", JournalConfig.from_dict(dict(self.journal)))
        _check(
            self.journal is None or isinstance(self.journal, JournalConfig),
            f"journal must be a JournalConfig or a dict, got {self.journal!r}",
        )
        _check(
            _is_int(self.capacity) and self.capacity >= 1,
            f"capacity must be an int >= 1, got {self.capacity!r}",
        )
        _check(
            self.capacity_bytes is None or (_is_int(self.capacity_bytes) and self.capacity_bytes >= 1),
            f"capacity_bytes must be an int >= 1, got {self.capacity_bytes!r}",
        )
        _check(
            self.memory_budget is None or (_is_int(self.memory_budget) and self.memory_budget >= 0),
            f"memory_budget must be an int >= 0 (bytes of RAM), got {self.memory_budget!r}",
        )
        _check(
            self.memory_budget is None or self.tier == "auto",
            f"memory_budget applies to tier='auto' (the planner's placement), not to tier={self.tier!r}",
        )
        _check(
            isinstance(self.tier, str) and (self.tier == "auto" or bool(TIER_PATTERN.match(self.tier))),
            f"unknown tier {self.tier!r}; use auto, host, pinned, shm, disk or cuda[:N]",
        )
        _check(
            isinstance(self.pins, Mapping)
            and all(isinstance(t, str) and TIER_PATTERN.match(t) for t in self.pins.values()),
            f"pins must map column names to tiers (host, pinned, shm, disk, cuda[:N]), got {self.pins!r}",
        )
        _check(
            self.disk_path is None or (isinstance(self.disk_path, str) and bool(self.disk_path)),
            f"disk_path must be a directory path (str), got {self.disk_path!r}",
        )
        _check(
            isinstance(self.rate_limit, RateLimit), f"rate_limit must be a RateLimit, got {self.rate_limit!r}"
        )
        _check(self.writer in WRITERS, f"writer must be one of {WRITERS}, got {self.writer!r}")
        _check(self.sampler in SAMPLERS, f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        _check(
            _is_int(self.group_size) and self.group_size >= 1,
            f"group_size must be an int >= 1, got {self.group_size!r}",
        )
        _check(
            self.writer == "grouped" or self.group_size == 1,
            "group_size only applies to writer='grouped'",
        )
        _check(
            _is_real(self.alpha) and self.alpha >= 0,
            f"alpha must be a finite number >= 0, got {self.alpha!r}",
        )
        _check(
            _is_real(self.beta) and self.beta >= 0, f"beta must be a finite number >= 0, got {self.beta!r}"
        )
        _check(
            _is_real(self.priority_eps) and self.priority_eps > 0,
            f"priority_eps must be a finite number > 0, got {self.priority_eps!r}",
        )
        _check(
            self.rate_limit.max_staleness is None or self.sampler == "fifo",
            "rate_limit.max_staleness applies to consume-once data only: use sampler='fifo'",
        )
        _check(
            self.writer != "grouped" or self.capacity >= self.group_size,
            f"capacity {self.capacity} cannot hold one group of {self.group_size} items",
        )
        _check(self.nonfinite in NONFINITE, f"nonfinite must be one of {NONFINITE}, got {self.nonfinite!r}")

    # -- named presets (Reverb's Table.queue / Table.stack idea) ----------------------------------

    @classmethod
    def prioritized_replay(
        cls,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        min_size: int = 1,
        timeout_s: float = 60.0,
        **kw: Any,
    ) -> BufferConfig:
        """Off-policy proportional prioritized replay (DQN): ring writer, oldest items overwritten."""
        return cls._preset(
            kw,
            capacity=capacity,
            sampler="prioritized",
            alpha=alpha,
            beta=beta,
            rate_limit=RateLimit(min_size=min_size, timeout_s=timeout_s),
        )

    @classmethod
    def uniform_replay(
        cls, capacity: int, min_size: int = 1, timeout_s: float = 60.0, **kw: Any
    ) -> BufferConfig:
        """Off-policy uniform replay: ring writer, uniform sampling with replacement."""
        return cls._preset(
            kw,
            capacity=capacity,
            sampler="uniform",
            rate_limit=RateLimit(min_size=min_size, timeout_s=timeout_s),
        )

    @classmethod
    def on_policy(
        cls,
        capacity: int,
        group_size: int = 1,
        max_staleness: int | None = None,
        timeout_s: float = 60.0,
        mode: str = "block",
        **kw: Any,
    ) -> BufferConfig:
        """On-policy, consume-once: every item delivered exactly once, in order, never overwritten.

        ``group_size > 1`` commits whole groups (GRPO's n responses per prompt) atomically;
        ``max_staleness`` evicts items older than the consumer's version allows (``mode="error"``:
        refuses them, and a read of more than is there, at once).
        """
        return cls._preset(
            kw,
            capacity=capacity,
            sampler="fifo",
            writer="grouped" if _is_int(group_size) and group_size > 1 else "ring",
            group_size=group_size,
            rate_limit=RateLimit(min_size=0, max_staleness=max_staleness, timeout_s=timeout_s, mode=mode),
        )

    @classmethod
    def _preset(cls, extra: dict[str, Any], **fixed: Any) -> BufferConfig:
        """A preset's config plus ``extra`` keys; unknown keys, or keys the preset sets, raise ConfigError."""
        clash = sorted(set(extra) & set(fixed))
        if clash:
            raise ConfigError(f"this preset sets {clash} itself; use BufferConfig(...) to choose them")
        return cls.from_dict({**fixed, **extra})


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
        for name, top in (("depth", 1024), ("g_ing", 4096), ("g_del", 4096)):
            value = getattr(self, name)
            _check(
                _is_int(value) and 1 <= value <= top, f"{name} must be an int in [1, {top}], got {value!r}"
            )
