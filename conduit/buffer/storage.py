"""Preallocated ring storage: one tensor per column (each on its own tier) plus per-slot bookkeeping."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from conduit.batch import ColumnBatch, Ragged
from conduit.buffer.base import Storage
from conduit.buffer.gather_kernels import gather_rows, warm_gather
from conduit.buffer.ragged_kernels import gather_prefixes, warm_ragged_kernels
from conduit.buffer.tiers import allocate, tier_device
from conduit.errors import CapacityError, CheckpointError, ConfigError
from conduit.schema import Column, Schema


class RingStorage(Storage):
    """Fixed-size slots for ``capacity`` items of ``schema``; each column on ``tiers.get(name, tier)``.

    Fixed columns are ``[capacity, *shape]``; ragged columns are padded per slot to
    ``[capacity, max_len, *shape]`` with a length per slot, so a write or a gather is a single
    vectorised index operation. Each slot also records the policy ``version`` that wrote it and a
    ``generation`` (the global insert count at write time; 0 = never written), which lets priority
    updates for batches still in flight detect that their slot was overwritten meanwhile. The
    per-slot bookkeeping lives on ``tier`` (the home tier); a column can move to another tier while
    the buffer runs (:meth:`copy_column`, then :meth:`install_column` under the buffer's lock).
    """

    def __init__(
        self,
        schema: Schema,
        capacity: int,
        tier: str = "host",
        disk_dir: str | None = None,
        capacity_bytes: int | None = None,
        tiers: Mapping[str, str] | None = None,
    ) -> None:
        per_item = schema.nbytes_per_item
        if capacity_bytes is not None:
            if per_item > capacity_bytes:
                raise CapacityError(
                    f"one item needs {per_item} bytes, more than the tier's capacity of {capacity_bytes} bytes"
                )
            if capacity * per_item > capacity_bytes:
                raise CapacityError(
                    f"{capacity} items x {per_item} bytes = {capacity * per_item} bytes exceed capacity_bytes="
                    f"{capacity_bytes}; lower capacity to {capacity_bytes // per_item} or raise the budget"
                )
        unknown = sorted(set(tiers or {}) - set(schema.names))
        if unknown:
            raise ConfigError(f"tiers given for unknown column(s) {unknown}; the schema has {schema.names}")
        self.schema = schema
        self.capacity = capacity
        self.tier = tier
        self.tiers = {col.name: (tiers or {}).get(col.name, tier) for col in schema}
        self.device = tier_device(tier)
        self._disk_dir = disk_dir
        self.data: dict[str, torch.Tensor] = {}
        self.lengths: dict[str, torch.Tensor] = {}
        for col in schema:
            self._allocate_column(col)
        # Per-slot generations (row 0) and versions (row 1), each a contiguous vector: the fast 1-D
        # gather on a read, and what the priority kernels read in place.
        self.meta = allocate((2, capacity), torch.int64, tier, disk_dir)
        self.generation = self.meta[0]
        self.version = self.meta[1]
        warm_gather()  # load the single-threaded gather kernel now, not in the first sample()
        if any(c.ragged for c in self.schema):
            warm_ragged_kernels()  # the one-pass ragged read's kernels, likewise

    def _allocate_column(self, col: Column) -> None:
        tensors = self._new_column(col, self.tiers[col.name])
        self.data[col.name] = tensors["data"]
        if "lengths" in tensors:
            self.lengths[col.name] = tensors["lengths"]

    def _new_column(self, col: Column, tier: str) -> dict[str, torch.Tensor]:
        if not col.ragged:
            return {"data": allocate((self.capacity, *col.shape), col.dtype, tier, self._disk_dir)}
        assert col.max_len is not None
        return {
            "data": allocate((self.capacity, col.max_len, *col.shape), col.dtype, tier, self._disk_dir),
            "lengths": allocate((self.capacity,), torch.int64, tier, self._disk_dir),
        }

    def column_tensors(self, name: str) -> dict[str, torch.Tensor]:
        """Column ``name``'s tensors: ``data`` and, for a ragged column, ``lengths``."""
        out = {"data": self.data[name]}
        if name in self.lengths:
            out["lengths"] = self.lengths[name]
        return out

    def column_nbytes(self, name: str) -> int:
        """Bytes column ``name`` occupies on its tier (padding of ragged columns included)."""
        return sum(t.nbytes for t in self.column_tensors(name).values())

    def copy_column(self, name: str, tier: str, max_len: int | None = None) -> dict[str, torch.Tensor]:
        """A copy of column ``name``'s tensors on ``tier``, ragged rows widened to ``max_len`` if given
        (the bulk of a migration; no lock needed: rows written meanwhile are re-copied by
        :meth:`install_column`)."""
        col = self._resized(name, max_len)
        new = self._new_column(col, tier)
        for key, src in self.column_tensors(name).items():
            _prefix(new[key], src).copy_(src)
        return new

    def install_column(
        self, name: str, tier: str, tensors: dict[str, torch.Tensor], dirty: torch.Tensor
    ) -> None:
        """Re-copy rows ``dirty`` (written since :meth:`copy_column` began) into ``tensors`` and make
        them column ``name``'s storage on ``tier``. Call under the buffer's lock."""
        for key, src in self.column_tensors(name).items():
            dst = _prefix(tensors[key], src)
            if dirty.numel():
                rows = dirty.to(src.device)
                dst.index_copy_(0, rows.to(dst.device), src.index_select(0, rows).to(dst.device))
        self.data[name] = tensors["data"]
        if "lengths" in tensors:
            self.lengths[name] = tensors["lengths"]
        self.tiers[name] = tier
        col = self.schema[name]
        if col.ragged and tensors["data"].shape[1] != col.max_len:
            self.schema = self.schema.with_column(self._resized(name, tensors["data"].shape[1]))

    def _resized(self, name: str, max_len: int | None) -> Column:
        col = self.schema[name]
        if max_len is None or max_len == col.max_len:
            return col
        if not col.ragged or col.max_len is None:
            raise ConfigError(f"column {name!r} is not ragged; only ragged columns can grow")
        if max_len < col.max_len:
            raise ConfigError(f"column {name!r}: cannot shrink max_len {col.max_len} -> {max_len}")
        return dataclasses.replace(col, max_len=max_len)

    def _on(self, slots: torch.Tensor, name: str, cache: dict[torch.device, torch.Tensor]) -> torch.Tensor:
        dev = self.data[name].device
        at = cache.get(dev)
        if at is None:
            at = cache[dev] = slots if slots.device == dev else slots.to(dev)
        return at

    @property
    def nbytes(self) -> int:
        tensors = [*self.data.values(), *self.lengths.values(), self.meta]
        return sum(t.nbytes for t in tensors)

    def write(self, slots: torch.Tensor, batch: ColumnBatch, version: int, first_generation: int) -> None:
        """Write ``batch`` into ``slots`` (already validated against the schema)."""
        on: dict[torch.device, torch.Tensor] = {}
        for col in self.schema:
            src = batch.columns[col.name]
            dst = self.data[col.name]
            at = self._on(slots, col.name, on)
            if isinstance(src, Ragged):
                assert col.max_len is not None
                padded, _ = src.to_padded(max_len=col.max_len)
                dst.index_copy_(0, at, padded.to(dst.device))
                self.lengths[col.name].index_copy_(0, at, src.lengths.to(dst.device))
            else:
                dst.index_copy_(0, at, src.to(dst.device))
        slots = slots.to(self.device)
        n = slots.numel()
        meta = torch.empty((2, n), dtype=torch.int64, device=self.device)
        torch.arange(first_generation, first_generation + n, out=meta[0])
        meta[1] = version
        self.meta.index_copy_(1, slots, meta)

    def read(self, slots: torch.Tensor, into: ColumnBatch | None = None) -> ColumnBatch:
        """Gather ``slots`` (one gather per column, on the column's device).

        With ``into``, fixed columns are gathered into its tensors (reused memory: no allocation and
        no page faults for large batches); ragged columns are always gathered anew.
        """
        on: dict[torch.device, torch.Tensor] = {}
        out: dict[str, torch.Tensor | Ragged] = {}
        for col in self.schema:
            at = self._on(slots, col.name, on)
            if col.ragged:
                out[col.name] = _read_ragged(
                    self.data[col.name], at, self.lengths[col.name].index_select(0, at)
                )
            elif into is not None and into.columns[col.name].device == self.data[col.name].device:
                dst = into.columns[col.name]
                assert isinstance(dst, torch.Tensor)
                out[col.name] = gather_rows(self.data[col.name], at, out=dst)
            else:
                out[col.name] = gather_rows(self.data[col.name], at)
        return ColumnBatch.trusted(out, slots.numel())

    def grow_ragged(self, name: str, max_len: int) -> Column:
        """Raise the maximum length of ragged column ``name``, keeping its contents (one copy)."""
        new = self.copy_column(name, self.tiers[name], max_len)
        self.install_column(name, self.tiers[name], new, torch.empty(0, dtype=torch.int64))
        return self.schema[name]

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {f"data/{k}": v.cpu() for k, v in self.data.items()}
        state.update({f"lengths/{k}": v.cpu() for k, v in self.lengths.items()})
        state["generation"] = self.generation.cpu()
        state["version"] = self.version.cpu()
        return state

    def _expected(self) -> dict[str, torch.Tensor]:
        out = {f"data/{k}": v for k, v in self.data.items()}
        out.update({f"lengths/{k}": v for k, v in self.lengths.items()})
        out["generation"], out["version"] = self.generation, self.version
        return out

    def check_state(self, state: dict[str, torch.Tensor], inserted: int | None = None, live: int = 0) -> None:
        """Raise :class:`CheckpointError` unless ``state`` has exactly this storage's tensors and shapes
        and every ragged length lies within its column's maximum; given ``inserted``, each slot's
        generation must be 0 (never written) or an item up to ``inserted`` written to that slot in
        ring order, and the last ``live`` items must all be there. Changes nothing."""
        want = self._expected()
        if not isinstance(state, dict) or set(state) != set(want):
            keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"saved storage holds {keys}; this buffer stores {sorted(want)}")
        for key, dst in want.items():
            src = state[key]
            if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                got = (tuple(src.shape), src.dtype) if isinstance(src, torch.Tensor) else type(src).__name__
                raise CheckpointError(
                    f"saved {key!r} is {got}; this buffer has {(tuple(dst.shape), dst.dtype)} "
                    f"(capacity {self.capacity}) — load into a buffer built with the same schema and capacity"
                )
        if inserted is not None:
            _check_generations(state["generation"].cpu(), inserted, live)
        for name in self.lengths:
            lengths, top = state[f"lengths/{name}"], state[f"data/{name}"].shape[1]
            if lengths.numel() and not (int(lengths.min()) >= 0 and int(lengths.max()) <= top):
                raise CheckpointError(f"saved lengths of ragged column {name!r} leave [0, {top}]")

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key, dst in self._expected().items():
            dst.copy_(state[key])


def _check_generations(gen: torch.Tensor, inserted: int, live: int) -> None:
    """Raise :class:`CheckpointError` unless each slot's generation is 0 or an item up to ``inserted``
    that the ring writer puts in that slot, and the last ``live`` items all are in their slots."""
    capacity = gen.numel()
    slots = torch.arange(capacity)
    ring = inserted - torch.remainder(inserted - 1 - slots, capacity)  # the last item written to each slot
    wrong = (gen != 0) & ((gen < 0) | (gen > inserted) | (torch.remainder(gen - 1, capacity) != slots))
    wrong |= (ring > inserted - live) & (gen != ring)
    if bool(wrong.any()):
        bad = int(torch.nonzero(wrong).flatten()[0])
        raise CheckpointError(
            f"saved slot {bad} holds item {int(gen[bad])}; after {inserted} items written in order it holds "
            f"item {max(int(ring[bad]), 0)} or an older one of that slot (the last {live} must all be there)"
        )


def _prefix(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """The part of ``dst`` that ``src`` fills: all of it, or the first ``src.shape[1]`` positions of
    each row of a widened ragged column."""
    return dst if dst.shape == src.shape else dst.narrow(1, 0, src.shape[1])


def _read_ragged(data: torch.Tensor, at: torch.Tensor, lengths: torch.Tensor) -> Ragged:
    """Items ``at`` of a slot-padded ragged column: on CPU one pass over their valid prefixes (each
    token copied once, no padded temporary); on a device a row gather then one masked copy."""
    if data.device.type != "cpu" or not data.is_contiguous():
        return Ragged.from_padded(gather_rows(data, at), lengths)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.empty((int(offsets[-1]), *data.shape[2:]), dtype=data.dtype)
    return Ragged(gather_prefixes(data, at, offsets, values), offsets)
