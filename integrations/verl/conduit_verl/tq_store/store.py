"""One node's Conduit store of TransferQueue fields (the state a storage actor holds).

Plain Python so it is testable without Ray; :mod:`conduit_verl.tq_store.backend` runs one per node as
a Ray actor. Every call is batch-level: one gather / scatter per field per call.
"""

from __future__ import annotations

import math
import tempfile
from typing import Any

import numpy as np
import torch

from conduit_verl.errors import StorageBackendError
from conduit_verl.tq_store.columns import JAGGED, OBJECT, SCALAR, Column, from_wire, to_wire
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

    def _count(self, key: str, n: int) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def put(self, gis: np.ndarray, wires: dict[str, tuple]) -> None:
        """Store (or overwrite) ``wires`` fields for global indexes ``gis``."""
        slots = _slots(gis)
        columns = {name: from_wire(w) for name, w in wires.items()}
        for name, col in columns.items():  # check every field before writing any
            if col.size != slots.numel():
                raise StorageBackendError(f"field {name!r}: {col.size} values for {slots.numel()} keys")
            if name in self.fields:
                self.fields[name].check(col)
        for name, col in columns.items():
            if name not in self.fields:
                tier = self.placement.get(name, self.default_tier)
                tier = "shm" if tier == AUTO else tier
                self.fields[name] = FieldArray(
                    name, col.kind, col.dtype, col.rest, tier, self.budgets, self.directory
                )
        if self.default_tier == AUTO:
            self._plan(slots, columns)
        for name, col in columns.items():
            self.fields[name].put(slots, col)
            self.puts[name] = self.puts.get(name, 0) + 1
            self._count("bytes_put", col.nbytes)
        self._count("puts", 1)

    def _plan(self, slots: torch.Tensor, columns: dict[str, Column]) -> None:
        """Before a put that grows a field: plan every unpinned field's tier (planning.py)."""
        grown = {n: self.fields[n].next_nbytes(slots, c) for n, c in columns.items()}
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
        """Per field: where a same-node reader maps it (``("mapped", kind, layout, lengths)``), or the data."""
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
            lengths = field.lengths.index_select(0, slots) if field.kind == JAGGED else None
            self._count("bytes_get_mapped", _mapped_bytes(field, lengths, slots.numel()))
            out[name] = ("mapped", field.kind, layout, None if lengths is None else lengths.numpy())
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
            "fields": {
                n: {"tier": f.tier, "wanted": f.wanted_tier, "spilled": f.spilled, "bytes": f.nbytes}
                for n, f in self.fields.items()
            },
        }

    def close(self) -> None:
        for field in self.fields.values():
            field.close()
        self.fields.clear()


def _slots(gis: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(gis, dtype=np.int64, copy=True))


def _mapped_bytes(field: FieldArray, lengths: torch.Tensor | None, n: int) -> int:
    if field.kind == OBJECT or field.dtype is None:
        return 0
    size = torch.empty((), dtype=field.dtype).element_size()
    per = math.prod(field.rest)
    tokens = n if field.kind == SCALAR or lengths is None else int(lengths.sum())
    return tokens * per * size


__all__ = ["Column", "NodeStore", "VERL_FIELDS", "check_placement"]
