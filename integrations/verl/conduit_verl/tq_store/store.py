"""One node's Conduit store of TransferQueue fields (the state a storage actor holds).

Plain Python so it is testable without Ray; :mod:`conduit_verl.tq_store.backend` runs one per node as
a Ray actor. Every call is batch-level: one gather / scatter per field per call.

Two ways in: :meth:`NodeStore.put` (the data travels to the store and is copied in), and for a writer
on the same node :meth:`NodeStore.write_plan` (fresh rows of the mapped fields, for the writer to fill
in place) then :meth:`NodeStore.commit` (metadata only: the row lengths; the indexes become visible,
all fields at once). A plan never committed (its writer died) is released after ``lease_s``.

Every write is all or nothing: its keys (distinct, ``0 <= key <`` :data:`MAX_GLOBAL_INDEX`), every
field's column (kind, dtype, shape, offsets) and the growth of every field within the budgets are
checked, and the arrays grown, before any field is written; a refused write raises
:class:`StorageBackendError` and leaves every field as it was.
"""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

import numpy as np
import torch

from conduit_verl.errors import StorageBackendError
from conduit_verl.tq_store.columns import (
    JAGGED,
    OBJECT,
    SCALAR,
    Column,
    from_wire,
    to_wire,
    torch_dtype,
)
from conduit_verl.tq_store.fields import MAPPABLE, TIERS, Budgets, FieldArray
from conduit_verl.tq_store.planning import plan_store_tiers

#: the fields verl 0.9.1 writes to TransferQueue (what a placement entry may name)
VERL_FIELDS = (
    "prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "loss_mask",
    "rollout_log_probs", "rm_scores", "old_log_probs", "entropy", "ref_log_prob", "values", "advantages",
    "returns", "token_level_scores", "token_level_rewards", "routed_experts", "num_turns",
    "multi_modal_inputs", "teacher_log_probs", "teacher_ids",
)  # fmt: skip


AUTO = "auto"  # default_tier: fields not pinned by hand are planned (planning.py)
#: global indexes are ``0 <= key < MAX_GLOBAL_INDEX`` (TransferQueue counts them up from 0, reusing
#: cleared ones); a key outside raises :class:`StorageBackendError` naming it
MAX_GLOBAL_INDEX = 2**31
KINDS = (SCALAR, JAGGED, OBJECT)


def check_placement(placement: dict[str, str]) -> None:
    """Raise :class:`StorageBackendError` naming an unknown field or tier."""
    for field, tier in placement.items():
        if field not in VERL_FIELDS:
            raise StorageBackendError(
                f"placement names unknown field {field!r}; verl's fields: {', '.join(VERL_FIELDS)}"
            )
        if tier not in TIERS:
            raise StorageBackendError(f"placement.{field}={tier!r}: unknown tier; tiers: {', '.join(TIERS)}")


class NodeStore:
    """Fields of the samples routed to this node, slot = global index."""

    def __init__(
        self,
        placement: dict[str, str] | None = None,
        budgets: dict[str, int] | None = None,
        default_tier: str = AUTO,
        directory: str | None = None,
        lease_s: float = 600.0,
    ) -> None:
        self.placement = dict(placement or {})
        check_placement(self.placement)
        if default_tier not in (AUTO, *TIERS):
            raise StorageBackendError(
                f"default_tier={default_tier!r}: unknown tier; tiers: {AUTO}, {', '.join(TIERS)}"
            )
        self.default_tier = default_tier
        self.budgets = Budgets(budgets)
        self.directory = directory or tempfile.gettempdir()
        self.fields: dict[str, FieldArray] = {}
        self.counters: dict[str, int] = {}
        self.puts: dict[str, int] = {}  # per field: puts and reads so far (the planner's traffic)
        self.reads: dict[str, int] = {}
        self.lease_s = lease_s
        # open write plans: id -> (deadline, {field: (field generation, reserved rows)})
        self.plans: dict[int, tuple[float, dict[str, tuple[int, torch.Tensor]]]] = {}
        self._plan_ids = 0

    def _count(self, key: str, n: int) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def put(self, gis: np.ndarray, wires: dict[str, tuple]) -> None:
        """Store (or overwrite) ``wires`` fields for global indexes ``gis``: all of them, or (raising
        :class:`StorageBackendError`) none."""
        slots = _slots(gis, distinct=True)
        self._write(slots, self._checked(slots, wires))

    def _checked(self, slots: torch.Tensor, wires: dict[str, tuple]) -> dict[str, Column]:
        """The columns of ``wires``, every field checked before any is written."""
        if not isinstance(wires, dict):
            raise StorageBackendError(f"the fields of a put are a dict, not a {type(wires).__name__}")
        columns = {}
        for name, wire in wires.items():
            try:
                col = columns[name] = from_wire(wire)
            except StorageBackendError as e:
                raise StorageBackendError(f"field {name!r}: {e}") from None
            if col.size != slots.numel():
                raise StorageBackendError(f"field {name!r}: {col.size} values for {slots.numel()} keys")
            if name in self.fields:
                self.fields[name].check(col)
        return columns

    def _create(self, name: str, kind: str, dtype: torch.dtype | None, rest: tuple[int, ...]) -> FieldArray:
        if name not in self.fields:
            tier = self.placement.get(name, self.default_tier)
            tier = "shm" if tier == AUTO else tier
            self.fields[name] = FieldArray(name, kind, dtype, rest, tier, self.budgets, self.directory)
        return self.fields[name]

    def _grow(self, needs: dict[str, tuple[str, torch.dtype | None, tuple[int, ...], int, int]]) -> None:
        """Make room in every field of ``needs`` (``{field: (kind, dtype, rest, new rows, longest)}``,
        fields created as needed), or raise :class:`StorageBackendError` with nothing changed: every
        field's growth is tried against a copy of the budgets first; a field created here is dropped
        again if a later one fails (growth keeps contents, so a grown field is as it was)."""
        created = [name for name in needs if name not in self.fields]
        try:
            for name, (kind, dtype, rest, _, _) in needs.items():
                self._create(name, kind, dtype, rest)
            if self.default_tier == AUTO:
                self._plan({name: self.fields[name].next_nbytes(n, longest)
                            for name, (_, _, _, n, longest) in needs.items()})  # fmt: skip
            free = dict(self.budgets.free)
            for name, (_, _, _, n, longest) in needs.items():
                self.fields[name].try_grow(n, longest, free)
            for name, (_, _, _, n, longest) in needs.items():
                self.fields[name].grow(n, longest)
        except BaseException:
            for name in created:
                self.fields.pop(name).close()
            raise

    def _write(self, slots: torch.Tensor, columns: dict[str, Column]) -> None:
        """Write checked ``columns`` (:meth:`_checked`) of ``slots``: all of them, or none."""
        found = {name: self.fields[name].index.find(slots) for name in columns if name in self.fields}
        self._grow(
            {
                name: (
                    col.kind,
                    col.dtype,
                    col.rest,
                    int((found[name].numpy() < 0).sum()) if name in found else slots.numel(),
                    _longest(col),
                )
                for name, col in columns.items()
            }
        )
        for name, col in columns.items():
            self.fields[name].put(slots, col, found.get(name))
            self.puts[name] = self.puts.get(name, 0) + 1
            self._count("bytes_put", col.nbytes)
            self._count("bytes_put_copied", col.nbytes)
        if columns:
            self._count("puts", 1)

    # -- a same-node writer: plan, write in place, commit ----------------------------------------------

    def write_plan(self, gis: np.ndarray, specs: dict[str, tuple], same_node: bool) -> tuple[int, dict]:
        """Fresh rows for a same-node writer to fill in place, per mappable field of ``specs``
        (``{field: (kind, dtype, rest, longest)}``, :func:`~conduit_verl.tq_store.columns.spec_of`):
        ``(plan id, {field: (layout, rows)})``. Every field of ``specs`` is checked first (a field
        stored with another dtype or shape raises, naming it); fields not in the answer (objects,
        unmappable tiers, a writer on another node) go with the commit as data. Plan id 0: no plan."""
        slots = _slots(gis, distinct=True)
        self._expire()
        specs = _specs(specs)
        for name, (kind, dtype, rest, _) in specs.items():
            if name in self.fields:
                self.fields[name].check_spec(kind, dtype, rest)
        if not same_node or not slots.numel():
            return 0, {}
        return self._reserve(
            slots, {name: spec for name, spec in specs.items() if self._mappable(name, spec[0])}
        )

    def _mappable(self, name: str, kind: str) -> bool:
        """Whether a writer can fill field ``name`` in place: a tensor field on (or bound for) shm/disk."""
        field = self.fields.get(name)
        if kind == OBJECT:
            return False
        if field is not None:
            return field.tier in MAPPABLE
        return self.placement.get(name, self.default_tier) in (AUTO, *MAPPABLE)

    def _reserve(self, slots: torch.Tensor, specs: dict[str, tuple]) -> tuple[int, dict]:
        n = slots.numel()
        self._grow(
            {name: (kind, dtype, rest, n, longest) for name, (kind, dtype, rest, longest) in specs.items()}
        )
        held: dict[str, tuple[int, torch.Tensor]] = {}
        for name, spec in specs.items():
            field = self.fields[name]
            rows = field.reserve(n, spec[3])
            if field.tier in MAPPABLE:
                held[name] = (field.generation, rows)
            else:  # spilled to a tier the writer cannot map: this field goes as data
                field.release(rows)
        if not held:
            return 0, {}
        self._plan_ids += 1
        self.plans[self._plan_ids] = (time.monotonic() + self.lease_s, held)
        self._count("write_plans", 1)
        out = {name: (self.fields[name].layout(), rows.numpy()) for name, (_, rows) in held.items()}
        return self._plan_ids, out

    def commit(self, plan_id: int, gis: np.ndarray, lengths: dict[str, np.ndarray | None],
               wires: dict[str, tuple]) -> bool:  # fmt: skip
        """Make a plan's rows (``lengths``: per field its samples' lengths, None for scalars) and
        ``wires`` (the rest, as data) the fields of ``gis``, all at once. False, and nothing stored,
        when the plan is unknown (expired) or stale (a field grew into a new file since): write again."""
        entry = self.plans.pop(plan_id, None) if type(plan_id) is int else None
        if entry is None:  # expired: its rows are free again, maybe another plan's now
            self._count("plans_refused", 1)
            return False
        held = entry[1]
        try:
            slots = _slots(gis, distinct=True)
            columns = self._checked(slots, wires)
            if not isinstance(lengths, dict):
                raise StorageBackendError(f"commit of plan {plan_id}: lengths are a dict of fields")
            if set(held) != set(lengths):
                raise StorageBackendError(
                    f"commit of plan {plan_id} names fields {sorted(lengths)}, the plan {sorted(held)}"
                )
            if set(held) & set(columns):
                raise StorageBackendError(
                    f"commit of plan {plan_id} sends planned fields {sorted(set(held) & set(columns))} as data"
                )
            if any(rows.numel() != slots.numel() for _, rows in held.values()):
                raise StorageBackendError(
                    f"commit of plan {plan_id}: {slots.numel()} keys for the plan's rows"
                )
            lens = {name: self._lengths(name, slots, lengths[name]) for name in held}
        except Exception:
            self._drop(held)
            raise
        if any(self.fields[n].generation != gen for n, (gen, _) in held.items()):
            self._drop(held)
            self._count("plans_refused", 1)
            return False
        try:  # the fields sent as data first: if they do not fit, nothing of the plan is visible
            self._write(slots, columns)
        except Exception:
            self._drop(held)
            raise
        for name, (_, rows) in held.items():
            field = self.fields[name]
            field.commit(slots, rows, lens[name])
            self.puts[name] = self.puts.get(name, 0) + 1
            nbytes = _mapped_bytes(field, lens[name], slots.numel())
            self._count("bytes_put", nbytes)
            self._count("bytes_put_direct", nbytes)
        if not columns:
            self._count("puts", 1)
        return True

    def _lengths(self, name: str, slots: torch.Tensor, lengths: np.ndarray | None) -> torch.Tensor | None:
        field = self.fields[name]
        if field.kind != JAGGED:
            return None
        try:
            lens = torch.from_numpy(np.array(lengths, dtype=np.int64, copy=True)).flatten()
        except (TypeError, ValueError, OverflowError) as e:
            raise StorageBackendError(f"field {name!r}: commit of lengths that are not integers: {e}") from e
        if lens.numel() != slots.numel() or (
            lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > field.max_len)
        ):
            raise StorageBackendError(
                f"field {name!r}: commit of {lens.numel()} lengths for {slots.numel()} keys, "
                f"each in [0, {field.max_len}]"
            )
        return lens

    def abandon(self, plan_id: int) -> None:
        """Release a plan's rows (its writer gives up)."""
        entry = self.plans.pop(plan_id, None) if type(plan_id) is int else None
        if entry is not None:
            self._drop(entry[1])
            self._count("plans_abandoned", 1)

    def _drop(self, held: dict[str, tuple[int, torch.Tensor]]) -> None:
        for name, (_, rows) in held.items():
            if name in self.fields:
                self.fields[name].release(rows)

    def _expire(self) -> None:
        """Release the rows of plans past their lease (their writers died between plan and commit)."""
        now = time.monotonic()
        for plan_id in [p for p, (deadline, _) in self.plans.items() if deadline < now]:
            self._drop(self.plans.pop(plan_id)[1])
            self._count("plans_expired", 1)

    def _plan(self, grown: dict[str, int | None]) -> None:
        """Before a write that grows a field (``grown``: per written field its bytes after the write,
        None if it fits): plan every unpinned field's tier (planning.py)."""
        if all(v is None for v in grown.values()):
            return
        sizes = {
            n: grown.get(n) or f.nbytes
            for n, f in self.fields.items()
            if n not in self.placement and f.kind != OBJECT
        }
        if not sizes:
            return
        budgets = {t: self.budgets.free[t] for t in TIERS}
        for f in self.fields.values():  # what the planned fields hold now is theirs to re-place
            if f.name in sizes and budgets.get(f.tier) is not None:
                budgets[f.tier] += f.nbytes  # type: ignore[operator]
        tiers = plan_store_tiers(sizes, self.puts, self.reads, budgets)
        for name, tier in (tiers or {}).items():
            self.fields[name].wanted_tier = tier

    def _field(self, name: str, slots: torch.Tensor) -> FieldArray:
        field = self.fields.get(name)
        missing = slots.tolist() if field is None else field.missing(slots)
        if missing:
            raise StorageBackendError(f"field {name!r} is not stored for global indexes {missing[:8]}")
        assert field is not None
        return field

    def get(self, gis: np.ndarray, names: list[str]) -> dict[str, tuple]:
        """The fields, gathered (one copy each), in wire form."""
        slots = _slots(gis)
        out = {}
        for name in names:
            col = self._field(name, slots).get(slots)
            self.reads[name] = self.reads.get(name, 0) + 1
            self._count("bytes_get_copied", col.nbytes)
            out[name] = to_wire(col)
        return out

    def read_plan(self, gis: np.ndarray, names: list[str], same_node: bool) -> dict[str, tuple]:
        """Per field: where a same-node reader maps it (``("mapped", kind, layout, lengths, rows)``), or
        the data."""
        slots = _slots(gis)
        out: dict[str, tuple] = {}
        for name in names:
            field = self._field(name, slots)
            self.reads[name] = self.reads.get(name, 0) + 1
            layout = field.layout() if same_node and field.tier in MAPPABLE else None
            if layout is None:
                col = field.get(slots)
                self._count("bytes_get_copied", col.nbytes)
                out[name] = to_wire(col)
                continue
            rows = field.rows(slots)
            lengths = field.lengths.index_select(0, rows) if field.kind == JAGGED else None
            self._count("bytes_get_mapped", _mapped_bytes(field, lengths, slots.numel()))
            out[name] = (
                "mapped",
                field.kind,
                layout,
                None if lengths is None else lengths.numpy(),
                rows.numpy(),
            )
        return out

    def clear(self, gis: np.ndarray) -> None:
        """Forget every field of ``gis`` (indexes are reused by TransferQueue after a clear)."""
        slots = _slots(gis)
        for field in self.fields.values():
            field.clear(slots)

    def stats(self) -> dict[str, Any]:
        """Counters, and per field its tier (and whether it spilled there) and bytes."""
        return {
            **self.counters,
            "plans_open": len(self.plans),
            "fields": {
                n: {"tier": f.tier, "wanted": f.wanted_tier, "spilled": f.spilled, "bytes": f.nbytes}
                for n, f in self.fields.items()
            },
        }

    def close(self) -> None:
        for field in self.fields.values():
            field.close()
        self.fields.clear()


def _longest(column: Column) -> int:
    return int(column.data.lengths.max()) if column.kind == JAGGED and column.size else 0


def _specs(specs: Any) -> dict[str, tuple[str, torch.dtype | None, tuple[int, ...], int]]:
    """A write plan's specs, checked: ``{field: (kind, dtype, per-token shape, longest)}``."""
    if not isinstance(specs, dict):
        raise StorageBackendError(f"the specs of a write plan are a dict, not a {type(specs).__name__}")
    out = {}
    for name, spec in specs.items():
        ok = isinstance(spec, tuple | list) and len(spec) == 4
        kind, dtype, rest, longest = spec if ok else (None, None, (), 0)
        if not (
            ok
            and kind in KINDS
            and isinstance(rest, tuple | list)
            and all(type(d) is int and d >= 0 for d in rest)
            and type(longest) is int
            and longest >= 0
            and (dtype is None) == (kind == OBJECT)
        ):
            raise StorageBackendError(f"field {name!r}: a malformed write-plan spec {str(spec)[:200]}")
        out[name] = (kind, None if dtype is None else torch_dtype(dtype), tuple(rest), longest)
    return out


def _slots(gis: Any, distinct: bool = False) -> torch.Tensor:
    """Global indexes as an int64 tensor, checked: a 1-d array of integers in ``[0,``
    :data:`MAX_GLOBAL_INDEX` ``)`` (``distinct``: no index twice), else :class:`StorageBackendError`
    naming the first bad one."""
    a = np.asarray(gis) if isinstance(gis, np.ndarray | list | tuple) else None
    if a is None or a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise StorageBackendError(f"global indexes are a 1-d array of integers, not {str(gis)[:100]}")
    if a.size and (a.min() < 0 or a.max() >= MAX_GLOBAL_INDEX):
        bad = a[(a < 0) | (a >= MAX_GLOBAL_INDEX)]
        raise StorageBackendError(
            f"global index {int(bad[0])} is outside [0, {MAX_GLOBAL_INDEX}) ({bad.size} of {a.size} are)"
        )
    slots = torch.from_numpy(a.astype(np.int64, copy=True))
    if distinct and slots.numel() > 1 and torch.unique(slots).numel() != slots.numel():
        raise StorageBackendError(f"a write names some of its {slots.numel()} global indexes twice")
    return slots


def _mapped_bytes(field: FieldArray, lengths: torch.Tensor | None, n: int) -> int:
    if field.kind == OBJECT or field.dtype is None:
        return 0
    size = torch.empty((), dtype=field.dtype).element_size()
    per = math.prod(field.rest)
    tokens = n if field.kind == SCALAR or lengths is None else int(lengths.sum())
    return tokens * per * size


__all__ = ["Column", "NodeStore", "VERL_FIELDS", "check_placement"]
