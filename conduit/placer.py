"""Planned placement of a running buffer: plan its columns onto tiers, and re-plan as it changes.

A :class:`Placer` turns the buffer's columns into the planner's fields (bytes per item as stored,
padding included; ``capacity`` items each), the :class:`Traffic` (who writes and reads how much) into their accesses (items written
from the producers' tier and read into each consumer's tier per iteration), and plans them on this
node's tiers of a :class:`~conduit.topology.Topology`. :meth:`Placer.place` migrates the columns whose
tier changes (``ExperienceBuffer.migrate``: online, pauses reported). Hysteresis: a new plan is
adopted only when the current placement no longer fits or the new one predicts more than
``threshold`` less time (``should_replan``). :meth:`Placer.grow` widens a ragged column (e.g. longer
responses) and re-plans in the same copy. Every adopted plan is logged with ``Plan.explain()``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from conduit.buffer.buffer import ExperienceBuffer
from conduit.buffer.migration import MigrationReport
from conduit.buffer.tiers import check_tier_available
from conduit.errors import ConduitError, ConfigError
from conduit.placement import Access, Field, PlacementCapacityError, Plan, plan, price, should_replan
from conduit.schema import Column, Schema
from conduit.topology import Tier, Topology

logger = logging.getLogger("conduit.placement")


@dataclass(frozen=True)
class Traffic:
    """Per iteration: ``items_written`` from the ``writer`` tier and ``items_read`` into the
    ``readers`` tiers (split evenly among them). Tiers are buffer tier strings: ``host``, ``cuda:0``."""

    items_written: int
    items_read: int
    writer: str = "host"
    readers: tuple[str, ...] = ("host",)

    def __post_init__(self) -> None:
        if self.items_written < 0 or self.items_read < 0 or not self.readers:
            raise ConfigError(f"traffic needs counts >= 0 and at least one reader, got {self}")


@dataclass
class Replan:
    """One adopted plan: why, the plan, and the migration that applied it."""

    reason: str
    plan: Plan
    migration: MigrationReport
    previous_s: float | None = None


@dataclass
class Placer:
    """Keeps ``buffer``'s columns on the tiers a plan for ``traffic`` on ``topology`` chooses
    (it becomes ``buffer.placer``, so ``buffer.grow_column`` re-plans through it).

    ``pins`` (column → buffer tier) are kept by hand; ``headroom`` (topology tier name → bytes) is
    kept free on a tier; ``node`` defaults to the topology's first node; ``memory_budget`` (bytes of
    RAM, see :func:`within_memory_budget`) caps what :meth:`replan` may put in memory (``topology``
    is already within it).
    """

    buffer: ExperienceBuffer
    topology: Topology
    traffic: Traffic
    pins: Mapping[str, str] = field(default_factory=dict)
    headroom: Mapping[str, int] = field(default_factory=dict)
    threshold: float = 0.1
    node: str | None = None
    memory_budget: int | None = None
    history: list[Replan] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.node = self.node or self.topology.nodes[0]
        self._tiers = usable_tiers(self.topology, self.node)  # buffer tier string -> topology tier
        names = self.buffer.schema.names
        for col, tier in self.pins.items():
            if col not in names:
                raise ConfigError(f"pin for unknown column {col!r}; the buffer stores {list(names)}")
            self._topo(tier, f"pin {col!r}")
        for tier in (self.traffic.writer, *self.traffic.readers):
            self._topo(tier, "traffic")
        self.buffer.placer = self  # the buffer's growth re-plans through this placer

    def _topo(self, tier: str, what: str) -> str:
        if tier not in self._tiers:
            raise ConfigError(
                f"{what}: tier {tier!r} is not usable on {self.node} (usable: {sorted(self._tiers)})"
            )
        return self._tiers[tier]

    @property
    def usable(self) -> dict[str, str]:
        """Buffer tier string → topology tier name, for the tiers this placer may use."""
        return dict(self._tiers)

    def fields(self, max_lens: Mapping[str, int] | None = None) -> list[Field]:
        """The planner's fields for the buffer's columns (ragged ones widened to ``max_lens``)."""
        return column_fields(self.buffer.schema, self.buffer.capacity, self.traffic, self._tiers, max_lens)

    def _current(self) -> dict[str, str]:
        return {n: self._tiers.get(t, t) for n, t in self.buffer.storage.tiers.items()}  # type: ignore[attr-defined]

    def _pins(self) -> dict[str, str]:
        return {c: self._tiers[t] for c, t in self.pins.items()}

    def candidate(self, max_lens: Mapping[str, int] | None = None) -> Plan:
        """The plan for the buffer as it is (or with ``max_lens`` applied)."""
        return plan(self.fields(max_lens), self.topology, self.headroom, pins=self._pins())

    def priced_current(self, max_lens: Mapping[str, int] | None = None) -> Plan | None:
        """The current placement priced at the current (or ``max_lens``) sizes; None if it no longer fits."""
        try:
            return price(self.fields(max_lens), self.topology, self._current(), self.headroom)
        except (PlacementCapacityError, ConfigError):
            return None

    def place(self, reason: str = "start", force: bool = False) -> Replan | None:
        """Plan, and migrate if the plan is adopted (see the module docstring); None when kept."""
        return self._apply(reason, None, force)[0]

    def replan(self, topology: Topology, reason: str) -> Replan | None:
        """Plan again on a new reading of this node's tiers (e.g. ``local_topology()``: free memory now)
        under :attr:`memory_budget`, and migrate if the plan is adopted; None when the placement is kept.

        The reading counts this buffer's own columns as used, so each tier gets their bytes back before
        the budget applies (a column that stays where it is needs no room beside itself)."""
        storage: Any = self.buffer.storage
        own: dict[str, int] = {}
        for name, tier in storage.tiers.items():
            t = next((x for x in topology.tiers_on(self.node or "") if x.buffer_tier == tier), None)
            if t is not None:
                own[t.name] = own.get(t.name, 0) + storage.column_nbytes(name)
        tiers = tuple(
            dataclasses.replace(t, capacity_bytes=t.capacity_bytes + own.get(t.name, 0))
            for t in topology.tiers
        )
        pinned = pinned_ram_bytes(self.buffer.schema, self.buffer.capacity, self.pins)
        fresh = within_memory_budget(
            Topology(tiers, topology.links, topology.source, topology.node_count),
            self.memory_budget,
            self.pins,
            pinned,
        )
        mine = set(self._tiers.values())
        for kind in {t.kind for t in fresh.tiers_on(self.node or "") if t.name not in mine}:
            fresh = fresh.without(kind)  # tiers this placer was not given (e.g. shm unpinned): still not
        if usable_tiers(fresh, self.node) != self._tiers:
            raise ConfigError(
                f"replan: the new reading's usable tiers {sorted(usable_tiers(fresh, self.node))} are not "
                f"this placer's {sorted(self._tiers)}"
            )
        self.topology = fresh
        return self._apply(reason, None, False)[0]

    def grow(self, column: str, max_len: int) -> MigrationReport:
        """Widen ragged ``column`` to ``max_len`` and re-plan in the same copy."""
        return self.resize({column: max_len})

    def resize(self, max_lens: Mapping[str, int]) -> MigrationReport:
        """Widen several ragged columns at once (``{column: max_len}``): one re-plan for all, and one
        copy per column that moves or grows (an adopted plan is also in :attr:`history`)."""
        what = ", ".join(f"{c} to max_len {n}" for c, n in max_lens.items())
        return self._apply(f"{what} (growth)", dict(max_lens), False)[1]

    def _apply(
        self, reason: str, max_lens: dict[str, int] | None, force: bool
    ) -> tuple[Replan | None, MigrationReport]:
        """The adopted plan (None: the current placement is kept) and the migration that ran."""
        cand = self.candidate(max_lens)
        cur = self.priced_current(max_lens)
        if not force and cur is not None and not should_replan(cur, cand, self.threshold):
            return None, self.buffer.migrate({}, max_lens) if max_lens else MigrationReport()
        target = cand
        moves = self._ordered_moves(target, max_lens)
        report = self.buffer.migrate(moves, max_lens)
        done = Replan(reason, target, report, None if cur is None else cur.predicted_s)
        self.history.append(done)
        before = "did not fit" if cur is None else f"predicted {cur.predicted_s:.3g} s/iter"
        logger.info(
            "conduit placement (%s; current placement %s; moved %d column(s), %.3g MB, max pause %.3g ms)\n%s",
            reason,
            before,
            len(report.moves),
            report.nbytes / 1e6,
            report.max_pause_s * 1e3,
            target.explain(),
        )
        return done, report

    def _ordered_moves(self, target: Plan, max_lens: Mapping[str, int] | None) -> dict[str, str]:
        """Moves ordered so that columns leave a tier before others arrive (the lowest transient peak)."""
        back = {v: k for k, v in self._tiers.items()}
        current = self._current()
        sizes = {f.name: f.nbytes for f in self.fields(max_lens)}
        pending = {
            n: t for n, t in target.assignment.items() if t != current[n] or (max_lens and n in max_lens)
        }
        free = {t: target.budgets.get(t, 0) for t in self._tiers.values()}
        for n, t in current.items():
            if t in free:
                free[t] -= column_nbytes(self.buffer.schema[n], self.buffer.capacity)
        order: dict[str, str] = {}
        while pending:
            fits = [n for n, t in pending.items() if sizes[n] <= free.get(t, 0)] or list(pending)
            n = min(fits, key=lambda k: sizes[k])
            t = pending.pop(n)
            free[t] = free.get(t, 0) - sizes[n]
            free[current[n]] = free.get(current[n], 0) + column_nbytes(
                self.buffer.schema[n], self.buffer.capacity
            )
            order[n] = back[t]
        return order


def column_nbytes(col: Column, capacity: int, max_len: int | None = None) -> int:
    """Bytes ``capacity`` slots of ``col`` take in a ring (ragged: padded rows plus an int64 length)."""
    per = math.prod(col.shape) * torch.empty((), dtype=col.dtype).element_size()
    if not col.ragged:
        return per * capacity
    return (per * int(max_len or col.max_len or 0) + 8) * capacity


def column_fields(
    schema: Schema,
    capacity: int,
    traffic: Traffic,
    tiers: Mapping[str, str],
    max_lens: Mapping[str, int] | None = None,
) -> list[Field]:
    """The planner's fields for ``schema``'s columns in a ring of ``capacity`` under ``traffic``;
    ``tiers`` maps buffer tier strings to the topology's tier names."""

    def topo(tier: str) -> str:
        if tier not in tiers:
            raise ConfigError(f"traffic: tier {tier!r} is not usable here (usable: {sorted(tiers)})")
        return tiers[tier]

    writers = (Access(topo(traffic.writer), traffic.items_written / capacity),)
    share = traffic.items_read / capacity / len(traffic.readers)
    readers = tuple(Access(topo(r), share) for r in traffic.readers)
    out = []
    for col in schema:
        nbytes = column_nbytes(col, capacity, (max_lens or {}).get(col.name))
        out.append(Field(col.name, math.ceil(nbytes / capacity), capacity, writers, readers))
    return out


def usable_tiers(topology: Topology, node: str | None = None) -> dict[str, str]:
    """Buffer tier string → topology tier name for ``node``'s tiers this machine can allocate."""
    found: dict[str, str] = {}
    for t in topology.tiers_on(node or topology.nodes[0]):
        try:
            check_tier_available(t.buffer_tier)
        except ConduitError:
            continue  # described (e.g. a GPU) but not on this machine: not a candidate
        found.setdefault(t.buffer_tier, t.name)
    return found


DRAM_KINDS = ("host", "pinned", "shm")  # tiers backed by the machine's RAM


def within_memory_budget(
    topology: Topology, budget: int | None, pins: Mapping[str, str] | None = None, pinned_bytes: int = 0
) -> Topology:
    """``topology`` with at most ``budget`` bytes of RAM for a buffer's planned columns.

    Host, pinned and shm memory are the same DRAM, but the planner gives each tier its own capacity; so
    under a budget the ``host`` tier keeps ``min(its free bytes, budget - pinned_bytes)`` (the bytes of
    columns ``pins`` put on RAM tiers by hand), the other RAM tiers stay only where a pin names them,
    and what does not fit goes to ``disk``. ``budget=None`` returns ``topology``. Raises
    :class:`PlacementCapacityError` when the pinned columns alone exceed the budget."""
    if budget is None:
        return topology
    if pinned_bytes > budget:
        raise PlacementCapacityError(
            f"columns pinned to RAM tiers take {pinned_bytes / 2**20:.1f} MiB, more than memory_budget="
            f"{budget / 2**20:.1f} MiB; raise the budget or pin them to 'disk'",
            missing_bytes=pinned_bytes - budget,
            tiers=[t.name for t in topology.tiers if t.kind in DRAM_KINDS],
        )
    named = set((pins or {}).values())
    keep = tuple(
        dataclasses.replace(t, capacity_bytes=min(t.capacity_bytes, budget - pinned_bytes))
        if t.kind == "host"
        else t
        for t in topology.tiers
        if t.kind == "host" or t.kind not in DRAM_KINDS or t.buffer_tier in named
    )
    names = {t.name for t in keep}
    links = tuple(lk for lk in topology.links if lk.src in names and lk.dst in names)
    return Topology(keep, links, f"{topology.source}; RAM budget {budget} bytes", topology.node_count)


def pinned_ram_bytes(schema: Schema, capacity: int, pins: Mapping[str, str]) -> int:
    """Bytes of the columns ``pins`` put on RAM tiers (host, pinned, shm) in a ring of ``capacity``."""
    return sum(column_nbytes(schema[c], capacity) for c, t in pins.items() if t in DRAM_KINDS)


def initial_tiers(
    schema: Schema,
    capacity: int,
    topology: Topology,
    traffic: Traffic,
    pins: Mapping[str, str] | None = None,
    headroom: Mapping[str, int] | None = None,
) -> tuple[dict[str, str], Plan]:
    """The tier (buffer tier string) per column for a new buffer, and the plan that chose it."""
    tiers = usable_tiers(topology)
    back = {v: k for k, v in tiers.items()}
    for col, tier in (pins or {}).items():
        if tier not in tiers:
            raise ConfigError(f"pin {col!r}: tier {tier!r} is not usable here (usable: {sorted(tiers)})")
    fields = column_fields(schema, capacity, traffic, tiers)
    chosen = plan(fields, topology, headroom, pins={c: tiers[t] for c, t in (pins or {}).items()})
    return {c: back[t] for c, t in chosen.assignment.items()}, chosen


def explain_history(history: Sequence[Replan]) -> str:
    """A short text of every adopted plan: reason, columns moved, bytes, longest pause."""
    lines = []
    for h in history:
        moved = ", ".join(f"{m.column} {m.src}->{m.dst}" for m in h.migration.moves) or "nothing moved"
        lines.append(
            f"{h.reason}: {moved} ({h.migration.nbytes / 1e6:.3g} MB, max pause {h.migration.max_pause_s * 1e3:.3g} ms)"
        )
    return "\n".join(lines)


MAPPED_TIERS = ("shm", "disk")  # the tiers a same-node reader maps: a planned choice keeps reads in place


def plan_mapped_tiers(
    sizes: Mapping[str, int],
    writes: Mapping[str, int],
    reads: Mapping[str, int],
    budgets: Mapping[str, int | None],
    topology: Topology,
) -> dict[str, str] | None:
    """A tier (``shm`` or ``disk``) per column of ``sizes`` (projected bytes) of a
    :class:`~conduit.buffer.keyed.KeyedStore`, priced by the planner with each column's observed
    traffic (``writes`` from host, ``reads`` into shm, plus one of each so a new column is not free) on
    ``topology``'s first node, within ``budgets`` (bytes per tier kind); None when no placement fits
    (the store's spill rule then decides)."""
    node = topology.nodes[0]
    chosen: list[Tier] = []
    names: dict[str, str] = {}
    for t in topology.tiers_on(node):  # host only as the writers' tier (no capacity: not a candidate)
        if t.kind not in ("host", *MAPPED_TIERS) or t.kind in names:
            continue
        cap = 0 if t.kind == "host" else t.capacity_bytes
        limit = budgets.get(t.kind)
        chosen.append(Tier(t.name, t.kind, t.node, cap if limit is None else min(cap, limit), t.device))
        names[t.kind] = t.name
    if not all(k in names for k in ("host", *MAPPED_TIERS)):
        return None
    kept = set(names.values())
    links = tuple(lk for lk in topology.links if lk.src in kept and lk.dst in kept)
    fields = [
        Field(
            n,
            nbytes,
            1,
            (Access(names["host"], 1 + writes.get(n, 0)),),
            (Access(names["shm"], 1 + reads.get(n, 0)),),
        )
        for n, nbytes in sizes.items()
    ]
    try:
        placed = plan(fields, Topology(tuple(chosen), links, topology.source))
    except ConduitError as e:
        logger.info("conduit keyed store: no planned placement (%s); the spill rule decides", e)
        return None
    back = {v: k for k, v in names.items()}
    logger.info("conduit keyed store: planned placement\n%s", placed.explain())
    return {name: back[tier] for name, tier in placed.assignment.items()}
