"""One node's store of TransferQueue fields (what a storage actor holds): TQ's calls, in its wire forms,
on a core :class:`~conduit.buffer.keyed.KeyedStore` keyed by global index.

Plain Python so it is testable without Ray. The store checks what comes from the wire — global indexes
(distinct, ``0 <= key <`` :data:`MAX_GLOBAL_INDEX`), each field's column (kind, dtype, shape, offsets),
verl's field names in a placement — and raises :class:`StorageBackendError` naming the problem before
anything is written; the keyed store makes every write all or nothing and runs the same-node write plans
(:meth:`NodeStore.write_plan`, then :meth:`NodeStore.commit`). :data:`PROTOCOL` is what its data port
answers.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from conduit.buffer.keyed import AUTO, KeyedStore, Spec, spec_of
from conduit.buffer.mapped import Layout
from conduit.buffer.rows import TIERS
from conduit.errors import (
    CapacityError,
    ConduitError,
    ConfigError,
    DTypeError,
    RaggedLengthError,
    SchemaError,
    ShapeError,
)
from conduit.port import Protocol
from conduit_verl.errors import StorageActorError, StorageBackendError
from conduit_verl.tq_store.columns import JAGGED, OBJECT, SCALAR, Column, from_wire, to_wire, torch_dtype

#: the fields verl 0.9.1 writes to TransferQueue (what a placement entry may name)
VERL_FIELDS = (
    "prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "loss_mask",
    "rollout_log_probs", "rm_scores", "old_log_probs", "entropy", "ref_log_prob", "values", "advantages",
    "returns", "token_level_scores", "token_level_rewards", "routed_experts", "num_turns",
    "multi_modal_inputs", "teacher_log_probs", "teacher_ids",
)  # fmt: skip


#: global indexes are ``0 <= key < MAX_GLOBAL_INDEX`` (TransferQueue counts them up from 0, reusing
#: cleared ones); a key outside raises :class:`StorageBackendError` naming it
MAX_GLOBAL_INDEX = 2**31
KINDS = (SCALAR, JAGGED, OBJECT)


#: the store's calls its data port answers (:mod:`conduit.port`; everything a TQ client calls), with
#: their arguments' names, and the errors that travel back by class
PROTOCOL = Protocol(
    methods={
        "put": ("gis", "wires"),
        "get": ("gis", "names"),
        "read_plan": ("gis", "names", "same_node"),
        "write_plan": ("gis", "specs", "same_node"),
        "commit": ("plan_id", "gis", "lengths", "wires"),
        "abandon": ("plan_id",),
        "clear": ("gis",),
    },
    errors=(
        StorageActorError,
        ConduitError,
        ConfigError,
        SchemaError,
        DTypeError,
        ShapeError,
        RaggedLengthError,
        CapacityError,
    ),  # fmt: skip
    error=StorageBackendError,
    records=(Layout,),
)


def check_placement(placement: dict[str, str]) -> None:
    """Raise :class:`StorageBackendError` naming an unknown field or tier."""
    for field, tier in placement.items():
        if field not in VERL_FIELDS:
            raise StorageBackendError(
                f"placement names unknown field {field!r}; verl's fields: {', '.join(VERL_FIELDS)}"
            )
        if tier not in TIERS:
            raise StorageBackendError(f"placement.{field}={tier!r}: unknown tier; tiers: {', '.join(TIERS)}")


def _kind(spec: Spec) -> str:
    return OBJECT if spec.dtype is None else JAGGED if spec.ragged else SCALAR


def _spec(kind: str, dtype: torch.dtype | None, rest: tuple[int, ...]) -> Spec:
    return Spec(None) if kind == OBJECT else Spec(dtype, tuple(rest), kind == JAGGED)


@contextmanager
def _backend_errors() -> Iterator[None]:
    """The core's errors (schema, budgets, allocation) raised as :class:`StorageBackendError`."""
    try:
        yield
    except StorageBackendError:
        raise
    except ConduitError as e:
        raise StorageBackendError(str(e)) from e


class NodeStore:
    """Fields of the samples routed to this node, slot = global index, in a core
    :class:`~conduit.buffer.keyed.KeyedStore` (its ``fields`` are the store's columns)."""

    def __init__(
        self,
        placement: dict[str, str] | None = None,
        budgets: dict[str, int] | None = None,
        default_tier: str = AUTO,
        directory: str | None = None,
        lease_s: float = 600.0,
    ) -> None:
        check_placement(dict(placement or {}))
        with _backend_errors():
            self.keyed = KeyedStore(
                placement,
                budgets,
                default_tier,
                directory or tempfile.gettempdir(),
                lease_s,
                "field",
                "global indexes",
            )
        self.fields, self.budgets = self.keyed.columns, self.keyed.budgets

    def put(self, gis: np.ndarray, wires: dict[str, tuple]) -> None:
        """Store (or overwrite) ``wires`` fields for global indexes ``gis``: all of them, or (raising
        :class:`StorageBackendError`) none."""
        slots = _slots(gis, distinct=True)
        columns = self._checked(slots, wires)
        with _backend_errors():
            self.keyed.write(slots, {name: col.data for name, col in columns.items()})

    def _check(self, name: str, kind: str, dtype: torch.dtype | None, rest: tuple[int, ...]) -> None:
        field = self.fields.get(name)
        if field is not None and spec_of(field) != _spec(kind, dtype, rest):
            has = spec_of(field)
            raise StorageBackendError(
                f"field {name!r} holds {_kind(has)} {has.dtype} {has.shape}; a put brought {kind} {dtype} "
                f"{tuple(rest)} (clear the field's samples first)"
            )

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
            self._check(name, col.kind, col.dtype, col.rest)
        return columns

    def write_plan(self, gis: np.ndarray, specs: dict[str, tuple], same_node: bool) -> tuple[int, dict]:
        """Fresh rows for a same-node writer to fill in place, per mappable field of ``specs``
        (``{field: (kind, dtype, rest, longest)}``, :func:`~conduit_verl.tq_store.columns.spec_of`):
        ``(plan id, {field: (layout, rows)})``. Every field of ``specs`` is checked first; fields not in
        the answer (objects, unmappable tiers, a writer on another node) go with the commit as data."""
        slots = _slots(gis, distinct=True)
        self.keyed.expire()
        specs = _specs(specs)
        for name, (kind, dtype, rest, _) in specs.items():
            self._check(name, kind, dtype, rest)
        if not same_node or not slots.numel():
            return 0, {}
        with _backend_errors():
            return self.keyed.plan_write(
                slots,
                {
                    name: (_spec(kind, dtype, rest), longest)
                    for name, (kind, dtype, rest, longest) in specs.items()
                },
            )

    def commit(self, plan_id: int, gis: np.ndarray, lengths: dict[str, np.ndarray | None],
               wires: dict[str, tuple]) -> bool:  # fmt: skip
        """Make a plan's rows (``lengths``: per field its samples' lengths, None for scalars) and
        ``wires`` (the rest, as data) the fields of ``gis``, all at once. False, and nothing stored,
        when the plan is unknown (expired) or stale (a field grew into a new file since): write again."""
        try:
            slots = _slots(gis, distinct=True)
            columns = self._checked(slots, wires)
        except Exception:
            self.keyed.abandon(plan_id, count=False)
            raise
        with _backend_errors():
            return self.keyed.commit(
                plan_id, slots, lengths, {name: col.data for name, col in columns.items()}
            )

    def abandon(self, plan_id: int) -> None:
        """Release a plan's rows (its writer gives up)."""
        self.keyed.abandon(plan_id)

    def get(self, gis: np.ndarray, names: list[str]) -> dict[str, tuple]:
        """The fields, gathered (one copy each), in wire form."""
        slots = _slots(gis)
        with _backend_errors():
            data = self.keyed.read(slots, names)
        return {name: to_wire(Column(_kind(spec_of(self.fields[name])), d)) for name, d in data.items()}

    def read_plan(self, gis: np.ndarray, names: list[str], same_node: bool) -> dict[str, tuple]:
        """Per field: where a same-node reader maps it (``("mapped", kind, layout, lengths, rows)``), or
        the data."""
        slots = _slots(gis)
        with _backend_errors():
            plan = self.keyed.read_plan(slots, names, same_node)
        out = {}
        for name, entry in plan.items():
            kind = _kind(spec_of(self.fields[name]))
            if isinstance(entry, tuple):
                layout, lengths, rows = entry
                out[name] = (
                    "mapped",
                    kind,
                    layout,
                    None if lengths is None else lengths.numpy(),
                    rows.numpy(),
                )
            else:
                out[name] = to_wire(Column(kind, entry))
        return out

    def clear(self, gis: np.ndarray) -> None:
        """Forget every field of ``gis`` (indexes are reused by TransferQueue after a clear)."""
        self.keyed.clear(_slots(gis))

    def stats(self) -> dict[str, Any]:
        """Counters, and per field its tier (and whether it spilled there) and bytes."""
        stats = self.keyed.stats()
        stats["fields"] = stats.pop("columns")
        return stats

    def close(self) -> None:
        self.keyed.close()


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


__all__ = ["Column", "NodeStore", "VERL_FIELDS", "check_placement"]
