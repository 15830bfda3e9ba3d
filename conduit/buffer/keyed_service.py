"""A :class:`~conduit.buffer.keyed.KeyedStore` served to other processes: its calls in wire form, checked.

:class:`KeyedService` is what a storage process holds and a data port (:mod:`conduit.port`, methods
:data:`METHODS`) or an actor framework calls with what came off the wire: keys as an integer array,
columns as :func:`~conduit.buffer.columns.to_wire` tuples, write-plan specs as
:meth:`~conduit.buffer.columns.Column.plan_spec` tuples. It checks all of it — keys (1-d integers in
``[0, max_key)``, distinct for a write), each column's form and that it matches what the column holds —
before anything is written, and answers in wire form. Every error it raises is of class ``error``
(:func:`raised_as`), so an integration sees one class whatever went wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from conduit.buffer.columns import KINDS, OBJECT, Column, from_wire, to_wire
from conduit.buffer.keyed import KeyedStore, Spec, spec_of
from conduit.errors import ConduitError, SchemaError
from conduit.wire import torch_dtype

#: the calls a data port serves, with their arguments' names (:class:`conduit.port.Protocol`)
METHODS: dict[str, tuple[str, ...]] = {
    "put": ("gis", "wires"),
    "get": ("gis", "names"),
    "read_plan": ("gis", "names", "same_node"),
    "write_plan": ("gis", "specs", "same_node"),
    "commit": ("plan_id", "gis", "lengths", "wires"),
    "abandon": ("plan_id",),
    "clear": ("gis",),
}


@contextmanager
def raised_as(error: type[ConduitError]) -> Iterator[None]:
    """Re-raise a :class:`~conduit.errors.ConduitError` that is not an ``error`` as one (same message)."""
    try:
        yield
    except ConduitError as e:
        if isinstance(e, error):
            raise
        raise error(str(e)) from e


class KeyedService:
    """``store``'s calls in wire form (see the module docstring); keys are ``0 <= key < max_key``,
    ``key_noun`` names one in errors (``store.keys_noun`` several); every error is an ``error``."""

    def __init__(self, store: KeyedStore, max_key: int = 2**63 - 1, key_noun: str = "key",
                 error: type[ConduitError] = ConduitError) -> None:  # fmt: skip
        self.keyed, self.max_key, self.key_noun, self.error = store, max_key, key_noun, error

    def put(self, gis: Any, wires: Any) -> None:
        """Store (or overwrite) the ``wires`` columns of keys ``gis``: all of them, or (raising) none."""
        with raised_as(self.error):
            slots = self.keys(gis, distinct=True)
            columns = self._checked(slots, wires)
            self.keyed.write(slots, {name: col.data for name, col in columns.items()})

    def _checked(self, slots: torch.Tensor, wires: Any) -> dict[str, Column]:
        """The columns of ``wires``, every one checked before any is written."""
        if not isinstance(wires, dict):
            raise SchemaError(f"the {self.keyed.noun}s of a put are a dict, not a {type(wires).__name__}")
        columns = {}
        for name, form in wires.items():
            try:
                col = columns[name] = from_wire(form)
            except ConduitError as e:
                raise type(e)(f"{self.keyed.noun} {name!r}: {e}") from None
            if col.size != slots.numel():
                raise SchemaError(f"{self.keyed.noun} {name!r}: {col.size} values for {slots.numel()} keys")
            self.keyed.check(name, col.spec)
        return columns

    def write_plan(self, gis: Any, specs: Any, same_node: bool) -> tuple[int, dict]:
        """Fresh rows for a same-node writer to fill in place, per mappable column of ``specs``
        (``{column: (kind, dtype, rest, longest)}``): ``(plan id, {column: (layout, rows)})``. Every
        column of ``specs`` is checked first; columns not in the answer (objects, unmappable tiers, a
        writer on another node) go with the commit as data."""
        with raised_as(self.error):
            slots = self.keys(gis, distinct=True)
            self.keyed.expire()
            checked = self._specs(specs)
            for name, (spec, _) in checked.items():
                self.keyed.check(name, spec)
            if not same_node or not slots.numel():
                return 0, {}
            return self.keyed.plan_write(slots, checked)

    def commit(self, plan_id: int, gis: Any, lengths: dict[str, np.ndarray | None], wires: Any) -> bool:
        """Make a plan's rows (``lengths``: per column its items' lengths, None for scalars) and ``wires``
        (the rest, as data) the columns of ``gis``, all at once. False, and nothing stored, when the plan
        is unknown (expired) or stale (a column grew into a new file since): write again."""
        with raised_as(self.error):
            try:
                slots = self.keys(gis, distinct=True)
                columns = self._checked(slots, wires)
            except Exception:
                self.keyed.abandon(plan_id, count=False)
                raise
            return self.keyed.commit(plan_id, slots, lengths, {n: c.data for n, c in columns.items()})

    def abandon(self, plan_id: int) -> None:
        """Release a plan's rows (its writer gives up)."""
        self.keyed.abandon(plan_id)

    def get(self, gis: Any, names: list[str]) -> dict[str, tuple]:
        """The columns, gathered (one copy each), in wire form."""
        with raised_as(self.error):
            data = self.keyed.read(self.keys(gis), names)
            return {name: to_wire(self._column(name, d)) for name, d in data.items()}

    def _column(self, name: str, data: Any) -> Column:
        return Column(spec_of(self.keyed.columns[name]).kind, data)

    def read_plan(self, gis: Any, names: list[str], same_node: bool) -> dict[str, tuple]:
        """Per column: where a same-node reader maps it (``("mapped", kind, layout, lengths, rows)``), or
        its data in wire form."""
        with raised_as(self.error):
            plan = self.keyed.read_plan(self.keys(gis), names, same_node)
            out = {}
            for name, entry in plan.items():
                if isinstance(entry, tuple):
                    layout, lengths, rows = entry
                    kind = spec_of(self.keyed.columns[name]).kind
                    out[name] = (
                        "mapped",
                        kind,
                        layout,
                        None if lengths is None else lengths.numpy(),
                        rows.numpy(),
                    )
                else:
                    out[name] = to_wire(self._column(name, entry))
            return out

    def clear(self, gis: Any) -> None:
        """Forget every column of ``gis``."""
        with raised_as(self.error):
            self.keyed.clear(self.keys(gis))

    def close(self) -> None:
        self.keyed.close()

    def _specs(self, specs: Any) -> dict[str, tuple[Spec, int]]:
        """A write plan's specs (``{column: (kind, dtype, per-token shape, longest)}``), checked: ``{column:
        (spec, longest)}``."""
        if not isinstance(specs, dict):
            raise SchemaError(f"the specs of a write plan are a dict, not a {type(specs).__name__}")
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
                raise SchemaError(
                    f"{self.keyed.noun} {name!r}: a malformed write-plan spec {str(spec)[:200]}"
                )
            out[name] = (
                Spec.of_kind(kind, None if dtype is None else torch_dtype(dtype), tuple(rest)),
                longest,
            )
        return out

    def keys(self, gis: Any, distinct: bool = False) -> torch.Tensor:
        """Keys as an int64 tensor, checked: a 1-d array of integers in ``[0, max_key)`` (``distinct``:
        none twice), else :class:`~conduit.errors.SchemaError` naming the first bad one."""
        noun = self.keyed.keys_noun
        a = np.asarray(gis) if isinstance(gis, np.ndarray | list | tuple) else None
        if a is None or a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise SchemaError(f"{noun} are a 1-d array of integers, not {str(gis)[:100]}")
        if a.size and (a.min() < 0 or a.max() >= self.max_key):
            bad = a[(a < 0) | (a >= self.max_key)]
            raise SchemaError(
                f"{self.key_noun} {int(bad[0])} is outside [0, {self.max_key}) ({bad.size} of {a.size} are)"
            )
        slots = torch.from_numpy(a.astype(np.int64, copy=True))
        if distinct and slots.numel() > 1 and torch.unique(slots).numel() != slots.numel():
            raise SchemaError(f"a write names some of its {slots.numel()} {noun} twice")
        return slots
