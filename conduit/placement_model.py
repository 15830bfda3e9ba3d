"""The placement planner's model: fields, their accesses and plans (the data types), and
``PlacementModel``, a validated problem as arrays (cost, nbytes, budget, allowed) that the planner
(:mod:`conduit.placement`) and its solvers (:mod:`conduit.placement_solvers`) share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from conduit.errors import ConfigError, PlacementCapacityError

if TYPE_CHECKING:
    from conduit.topology import Topology

Headroom = Mapping[str, int] | None


@dataclass(frozen=True)
class Access:
    """A producer writing from, or a consumer computing on, ``tier``, moving the field's bytes
    ``per_iteration`` times per iteration (fractions allowed: 1/8 for a reader of one shard of 8)."""

    tier: str
    per_iteration: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.per_iteration) and self.per_iteration >= 0):
            raise ConfigError(f"access on {self.tier!r}: per_iteration must be finite and >= 0")


@dataclass(frozen=True)
class Field:
    """One column/field: its size and who writes and reads it."""

    name: str
    bytes_per_item: int
    items: int
    writers: tuple[Access, ...] = ()
    readers: tuple[Access, ...] = ()

    def __post_init__(self) -> None:
        if self.bytes_per_item < 0 or self.items < 0:
            raise ConfigError(f"field {self.name!r}: bytes_per_item and items must be >= 0")

    @property
    def nbytes(self) -> int:
        return self.bytes_per_item * self.items


@dataclass(frozen=True)
class Plan:
    """A tier per field and its predicted seconds per iteration; ``costs`` (field → tier → seconds),
    ``budgets`` and ``field_bytes`` are kept so that ``explain`` can say why."""

    assignment: dict[str, str]
    predicted_s: float
    per_field_s: dict[str, float]
    tier_bytes: dict[str, int]
    method: str
    costs: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    budgets: dict[str, int] = field(default_factory=dict, repr=False)
    field_bytes: dict[str, int] = field(default_factory=dict, repr=False)

    def explain(self) -> str:
        """One line per field (tier, seconds there, size, the runner-up and the budget that binds),
        the used tiers' budgets, and the total."""
        width = max((len(n) for n in self.assignment), default=0)
        twidth = max((len(t) for t in self.assignment.values()), default=0)
        lines = [f"placement by {self.method}:"]
        for name, tier in self.assignment.items():
            nbytes, here = self.field_bytes.get(name, 0), self.per_field_s[name]
            head = f"  {name:<{width}} -> {tier:<{twidth}} {_fmt_s(here):>9}/iter {_fmt_b(nbytes):>9}"
            lines.append(f"{head}  {self._why(name, tier, nbytes, here)}")
        for tier in dict.fromkeys(self.assignment.values()):
            budget = self.budgets.get(tier)
            of = f" of {_fmt_b(budget)} budget" if budget is not None else ""
            lines.append(f"  tier {tier}: {_fmt_b(self.tier_bytes.get(tier, 0))} used{of}")
        n_tiers = len(set(self.assignment.values()))
        lines.append(
            f"  total: {_fmt_s(self.predicted_s)}/iter for {len(self.assignment)} fields on {n_tiers} tier(s)"
        )
        return "\n".join(lines)

    def _why(self, name: str, tier: str, nbytes: int, here: float) -> str:
        others = sorted((s, t) for t, s in self.costs.get(name, {}).items() if t != tier and math.isfinite(s))
        if not others:
            return "runner-up: none (no other tier links to all its accesses); no budget binds"
        cost, alt = others[0]
        delta = cost - here
        runner = f"runner-up {alt} {_fmt_s(cost)} ({'+' if delta >= 0 else '-'}{_fmt_s(abs(delta))})"
        if delta >= 0:
            return f"{runner}; cheapest tier, no budget binds"
        budget = self.budgets.get(alt, 0)
        if nbytes > budget:
            return f"{runner}; budget of {alt} binds: the field alone exceeds it ({_fmt_b(budget)})"
        used = self.tier_bytes.get(alt, 0)
        if budget - used >= nbytes:
            return f"{runner}; {alt} has room ({_fmt_b(budget - used)} free): left here by {self.method}"
        short = _fmt_b(nbytes - (budget - used))
        return f"{runner}; budget of {alt} binds: {_fmt_b(used)} of {_fmt_b(budget)} used, {short} short"


class PlacementModel:
    """Validated input as arrays: cost[f, t] seconds (inf: no link), nbytes[f], budget[t], allowed[f, t]."""

    def __init__(
        self,
        fields: Sequence[Field],
        topology: Topology,
        headroom: Headroom,
        pins: Mapping[str, str] | None = None,
    ) -> None:
        tiers = list(topology.tiers)
        self.tier_names = [t.name for t in tiers]
        self.kind_of = {t.name: t.kind for t in tiers}
        self.node_of = {t.name: t.node for t in tiers}
        self.n_tiers = len(tiers)
        self.headroom = dict(headroom or {})
        for name, value in self.headroom.items():
            if name not in self.kind_of or value < 0:
                raise ConfigError(
                    f"headroom {name!r}: {value} must be >= 0 bytes on a known tier ({self.tier_names})"
                )
        self.budget = np.array(
            [max(0, t.capacity_bytes - self.headroom.get(t.name, 0)) for t in tiers], np.int64
        )
        self.fields = list(fields)
        self.n_fields = len(self.fields)
        if len({f.name for f in self.fields}) < self.n_fields:
            raise ConfigError(f"a field name is given twice: {[f.name for f in self.fields]}")
        for f in self.fields:
            unknown = [a.tier for a in (*f.writers, *f.readers) if a.tier not in self.kind_of]
            if unknown:
                raise ConfigError(
                    f"field {f.name!r}: access on unknown tier {unknown[0]!r} ({self.tier_names})"
                )
        self.nbytes = np.array([f.nbytes for f in self.fields], dtype=np.int64)
        memo: dict[tuple[str, str, int], float] = {}

        def seconds(src: str, dst: str, n: int) -> float:
            if (src, dst, n) not in memo:
                try:  # within a tier without a self link: free; no link: inf, not a candidate
                    free = src == dst and topology.link(src, dst) is None
                    memo[src, dst, n] = 0.0 if free else float(topology.transfer_seconds(src, dst, n))
                except ConfigError:
                    memo[src, dst, n] = math.inf
            return memo[src, dst, n]

        def cost(f: Field, t: str) -> float:
            write = sum(a.per_iteration * seconds(a.tier, t, f.nbytes) for a in f.writers if a.per_iteration)
            return write + sum(
                a.per_iteration * seconds(t, a.tier, f.nbytes) for a in f.readers if a.per_iteration
            )

        self.cost = np.array([[cost(f, t) for t in self.tier_names] for f in self.fields], dtype=float)
        self.cost = self.cost.reshape(self.n_fields, self.n_tiers)
        self._pin(dict(pins or {}))
        self.allowed = np.isfinite(self.cost) & (self.nbytes[:, None] <= self.budget[None, :])

    def _pin(self, pins: dict[str, str]) -> None:
        """A pinned field may only use its pinned tier (every other tier's cost becomes inf)."""
        names = [f.name for f in self.fields]
        for name, tier in pins.items():
            if name not in names or tier not in self.kind_of:
                raise ConfigError(
                    f"pin {name!r} -> {tier!r}: unknown field or tier (fields {names}; tiers {self.tier_names})"
                )
            i, j = names.index(name), self.tier_names.index(tier)
            if not math.isfinite(self.cost[i, j]):
                raise ConfigError(f"pin {name!r} -> {tier!r}: that tier lacks a link to or from an access")
            keep = self.cost[i, j]
            self.cost[i, :] = math.inf
            self.cost[i, j] = keep

    def tiers_of_kind(self, kind: str) -> list[str]:
        found = [t for t in self.tier_names if self.kind_of[t] == kind]
        if not found:
            raise ConfigError(f"the topology has no {kind!r} tier ({self.tier_names})")
        return found

    def check_fits(self) -> None:
        """The errors that need no search: a field no tier links to, one too big for every tier, and
        demand over the total budget."""
        reach = np.isfinite(self.cost)
        for i, f in enumerate(self.fields):
            if not reach[i].any():
                raise ConfigError(f"field {f.name!r}: no tier has links to and from all of its accesses")
        homeless = [i for i in range(self.n_fields) if not self.allowed[i].any()]
        if homeless:
            i = max(homeless, key=lambda k: int(self.nbytes[k]))
            cand = np.flatnonzero(reach[i])
            j = int(cand[np.argmax(self.budget[cand])])
            missing, tier = int(self.nbytes[i] - self.budget[j]), self.tier_names[j]
            raise PlacementCapacityError(
                f"{len(homeless)} field(s) fit on no tier ({', '.join(self.fields[k].name for k in homeless)});"
                f" the largest, {self.fields[i].name!r} ({self.nbytes[i]} bytes), misses {missing} bytes on its"
                f" largest tier {tier} (budget {self.budget[j]} bytes: capacity minus headroom"
                f" {self.headroom.get(tier, 0)})",
                missing,
                [tier],
            )
        demand, supply = int(self.nbytes.sum()), int(self.budget.sum())
        if demand > supply:
            raise PlacementCapacityError(
                f"total demand {demand} bytes exceeds the total budget {supply} bytes of tiers"
                f" {', '.join(self.tier_names)}: {demand - supply} bytes missing",
                demand - supply,
                self.tier_names,
            )

    def used(self, assign: np.ndarray) -> np.ndarray:
        placed = assign >= 0
        return np.bincount(assign[placed], weights=self.nbytes[placed], minlength=self.n_tiers).astype(
            np.int64
        )

    def total(self, assign: np.ndarray) -> float:
        return float(self.cost[np.arange(self.n_fields), assign].sum())

    def to_plan(self, assign: np.ndarray, method: str) -> Plan:
        names = [f.name for f in self.fields]
        per_field = {n: float(self.cost[i, assign[i]]) for i, n in enumerate(names)}
        return Plan(
            assignment={n: self.tier_names[assign[i]] for i, n in enumerate(names)},
            predicted_s=float(sum(per_field.values())),
            per_field_s=per_field,
            tier_bytes=dict(zip(self.tier_names, map(int, self.used(assign)), strict=True)),
            method=method,
            costs={
                n: dict(zip(self.tier_names, map(float, self.cost[i]), strict=True))
                for i, n in enumerate(names)
            },
            budgets=dict(zip(self.tier_names, map(int, self.budget), strict=True)),
            field_bytes=dict(zip(names, map(int, self.nbytes), strict=True)),
        )

    def fixed(self, placement: Mapping[str, str], method: str) -> Plan:
        assign = np.array([self.tier_names.index(placement[f.name]) for f in self.fields], dtype=np.int64)
        for i, f in enumerate(self.fields):
            if not math.isfinite(self.cost[i, assign[i]]):
                raise ConfigError(
                    f"{method}: {f.name!r} on {placement[f.name]} lacks a link to or from an access"
                )
        used = self.used(assign)
        over = np.flatnonzero(used > self.budget)
        if len(over):
            missing = int((used - self.budget)[over].sum())
            detail = ", ".join(
                f"{self.tier_names[j]} needs {used[j]} of budget {self.budget[j]}" for j in over
            )
            tiers = [self.tier_names[j] for j in over]
            raise PlacementCapacityError(
                f"{method} does not fit: {missing} bytes missing ({detail})", missing, tiers
            )
        return self.to_plan(assign, f"baseline {method}")


def _fmt_s(seconds: float) -> str:
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    for unit, size in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e6:.3g} us"


def _fmt_b(nbytes: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"
