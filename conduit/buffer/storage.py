"""Preallocated ring storage on one tier: one tensor per column plus per-slot bookkeeping."""

from __future__ import annotations

import torch

from conduit.batch import ColumnBatch, Ragged
from conduit.buffer.base import Storage
from conduit.buffer.tiers import allocate, tier_device
from conduit.errors import CapacityError, CheckpointError, ConfigError
from conduit.schema import Column, Schema


class RingStorage(Storage):
    """Fixed-size slots for ``capacity`` items of ``schema`` on ``tier``.

    Fixed columns are ``[capacity, *shape]``; ragged columns are padded per slot to
    ``[capacity, max_len, *shape]`` with a length per slot, so a write or a gather is a single
    vectorised index operation. Each slot also records the policy ``version`` that wrote it and a
    ``generation`` (the global insert count at write time; 0 = never written), which lets priority
    updates for batches still in flight detect that their slot was overwritten meanwhile.
    """

    def __init__(
        self,
        schema: Schema,
        capacity: int,
        tier: str = "host",
        disk_dir: str | None = None,
        capacity_bytes: int | None = None,
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
        self.schema = schema
        self.capacity = capacity
        self.tier = tier
        self.device = tier_device(tier)
        self._disk_dir = disk_dir
        self.data: dict[str, torch.Tensor] = {}
        self.lengths: dict[str, torch.Tensor] = {}
        for col in schema:
            self._allocate_column(col)
        # Per-slot (generation, version) side by side, so a read fetches both with one gather.
        self.meta = allocate((capacity, 2), torch.int64, tier, disk_dir)
        self.generation = self.meta[:, 0]
        self.version = self.meta[:, 1]

    def _allocate_column(self, col: Column) -> None:
        if col.ragged:
            assert col.max_len is not None
            self.data[col.name] = allocate(
                (self.capacity, col.max_len, *col.shape), col.dtype, self.tier, self._disk_dir
            )
            self.lengths[col.name] = allocate((self.capacity,), torch.int64, self.tier, self._disk_dir)
        else:
            self.data[col.name] = allocate((self.capacity, *col.shape), col.dtype, self.tier, self._disk_dir)

    @property
    def nbytes(self) -> int:
        tensors = [*self.data.values(), *self.lengths.values(), self.meta]
        return sum(t.nbytes for t in tensors)

    def write(self, slots: torch.Tensor, batch: ColumnBatch, version: int, first_generation: int) -> None:
        """Write ``batch`` into ``slots`` (already validated against the schema)."""
        slots = slots.to(self.device)
        for col in self.schema:
            src = batch.columns[col.name]
            dst = self.data[col.name]
            if isinstance(src, Ragged):
                assert col.max_len is not None
                padded, _ = src.to_padded(max_len=col.max_len)
                dst.index_copy_(0, slots, padded.to(self.device))
                self.lengths[col.name].index_copy_(0, slots, src.lengths.to(self.device))
            else:
                dst.index_copy_(0, slots, src.to(self.device))
        n = slots.numel()
        meta = torch.empty((n, 2), dtype=torch.int64, device=self.device)
        meta[:, 0] = torch.arange(first_generation, first_generation + n, device=self.device)
        meta[:, 1] = version
        self.meta.index_copy_(0, slots, meta)

    def read(self, slots: torch.Tensor, into: ColumnBatch | None = None) -> ColumnBatch:
        """Gather ``slots`` on the storage's device (one gather per column).

        With ``into``, fixed columns are gathered into its tensors (reused memory: no allocation and
        no page faults for large batches); ragged columns are always gathered anew.
        """
        slots = slots.to(self.device)
        out: dict[str, torch.Tensor | Ragged] = {}
        for col in self.schema:
            if col.ragged:
                rows = self.data[col.name].index_select(0, slots)
                out[col.name] = Ragged.from_padded(rows, self.lengths[col.name].index_select(0, slots))
            elif into is not None:
                dst = into.columns[col.name]
                assert isinstance(dst, torch.Tensor)
                out[col.name] = torch.index_select(self.data[col.name], 0, slots, out=dst)
            else:
                out[col.name] = self.data[col.name].index_select(0, slots)
        return ColumnBatch.trusted(out, slots.numel())

    def grow_ragged(self, name: str, max_len: int) -> Column:
        """Raise the maximum length of ragged column ``name``, keeping its contents (one copy)."""
        col = self.schema[name]
        if not col.ragged or col.max_len is None:
            raise ConfigError(f"column {name!r} is not ragged; only ragged columns can grow")
        if max_len < col.max_len:
            raise ConfigError(f"column {name!r}: cannot shrink max_len {col.max_len} -> {max_len}")
        new_col = Column(col.name, col.dtype, col.shape, ragged=True, max_len=max_len)
        old = self.data[name]
        self.data[name] = allocate((self.capacity, max_len, *col.shape), col.dtype, self.tier, self._disk_dir)
        self.data[name][:, : col.max_len].copy_(old)
        self.schema = self.schema.with_column(new_col)
        return new_col

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

    def check_state(self, state: dict[str, torch.Tensor]) -> None:
        """Raise :class:`CheckpointError` unless ``state`` has exactly this storage's tensors and shapes."""
        want = self._expected()
        if not isinstance(state, dict) or set(state) != set(want):
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"saved storage holds {keys}; this buffer stores {sorted(want)}")
        for key, dst in want.items():
            src = state[key]
            if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                got = (tuple(src.shape), src.dtype) if isinstance(src, torch.Tensor) else type(src).__name__
                raise CheckpointError(
                    f"saved {key!r} is {got}; this buffer has {(tuple(dst.shape), dst.dtype)} "
                    f"(capacity {self.capacity}) — load into a buffer built with the same schema and capacity"
                )

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key, dst in self._expected().items():
            dst.copy_(state[key])
