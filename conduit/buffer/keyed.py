"""A store of columns by key on one node's tiers, with writes in place by processes on the same node.

:class:`KeyedStore` holds one :class:`~conduit.buffer.rows.RowArray` per tensor column (fixed or
ragged) and one :class:`ObjectRows` per column of Python objects, all within one
:class:`~conduit.buffer.rows.TierBudgets`. Every call works on a batch of keys.

Two ways in: :meth:`KeyedStore.write` (the data is copied in), and for a writer on the same node
:meth:`KeyedStore.plan_write` (fresh rows of the mapped columns, which the writer fills in place with
:func:`~conduit.buffer.mapped.write_mapped`) then :meth:`KeyedStore.commit` (metadata only: the row
lengths; the keys become visible, all columns at once). A plan never committed (its writer died) is
released after ``lease_s``; a plan whose column grew into a new file meanwhile is refused (its rows were
written into the old file): the writer plans again. Every write is all or nothing: every column's
spec and growth within the budgets is checked, and the arrays grown, before any column is written.

Tiers: a column pinned by hand stays on its tier (or spills, :data:`~conduit.buffer.rows.SPILL_ORDER`);
with ``default_tier="auto"`` the others are planned by the placement planner as they grow
(:func:`conduit.placer.plan_mapped_tiers`, on this machine's measured tiers).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from conduit.batch import Ragged
from conduit.buffer.mapped import Layout
from conduit.buffer.rows import MAPPABLE, TIERS, RowArray, TierBudgets
from conduit.discovery import local_topology
from conduit.errors import ConfigError, SchemaError
from conduit.placer import plan_mapped_tiers

logger = logging.getLogger(__name__)

AUTO = "auto"  # default_tier: columns not pinned by hand are planned
Data = torch.Tensor | Ragged | list
SCALAR, JAGGED, OBJECT = "scalar", "jagged", "object"  # the kinds of column: fixed, ragged, objects


@dataclass(frozen=True)
class Spec:
    """What a column holds: ``dtype`` (None: Python objects), the per-item (fixed) or per-token (ragged)
    ``shape``, and whether it is ``ragged``."""

    dtype: torch.dtype | None
    shape: tuple[int, ...] = ()
    ragged: bool = False

    @property
    def kind(self) -> str:
        return OBJECT if self.dtype is None else JAGGED if self.ragged else SCALAR

    @staticmethod
    def of_kind(kind: str, dtype: torch.dtype | None, shape: tuple[int, ...]) -> Spec:
        return Spec(None) if kind == OBJECT else Spec(dtype, tuple(shape), kind == JAGGED)

    @staticmethod
    def of(data: Data) -> Spec:
        if isinstance(data, Ragged):
            return Spec(data.values.dtype, tuple(data.values.shape[1:]), True)
        if isinstance(data, torch.Tensor):
            return Spec(data.dtype, tuple(data.shape[1:]))
        return Spec(None)


class ObjectRows:
    """A column of Python objects by key (strings, dicts: items without an array form). Host memory,
    never mapped, never grown."""

    tier = wanted_tier = "host"
    spilled, nbytes, generation = False, 0, 0

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}

    def missing(self, keys: torch.Tensor) -> list[int]:
        return [k for k in keys.tolist() if k not in self.items]

    def write(self, keys: torch.Tensor, data: list, rows: Any = None) -> None:
        self.items.update(zip(keys.tolist(), data))

    def read(self, keys: torch.Tensor) -> list:
        return [self.items[k] for k in keys.tolist()]

    def clear(self, keys: torch.Tensor) -> None:
        for k in keys.tolist():
            self.items.pop(k, None)

    def layout(self) -> None:
        return None

    def close(self) -> None:
        self.items.clear()


Column = RowArray | ObjectRows


def spec_of(column: Column) -> Spec:
    if isinstance(column, ObjectRows):
        return Spec(None)
    return Spec(column.dtype, column.shape, column.ragged)


class KeyedStore:
    """Columns by key on this node's tiers (see the module docstring); ``pins``: column → tier;
    ``budgets``: tier → bytes; ``directory``: where ``disk`` columns' files go; ``noun`` and ``keys_noun``:
    how errors and logs name a column and the keys (TransferQueue's: ``field``, ``global indexes``)."""

    def __init__(self, pins: dict[str, str] | None = None, budgets: dict[str, int] | None = None,
                 default_tier: str = AUTO, directory: str | None = None, lease_s: float = 600.0,
                 noun: str = "column", keys_noun: str = "keys") -> None:  # fmt: skip
        self.pins = dict(pins or {})
        for name, tier in self.pins.items():
            if tier not in TIERS:
                raise ConfigError(f"pin {name}={tier!r}: unknown tier; tiers: {', '.join(TIERS)}")
        if default_tier not in (AUTO, *TIERS):
            raise ConfigError(
                f"default_tier={default_tier!r}: unknown tier; tiers: {AUTO}, {', '.join(TIERS)}"
            )
        self.default_tier, self.lease_s = default_tier, lease_s
        self.directory = directory or tempfile.gettempdir()
        self.noun, self.keys_noun = noun, keys_noun
        self.budgets = TierBudgets(budgets)
        self.columns: dict[str, Column] = {}
        self.counters: dict[str, int] = {}
        self.puts: dict[str, int] = {}  # per column: writes and reads so far (the planner's traffic)
        self.reads: dict[str, int] = {}
        # open write plans: id -> (deadline, {column: (its generation, reserved rows)})
        self.plans: dict[int, tuple[float, dict[str, tuple[int, torch.Tensor]]]] = {}
        self._plan_ids = 0

    def _count(self, key: str, n: int) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def check(self, name: str, spec: Spec) -> None:
        """:class:`SchemaError` if column ``name`` holds something else than ``spec``."""
        column = self.columns.get(name)
        if column is not None and (has := spec_of(column)) != spec:
            raise SchemaError(
                f"{self.noun} {name!r} holds {has.kind} {has.dtype} {has.shape}; a write brought {spec.kind} "
                f"{spec.dtype} {spec.shape} (clear the {self.noun}'s {self.keys_noun} first)"
            )

    def _create(self, name: str, spec: Spec) -> None:
        if name in self.columns:
            return
        if spec.dtype is None:
            self.columns[name] = ObjectRows()
            return
        tier = self.pins.get(name, self.default_tier)
        tier = "shm" if tier == AUTO else tier
        self.columns[name] = RowArray(
            name, spec.dtype, spec.shape, spec.ragged, tier, self.budgets, self.directory, self.noun
        )

    def _grow(self, needs: dict[str, tuple[Spec, int, int]]) -> None:
        """Make room in every column of ``needs`` (``{column: (spec, new rows, longest)}``, created as
        needed), or raise with nothing changed: every growth is tried against a copy of the budgets
        first; a column created here is dropped again if a later one fails."""
        created = [name for name in needs if name not in self.columns]
        try:
            for name, (spec, _, _) in needs.items():
                self._create(name, spec)
            arrays = [
                (c, n, longest)
                for name, (_, n, longest) in needs.items()
                if isinstance(c := self.columns[name], RowArray)
            ]
            if self.default_tier == AUTO and any(
                c.next_nbytes(n, longest) is not None for c, n, longest in arrays
            ):
                self._plan({c.name: c.next_nbytes(n, longest) for c, n, longest in arrays})
            free = dict(self.budgets.free)
            for c, n, longest in arrays:
                c.try_grow(n, longest, free)
            for c, n, longest in arrays:
                c.grow(n, longest)
        except BaseException:
            for name in created:
                self.columns.pop(name).close()
            raise

    def write(self, keys: torch.Tensor, data: dict[str, Data]) -> None:
        """Store (or overwrite) ``data``'s columns for ``keys`` (distinct): all of them, or none."""
        specs = {name: Spec.of(d) for name, d in data.items()}
        for name, spec in specs.items():
            self.check(name, spec)
        found = {n: c.index.find(keys) for n in data if isinstance(c := self.columns.get(n), RowArray)}
        self._grow(
            {
                name: (
                    specs[name],
                    int((found[name] < 0).sum()) if name in found else keys.numel(),
                    _longest(d),
                )
                for name, d in data.items()
            }
        )
        for name, d in data.items():
            self.columns[name].write(keys, d, found.get(name))  # type: ignore[arg-type]
            self.puts[name] = self.puts.get(name, 0) + 1
            self._count("bytes_put", _nbytes(d))
            self._count("bytes_put_copied", _nbytes(d))
        if data:
            self._count("puts", 1)

    # -- a same-node writer: plan, write in place, commit ----------------------------------------------

    def plan_write(
        self, keys: torch.Tensor, specs: dict[str, tuple[Spec, int]]
    ) -> tuple[int, dict[str, tuple[Layout, np.ndarray]]]:
        """Fresh rows for a same-node writer to fill in place, per mappable column of ``specs``
        (``{column: (spec, longest item)}``, each checked first): ``(plan id, {column: (layout, rows)})``.
        Columns not in the answer (objects, unmappable tiers) go with the commit as data. Plan id 0: no plan."""
        self.expire()
        for name, (spec, _) in specs.items():
            self.check(name, spec)
        mapped = {name: s for name, s in specs.items() if self._mappable(name, s[0])}
        n = keys.numel()
        self._grow({name: (spec, n, longest) for name, (spec, longest) in mapped.items()})
        held: dict[str, tuple[int, torch.Tensor]] = {}
        for name, (_, longest) in mapped.items():
            column = self.columns[name]
            assert isinstance(column, RowArray)
            rows = column.reserve(n, longest)
            if column.tier in MAPPABLE:
                held[name] = (column.generation, rows)
            else:  # spilled to a tier the writer cannot map: this column goes as data
                column.release(rows)
        if not held:
            return 0, {}
        self._plan_ids += 1
        self.plans[self._plan_ids] = (time.monotonic() + self.lease_s, held)
        self._count("write_plans", 1)
        out = {}
        for name, (_, rows) in held.items():
            layout = self.columns[name].layout()
            assert layout is not None  # a column on shm or disk
            out[name] = (layout, rows.numpy())
        return self._plan_ids, out

    def _mappable(self, name: str, spec: Spec) -> bool:
        """Whether a writer can fill column ``name`` in place: a tensor column on (or bound for) shm/disk."""
        column = self.columns.get(name)
        if spec.dtype is None:
            return False
        if column is not None:
            return column.tier in MAPPABLE
        return self.pins.get(name, self.default_tier) in (AUTO, *MAPPABLE)

    def commit(
        self, plan_id: int, keys: torch.Tensor, lengths: dict[str, Any], data: dict[str, Data]
    ) -> bool:
        """Make a plan's rows (``lengths``: per column its items' lengths, None for fixed rows) and
        ``data`` (the rest) the columns of ``keys``, all at once. False, and nothing stored, when the plan
        is unknown (expired) or stale (a column grew into a new file since): write again."""
        entry = self.plans.pop(plan_id, None) if type(plan_id) is int else None
        if entry is None:  # expired: its rows are free again, maybe another plan's now
            self._count("plans_refused", 1)
            return False
        held = entry[1]
        try:
            if not isinstance(lengths, dict) or set(held) != set(lengths):
                names = sorted(lengths) if isinstance(lengths, dict) else type(lengths).__name__
                raise SchemaError(
                    f"commit of plan {plan_id} names {self.noun}s {names}, the plan {sorted(held)}"
                )
            if set(held) & set(data):
                raise SchemaError(
                    f"commit of plan {plan_id} sends planned {self.noun}s {sorted(set(held) & set(data))} as data"
                )
            if any(rows.numel() != keys.numel() for _, rows in held.values()):
                raise SchemaError(f"commit of plan {plan_id}: {keys.numel()} keys for the plan's rows")
            lens = {name: self._lengths(name, keys, lengths[name]) for name in held}
            if any(self.columns[n].generation != gen for n, (gen, _) in held.items()):
                self._drop(held)
                self._count("plans_refused", 1)
                return False
            self.write(keys, data)  # the data first: if it does not fit, nothing of the plan is visible
        except Exception:
            self._drop(held)
            raise
        for name, (_, rows) in held.items():
            column = self.columns[name]
            assert isinstance(column, RowArray)
            column.commit(keys, rows, lens[name])
            self.puts[name] = self.puts.get(name, 0) + 1
            nbytes = _mapped_bytes(column, lens[name], keys.numel())
            self._count("bytes_put", nbytes)
            self._count("bytes_put_direct", nbytes)
        if not data:
            self._count("puts", 1)
        return True

    def _lengths(self, name: str, keys: torch.Tensor, lengths: Any) -> torch.Tensor | None:
        column = self.columns[name]
        if not isinstance(column, RowArray) or not column.ragged:
            return None
        try:
            lens = torch.from_numpy(np.array(lengths, dtype=np.int64, copy=True)).flatten()
        except (TypeError, ValueError, OverflowError) as e:
            raise SchemaError(f"{column.what}: commit of lengths that are not integers: {e}") from e
        if lens.numel() != keys.numel() or (
            lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > column.max_len)
        ):
            raise SchemaError(
                f"{column.what}: commit of {lens.numel()} lengths for {keys.numel()} keys, each in [0, {column.max_len}]"
            )
        return lens

    def abandon(self, plan_id: int, count: bool = True) -> None:
        """Release a plan's rows (its writer gives up; ``count``: counted as abandoned, else its commit
        was refused before it reached this store)."""
        entry = self.plans.pop(plan_id, None) if type(plan_id) is int else None
        if entry is not None:
            self._drop(entry[1])
            if count:
                self._count("plans_abandoned", 1)

    def _drop(self, held: dict[str, tuple[int, torch.Tensor]]) -> None:
        for name, (_, rows) in held.items():
            column = self.columns.get(name)
            if isinstance(column, RowArray):
                column.release(rows)

    def expire(self) -> None:
        """Release the rows of plans past their lease (their writers died between plan and commit)."""
        now = time.monotonic()
        for plan_id in [p for p, (deadline, _) in self.plans.items() if deadline < now]:
            self._drop(self.plans.pop(plan_id)[1])
            self._count("plans_expired", 1)

    def _plan(self, grown: dict[str, int | None]) -> None:
        """Before a write that grows a column (``grown``: its bytes after the write, None if it fits):
        plan every unpinned column's tier; the new tier is taken when the column next grows."""
        arrays = {n: c for n, c in self.columns.items() if n not in self.pins and isinstance(c, RowArray)}
        if not arrays:
            return
        sizes = {n: grown.get(n) or c.nbytes for n, c in arrays.items()}
        budgets = dict(self.budgets.free)
        for c in arrays.values():  # what the planned columns hold now is theirs to re-place
            left = budgets.get(c.tier)
            if left is not None:
                budgets[c.tier] = left + c.nbytes
        for name, tier in (
            plan_mapped_tiers(sizes, self.puts, self.reads, budgets, local_topology()) or {}
        ).items():
            arrays[name].wanted_tier = tier

    # -- reads -------------------------------------------------------------------------------------

    def column(self, name: str, keys: torch.Tensor) -> Column:
        """Column ``name``, holding every one of ``keys`` (:class:`SchemaError` naming the missing keys)."""
        column = self.columns.get(name)
        missing = keys.tolist() if column is None else column.missing(keys)
        if missing:
            raise SchemaError(f"{self.noun} {name!r} is not stored for {self.keys_noun} {missing[:8]}")
        assert column is not None
        return column

    def read(self, keys: torch.Tensor, names: Iterable[str]) -> dict[str, Data]:
        """The columns ``names`` of ``keys``, gathered (one copy each)."""
        out = {}
        for name in names:
            out[name] = self.column(name, keys).read(keys)
            self.reads[name] = self.reads.get(name, 0) + 1
            self._count("bytes_get_copied", _nbytes(out[name]))
        return out

    def read_plan(self, keys: torch.Tensor, names: Iterable[str], same_node: bool) -> dict[str, Any]:
        """Per column: where a same-node reader maps it, ``(layout, lengths or None, rows)``, or its data."""
        out: dict[str, Any] = {}
        for name in names:
            column = self.column(name, keys)
            layout = column.layout() if same_node else None
            if layout is None or not isinstance(column, RowArray):
                out.update(self.read(keys, [name]))
                continue
            self.reads[name] = self.reads.get(name, 0) + 1
            rows = column.index.find(keys)
            lengths = column.lengths.index_select(0, rows) if column.ragged else None
            self._count("bytes_get_mapped", _mapped_bytes(column, lengths, keys.numel()))
            out[name] = (layout, lengths, rows)
        return out

    def clear(self, keys: torch.Tensor) -> None:
        """Forget every column of ``keys``."""
        for column in self.columns.values():
            column.clear(keys)

    def stats(self) -> dict[str, Any]:
        """Counters, and per column its tier (and whether it spilled there) and bytes."""
        return {
            **self.counters,
            "plans_open": len(self.plans),
            "columns": {
                n: {"tier": c.tier, "wanted": c.wanted_tier, "spilled": c.spilled, "bytes": c.nbytes}
                for n, c in self.columns.items()
            },
        }

    def close(self) -> None:
        for column in self.columns.values():
            column.close()
        self.columns.clear()


def _longest(data: Data) -> int:
    return int(data.lengths.max()) if isinstance(data, Ragged) and len(data) else 0


def _nbytes(data: Data) -> int:
    return 0 if isinstance(data, list) else int(data.nbytes)


def _mapped_bytes(column: RowArray, lengths: torch.Tensor | None, n: int) -> int:
    tokens = n if lengths is None else int(lengths.sum())
    return tokens * math.prod(column.shape) * column.dtype.itemsize
