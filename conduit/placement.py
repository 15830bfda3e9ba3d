"""The placement planner: which memory tier each field lives on, and why.

Cost model. A field of ``bytes_per_item * items`` bytes on tier ``t`` costs, per iteration,
``sum(w.per_iteration * transfer_seconds(w.tier, t, nbytes) for w in writers)`` plus
``sum(r.per_iteration * transfer_seconds(t, r.tier, nbytes) for r in readers)``; the topology's
``transfer_seconds`` includes the link's latency. An access on the field's own tier uses that tier's
self link, and costs nothing if the topology has none. A tier without a link from (to) one of the
field's accesses is not a candidate for it. A tier holds at most its capacity minus its headroom
(e.g. the model's memory on a GPU).

Solvers. ``plan`` minimises the summed seconds subject to the budgets:

- exact when ``fields × tiers <= exact_limit``: a MILP solved by SciPy's HiGHS (binary
  ``x[field, tier]``, one tier per field, one capacity row per tier);
- the heuristic above that (or if HiGHS stops without an answer):
  1. regret greedy (Martello-Toth): repeatedly place the field that loses the most seconds per byte
     if it misses its cheapest tier with room, on that tier; regrets are recomputed as tiers fill.
     If a field is left over, start again packing first (most constrained and largest fields
     first, best fit); if one is still left over, ``plan`` asks the MILP (time-limited);
  2. re-packing (large-neighbourhood search): for each pair, then each triple, of tiers, re-solve
     exactly (a small HiGHS MILP) the fields on them plus up to 48 fields elsewhere that would be
     cheaper there; each field may also stay or leave for its best other tier with room; sweep
     while something improves, for at most ``HEURISTIC_TIME_S``.

  Tested bound (``tests/test_placement.py``): on 50 seeded random instances, half of them with a
  binding budget, its predicted seconds stay within ``HEURISTIC_FACTOR`` = 1.25× of the optimum.
  Measured: optimal on those 50, and on 1,508 of 1,512 more feasible instances of a sweep down to
  the edge of feasibility; on the other 4 it found no packing, and ``plan`` fell back to the MILP
  (it always asks the MILP before it reports that nothing fits).

Named baselines (``all_pageable_host``, ``pinned_zero_copy``, ``one_gpu``, ``sharded_gpus``) price
fixed placements with the same model, so they compare directly with the planner's plan; the
migration policies ``greedy_fastest`` (each field in order on its cheapest tier with room left) and
``conservative`` (everything on the largest tier, which always fits) do too. ``price`` prices any
given placement. ``pins`` (field → tier) fix fields by hand: the solvers only move the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from conduit.errors import ConfigError, PlacementCapacityError
from conduit.placement_solvers import _exact, _heuristic, _pack

if TYPE_CHECKING:
    from conduit.topology import Topology

HEURISTIC_FACTOR = 1.25  # the heuristic's tested bound: predicted seconds <= this × the optimum
DEFAULT_EXACT_LIMIT = 2000  # field × tier variables


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


def plan(
    fields: Sequence[Field],
    topology: Topology,
    headroom: Mapping[str, int] | None = None,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    pins: Mapping[str, str] | None = None,
) -> Plan:
    """The placement minimising predicted transfer seconds per iteration within every tier's budget.

    Exact (HiGHS MILP) when ``len(fields) * len(topology.tiers) <= exact_limit``, else the heuristic of
    the module docstring. Raises ``PlacementCapacityError`` (a ``CapacityError``) naming the missing
    bytes and the tiers when it cannot fit, ``ConfigError`` for malformed input.
    """
    model = _Model(fields, topology, headroom, pins)
    model.check_fits()
    if model.n_fields == 0:
        return model.to_plan(np.zeros(0, dtype=np.int64), "empty")
    small = model.n_fields * model.n_tiers <= exact_limit
    exact = _exact(model) if small else None
    if exact is not None:
        return exact
    assign = _heuristic(model)
    if assign is None:
        exact = None if small else _exact(model)  # no packing found: ask the MILP before giving up
        if exact is None:
            raise model.packing_error()
        return exact
    return model.to_plan(assign, "heuristic (regret greedy + re-packing by tier pairs/triples)")


def should_replan(current: Plan, candidate: Plan, threshold: float = 0.1) -> bool:
    """Hysteresis: move only when ``candidate`` predicts more than ``threshold`` (a fraction) less."""
    if not 0.0 <= threshold < 1.0:
        raise ConfigError(f"threshold must be in [0, 1), got {threshold}")
    if not math.isfinite(current.predicted_s):
        return math.isfinite(candidate.predicted_s)
    return candidate.predicted_s < current.predicted_s * (1.0 - threshold)


# ---------------------------------------------------------------------------------------- baselines

_Headroom = Mapping[str, int] | None


def all_pageable_host(fields: Sequence[Field], topology: Topology, headroom: _Headroom = None) -> Plan:
    """A request-driven buffer service: every field in pageable memory of the first host tier."""
    return _baseline("all_pageable_host", "host", fields, topology, headroom, lambda m, tiers, i, f: tiers[0])


def pinned_zero_copy(fields: Sequence[Field], topology: Topology, headroom: _Headroom = None) -> Plan:
    """Pinned host memory with device-side gather: each field on the pinned tier of its first reader's
    node (its first writer's without readers; the first pinned tier without either)."""

    def near(m: _Model, pinned: list[str], i: int, f: Field) -> str:
        by_node = {m.node_of[t]: t for t in reversed(pinned)}
        acc = (*f.readers, *f.writers)
        return by_node.get(m.node_of[acc[0].tier], pinned[0]) if acc else pinned[0]

    return _baseline("pinned_zero_copy", "pinned", fields, topology, headroom, near)


def one_gpu(fields: Sequence[Field], topology: Topology, headroom: _Headroom = None) -> Plan:
    """Everything on the first HBM tier."""
    return _baseline("one_gpu", "hbm", fields, topology, headroom, lambda m, tiers, i, f: tiers[0])


def sharded_gpus(fields: Sequence[Field], topology: Topology, headroom: _Headroom = None) -> Plan:
    """Fields round-robin over the HBM tiers, in field order."""
    return _baseline(
        "sharded_gpus", "hbm", fields, topology, headroom, lambda m, tiers, i, f: tiers[i % len(tiers)]
    )


BASELINES: dict[str, Callable[..., Plan]] = {
    b.__name__: b for b in (all_pageable_host, pinned_zero_copy, one_gpu, sharded_gpus)
}


def price(
    fields: Sequence[Field], topology: Topology, placement: Mapping[str, str], headroom: _Headroom = None
) -> Plan:
    """``placement`` priced by the planner's model (``PlacementCapacityError`` if it does not fit)."""
    missing = [f.name for f in fields if f.name not in placement]
    if missing:
        raise ConfigError(f"price: no tier given for field(s) {missing}")
    return _Model(fields, topology, headroom).fixed(placement, "given")


def greedy_fastest(fields: Sequence[Field], topology: Topology, headroom: _Headroom = None) -> Plan:
    """Fill the fastest tier until it runs out: each field in the given order on its cheapest tier
    with room left (``PlacementCapacityError`` if a field finds none)."""
    model = _Model(fields, topology, headroom)
    free = model.budget.copy()
    assign = np.full(model.n_fields, -1, dtype=np.int64)
    for i in range(model.n_fields):
        ok = np.flatnonzero(np.isfinite(model.cost[i]) & (model.nbytes[i] <= free))
        if not len(ok):
            raise model.packing_error()
        j = int(ok[np.argmin(model.cost[i, ok])])
        assign[i], free[j] = j, free[j] - model.nbytes[i]
    return model.to_plan(assign, "baseline greedy_fastest")


def conservative(fields: Sequence[Field], topology: Topology, headroom: _Headroom = None) -> Plan:
    """Everything on the tier with the largest budget (on one node: disk), the placement that fits
    longest as fields grow."""
    model = _Model(fields, topology, headroom)
    reach = np.isfinite(model.cost).all(axis=0) if model.n_fields else np.ones(model.n_tiers, bool)
    cand = np.flatnonzero(reach)
    if not len(cand):
        raise ConfigError("conservative: no tier links to every field's accesses")
    tier = model.tier_names[int(cand[np.argmax(model.budget[cand])])]
    return model.fixed({f.name: tier for f in model.fields}, "conservative")


def _baseline(
    name: str,
    kind: str,
    fields: Sequence[Field],
    topology: Topology,
    headroom: _Headroom,
    choose: Callable[[_Model, list[str], int, Field], str],
) -> Plan:
    model = _Model(fields, topology, headroom)
    tiers = model.tiers_of_kind(kind)
    return model.fixed({f.name: choose(model, tiers, i, f) for i, f in enumerate(model.fields)}, name)


# -------------------------------------------------------------------------------------------- model


class _Model:
    """Validated input as arrays: cost[f, t] seconds (inf: no link), nbytes[f], budget[t], allowed[f, t]."""

    def __init__(
        self,
        fields: Sequence[Field],
        topology: Topology,
        headroom: _Headroom,
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

    def packing_error(self) -> PlacementCapacityError:
        """Demand fits in total but no packing exists: the smallest field left over by a packing that
        puts the most constrained fields first, each where most room is left, and its gap."""
        _, free, unplaced = _pack(self, worst_fit=True)
        i = min(unplaced, key=lambda k: int(self.nbytes[k])) if unplaced else 0
        cand = np.flatnonzero(self.allowed[i])
        j = int(cand[np.argmax(free[cand])])
        missing = int(self.nbytes[i] - free[j])
        return PlacementCapacityError(
            f"demand {int(self.nbytes.sum())} bytes is within the total budget {int(self.budget.sum())} bytes"
            f" but no packing fits: field {self.fields[i].name!r} ({self.nbytes[i]} bytes) misses {missing}"
            f" bytes on {self.tier_names[j]}, the largest gap left on a tier it can use",
            missing,
            [self.tier_names[j]],
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
