"""The experience carrier: a columnar batch of fixed-shape and ragged (token-level) columns.

Fixed columns are tensors ``[N, *shape]``. Ragged columns are :class:`Ragged`: flat ``values``
``[total, *shape]`` plus ``offsets`` ``[N + 1]`` (int64, ``offsets[0] == 0``). Every operation here is
vectorised over the batch: no Python work per item or per token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conduit.errors import DTypeError, NonFiniteError, RaggedLengthError, SchemaError, ShapeError
from conduit.schema import Schema

_ALIGN = 64


@dataclass(frozen=True)
class Ragged:
    """Variable-length items stored flat: item ``i`` is ``values[offsets[i]:offsets[i+1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.offsets.nbytes

    @classmethod
    def from_lengths(cls, values: torch.Tensor, lengths: torch.Tensor) -> Ragged:
        """Build from flat values and per-item lengths."""
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
        torch.cumsum(lengths.to(torch.int64), 0, out=offsets[1:])
        return cls(values, offsets)

    @classmethod
    def from_list(cls, items: Sequence[torch.Tensor]) -> Ragged:
        """Convenience constructor from a list of tensors (not for hot paths)."""
        lengths = torch.tensor([t.shape[0] for t in items], dtype=torch.int64)
        return cls.from_lengths(torch.cat(list(items)), lengths)

    @classmethod
    def from_padded(cls, padded: torch.Tensor, lengths: torch.Tensor) -> Ragged:
        """Build from a right-padded ``[N, L, *shape]`` tensor and per-item lengths (one masked copy)."""
        steps = torch.arange(padded.shape[1], device=padded.device)
        mask = steps.unsqueeze(0) < lengths.to(padded.device).unsqueeze(1)
        return cls.from_lengths(padded[mask], lengths.to(padded.device))

    def to_padded(
        self, max_len: int | None = None, pad_value: float = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad to ``[N, L, *shape]``; returns ``(padded, mask)``."""
        lengths = self.lengths
        n = len(self)
        length = int(lengths.max()) if max_len is None and n > 0 else int(max_len or 0)
        out = torch.full(
            (n, length, *self.values.shape[1:]), pad_value, dtype=self.values.dtype, device=self.device
        )
        mask = torch.arange(length, device=self.device).unsqueeze(0) < lengths.unsqueeze(1)
        out[mask] = self.values
        return out, mask

    def index(self, idx: torch.Tensor) -> Ragged:
        """Gather items ``idx``: on CPU one pass over the items' token ranges (a compiled segment
        copy); on a device one flat index and one gather."""
        idx = idx.to(self.offsets.device)
        starts = self.offsets[idx]
        lens = self.offsets[idx + 1] - starts
        new_offsets = torch.zeros(idx.numel() + 1, dtype=torch.int64, device=self.offsets.device)
        torch.cumsum(lens, 0, out=new_offsets[1:])
        total = int(new_offsets[-1])
        if self.values.device.type == "cpu" and self.values.is_contiguous() and self.values.dim() >= 1:
            from conduit.buffer.ragged_kernels import copy_segments

            out = torch.empty((total, *self.values.shape[1:]), dtype=self.values.dtype)
            return Ragged(copy_segments(self.values, starts, out, new_offsets[:-1], lens), new_offsets)
        within = torch.arange(total, device=self.offsets.device) - torch.repeat_interleave(
            new_offsets[:-1], lens, output_size=total
        )
        flat = torch.repeat_interleave(starts, lens, output_size=total) + within
        return Ragged(self.values.index_select(0, flat.to(self.values.device)), new_offsets)

    def slice(self, start: int, stop: int) -> Ragged:
        """Items ``start:stop`` as views of the same memory."""
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Ragged(self.values[lo:hi], self.offsets[start : stop + 1] - lo)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Ragged:
        return Ragged(
            self.values.to(device, non_blocking=non_blocking),
            self.offsets.to(device, non_blocking=non_blocking),
        )

    @staticmethod
    def cat(parts: Sequence[Ragged]) -> Ragged:
        lengths = torch.cat([p.lengths for p in parts])
        return Ragged.from_lengths(torch.cat([p.values for p in parts]), lengths)

    # ``nt.values()``, ``nt.offsets()`` and ``nested_tensor_from_jagged`` each go through torch's
    # ``__torch_function__`` / dispatch layers (~25-75 us a call); the nested tensor's own fields and
    # constructor give the same tensors in a few microseconds. Where this torch lacks them (or the values
    # need an autograd view) the public calls are used.

    @classmethod
    def from_nested(cls, nt: torch.Tensor) -> Ragged:
        """The values and offsets of a contiguous jagged nested tensor (ragged along dim 1), no copy."""
        values, offsets = getattr(nt, "_values", None), getattr(nt, "_offsets", None)
        if not (isinstance(values, torch.Tensor) and isinstance(offsets, torch.Tensor)):
            values, offsets = nt.values(), nt.offsets()  # type: ignore[attr-defined]
        return cls(values, offsets.to(torch.int64))

    def to_nested(self) -> torch.Tensor:
        """A jagged nested tensor over the same values and offsets, carrying its shortest and longest
        item (without them ``to_padded_tensor`` pads every item to the total length)."""
        if not len(self):
            return torch.nested.nested_tensor_from_jagged(self.values, self.offsets)
        low, high = (int(x) for x in torch.aminmax(self.lengths))
        if _NESTED is not None and not self.values.requires_grad:
            nested, store = _NESTED
            cache = {"min_seqlen": store(low), "max_seqlen": store(high)}
            return nested(self.values, self.offsets, _ragged_idx=1, _metadata_cache=cache)
        return torch.nested.nested_tensor_from_jagged(
            self.values, self.offsets, min_seqlen=low, max_seqlen=high
        )


def _nested_internals() -> tuple[Any, Any] | None:
    try:
        from torch.nested._internal.nested_tensor import NestedTensor, _store_val_in_tensor
    except ImportError:
        return None
    return NestedTensor, _store_val_in_tensor


_NESTED = _nested_internals()


ColumnData = torch.Tensor | Ragged


class ColumnBatch:
    """A batch of ``size`` items, column by column.

    Example:
        >>> b = ColumnBatch({"obs": torch.zeros(8, 4), "reward": torch.ones(8)})
        >>> b.index(torch.tensor([0, 3])).size
        2
    """

    __slots__ = ("columns", "size")

    def __init__(self, columns: Mapping[str, ColumnData], size: int | None = None) -> None:
        sizes = {name: _item_count(name, c) for name, c in columns.items()}
        if size is None:
            if not sizes:
                raise ShapeError("a batch needs at least one column (or an explicit size)")
            size = next(iter(sizes.values()))
        bad = {k: v for k, v in sizes.items() if v != size}
        if bad:
            raise ShapeError(f"columns disagree on the item count: expected {size}, got {bad}")
        self.columns: dict[str, ColumnData] = dict(columns)
        self.size: int = int(size)

    @classmethod
    def trusted(cls, columns: dict[str, ColumnData], size: int) -> ColumnBatch:
        """Build without consistency checks, for internal callers that guarantee them (hot paths)."""
        out = cls.__new__(cls)
        out.columns, out.size = columns, size
        return out

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, name: str) -> ColumnData:
        return self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __repr__(self) -> str:
        cols = ", ".join(
            f"{k}: ragged{tuple(v.values.shape[1:])} {v.values.dtype}"
            if isinstance(v, Ragged)
            else f"{k}: {tuple(v.shape[1:])} {v.dtype}"
            for k, v in self.columns.items()
        )
        return f"ColumnBatch(size={self.size}, {cols})"

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns.values())

    @property
    def device(self) -> torch.device:
        first = next(iter(self.columns.values()))
        return first.device

    def index(self, idx: torch.Tensor) -> ColumnBatch:
        """Gather items ``idx`` from every column."""
        out: dict[str, ColumnData] = {}
        for k, c in self.columns.items():
            out[k] = c.index(idx) if isinstance(c, Ragged) else c.index_select(0, idx.to(c.device))
        return ColumnBatch(out, idx.numel())

    def slice(self, start: int, stop: int) -> ColumnBatch:
        """Items ``start:stop`` as zero-copy views."""
        out: dict[str, ColumnData] = {
            k: (c.slice(start, stop) if isinstance(c, Ragged) else c[start:stop])
            for k, c in self.columns.items()
        }
        return ColumnBatch(out, stop - start)

    def split(self, parts: int) -> list[ColumnBatch]:
        """Split into ``parts`` contiguous views whose sizes differ by at most one."""
        if parts < 1:
            raise ShapeError(f"cannot split into {parts} parts")
        base, extra = divmod(self.size, parts)
        bounds = [0]
        for i in range(parts):
            bounds.append(bounds[-1] + base + (1 if i < extra else 0))
        return [self.slice(bounds[i], bounds[i + 1]) for i in range(parts)]

    def select(self, names: Iterable[str]) -> ColumnBatch:
        return ColumnBatch({n: self.columns[n] for n in names}, self.size)

    def with_columns(self, **columns: ColumnData) -> ColumnBatch:
        """A batch with extra or replaced columns (same items)."""
        return ColumnBatch({**self.columns, **columns}, self.size)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ColumnBatch:
        return ColumnBatch(
            {k: c.to(device, non_blocking=non_blocking) for k, c in self.columns.items()}, self.size
        )

    @staticmethod
    def cat(batches: Sequence[ColumnBatch]) -> ColumnBatch:
        """Concatenate batches with the same columns."""
        if len(batches) == 1:
            return batches[0]
        names = list(batches[0].columns)
        out: dict[str, ColumnData] = {}
        for n in names:
            parts = [b.columns[n] for b in batches]
            if isinstance(parts[0], Ragged):
                out[n] = Ragged.cat(parts)  # type: ignore[arg-type]
            else:
                out[n] = torch.cat(parts)  # type: ignore[arg-type]
        return ColumnBatch(out, sum(b.size for b in batches))

    # -- one-copy moves -------------------------------------------------------------------------

    def consolidate(self, pin_memory: bool = False, share_memory: bool = False) -> ConsolidatedBatch:
        """Pack every tensor into one contiguous byte buffer, so a move is one copy."""
        return ConsolidatedBatch.pack(self, pin_memory=pin_memory, share_memory=share_memory)

    # -- tensordict interop (verl's DataProto is built on TensorDict) --------------------------

    def to_tensordict(self):  # noqa: ANN201  (tensordict is typed loosely)
        """A ``TensorDict`` with batch size ``[N]`` sharing memory with this batch.

        Ragged columns become jagged nested tensors (``torch.nested``) over the same values/offsets.
        """
        from tensordict import TensorDict

        data: dict[str, torch.Tensor] = {}
        for k, c in self.columns.items():
            if isinstance(c, Ragged):
                data[k] = c.to_nested()
            else:
                data[k] = c
        return TensorDict(data, batch_size=[self.size])

    @staticmethod
    def from_tensordict(td) -> ColumnBatch:  # noqa: ANN001
        """The inverse of :meth:`to_tensordict`, again without copies."""
        if len(td.batch_size) != 1:
            raise ShapeError(f"a TensorDict batch needs batch_size [N], got {list(td.batch_size)}")
        out: dict[str, ColumnData] = {}
        for k in td.keys():
            v = td.get(k)
            if getattr(v, "is_nested", False):
                out[k] = _jagged_to_ragged(k, v)
            else:
                out[k] = v
        return ColumnBatch(out, int(td.batch_size[0]))


def _jagged_to_ragged(name: str, v: Any) -> Ragged:  # a NestedTensor: typed loosely by torch
    """A jagged nested tensor (ragged along dim 1, no holes) as a :class:`Ragged`, without a copy."""
    if v.layout != torch.jagged:
        raise SchemaError(
            f"column {name!r} is a nested tensor with layout {v.layout}; pass a jagged one "
            "(torch.nested.nested_tensor(..., layout=torch.jagged)) or a conduit.Ragged"
        )
    if v.lengths() is not None or getattr(v, "_ragged_idx", 1) != 1:
        raise SchemaError(
            f"column {name!r} is a jagged nested tensor with holes or ragged past dim 1; pass contiguous "
            "items ragged along dim 1 (nested_tensor_from_jagged(values, offsets))"
        )
    return Ragged.from_nested(v)


def _item_count(name: str, data: object) -> int:
    """Items in one column: a tensor's leading dimension or a ragged column's offsets, else ShapeError."""
    if isinstance(data, Ragged):
        if not isinstance(data.offsets, torch.Tensor) or data.offsets.dim() != 1 or data.offsets.numel() < 1:
            raise ShapeError(f"column {name!r}: Ragged offsets must be a non-empty 1-D tensor")
        return len(data)
    if not isinstance(data, torch.Tensor):
        raise ShapeError(
            f"column {name!r} must be a torch.Tensor or a conduit.Ragged, got {type(data).__name__}"
        )
    if data.dim() == 0:
        raise ShapeError(f"column {name!r} is a 0-d tensor; a column needs a leading item dimension")
    return int(data.shape[0])


@dataclass(frozen=True)
class _Slot:
    name: str
    part: str  # "data" | "values" | "offsets"
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    nbytes: int


class ConsolidatedBatch:
    """A :class:`ColumnBatch` whose tensors are views into one contiguous ``uint8`` buffer."""

    def __init__(self, storage: torch.Tensor, layout: tuple[_Slot, ...], size: int) -> None:
        self.storage = storage
        self.layout = layout
        self.size = size

    @classmethod
    def pack(
        cls, batch: ColumnBatch, pin_memory: bool = False, share_memory: bool = False
    ) -> ConsolidatedBatch:
        parts: list[tuple[str, str, torch.Tensor]] = []
        for k, c in batch.columns.items():
            if isinstance(c, Ragged):
                parts += [(k, "values", c.values), (k, "offsets", c.offsets)]
            else:
                parts.append((k, "data", c))
        layout, pos = [], 0
        for name, part, t in parts:
            layout.append(_Slot(name, part, t.dtype, tuple(t.shape), pos, t.nbytes))
            pos += -(-t.nbytes // _ALIGN) * _ALIGN
        storage = torch.empty(pos, dtype=torch.uint8, pin_memory=pin_memory)
        if share_memory:
            storage.share_memory_()
        for slot, (_, _, t) in zip(layout, parts):
            view = storage[slot.start : slot.start + slot.nbytes]
            view.view(t.dtype).view(t.shape).copy_(t.detach().to("cpu"))
        return cls(storage, tuple(layout), batch.size)

    @property
    def nbytes(self) -> int:
        return self.storage.numel()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ConsolidatedBatch:
        """Move with a single copy of the whole buffer."""
        return ConsolidatedBatch(self.storage.to(device, non_blocking=non_blocking), self.layout, self.size)

    def unpack(self) -> ColumnBatch:
        """Zero-copy views of the buffer as a :class:`ColumnBatch`."""
        tensors: dict[tuple[str, str], torch.Tensor] = {}
        for s in self.layout:
            tensors[(s.name, s.part)] = self.storage[s.start : s.start + s.nbytes].view(s.dtype).view(s.shape)
        out: dict[str, ColumnData] = {}
        for s in self.layout:
            if s.part == "data":
                out[s.name] = tensors[(s.name, "data")]
            elif s.part == "values":
                out[s.name] = Ragged(tensors[(s.name, "values")], tensors[(s.name, "offsets")])
        return ColumnBatch(out, self.size)


def validate(schema: Schema, batch: ColumnBatch, nonfinite: str = "reject") -> int:
    """Raise a :class:`SchemaError` subclass naming the first mismatch; never modifies anything.

    An empty batch raises :class:`ShapeError`. Columns marked ``check_finite`` are checked with one
    reduction each: NaN/inf raise :class:`NonFiniteError` (``nonfinite="reject"``) or are returned as
    a count (``"count"``). Returns the number of non-finite values found (0 when none).
    """
    if batch.size == 0:
        raise ShapeError("an empty batch (0 items) cannot be written; put at least one item")
    names = set(batch.columns)
    missing = [n for n in schema.names if n not in names]
    extra = sorted(names - set(schema.names))
    if missing or extra:
        raise SchemaError(
            f"batch does not match the schema: missing columns {missing}, extra columns {extra}"
        )
    for col in schema:
        data = batch.columns[col.name]
        if col.ragged:
            if not isinstance(data, Ragged):
                raise SchemaError(f"column {col.name!r} is ragged in the schema; pass a conduit.Ragged")
            t = data.values
            _check_offsets(col.name, data)
        else:
            if isinstance(data, Ragged):
                raise SchemaError(f"column {col.name!r} is fixed-shape in the schema but got ragged data")
            t = data
        if t.dtype != col.dtype:
            raise DTypeError(f"column {col.name!r}: expected dtype {col.dtype}, got {t.dtype}")
        if tuple(t.shape[1:]) != col.shape:
            what = "per-token" if col.ragged else "per-item"
            raise ShapeError(
                f"column {col.name!r}: expected {what} shape {col.shape}, got {tuple(t.shape[1:])}"
            )
        if col.ragged and batch.size > 0:
            assert isinstance(data, Ragged) and col.max_len is not None
            longest = int(data.lengths.max())
            if longest > col.max_len:
                raise RaggedLengthError(
                    f"column {col.name!r}: an item has length {longest} > max_len {col.max_len}"
                )
    return _check_finite(schema, batch, nonfinite)


def _check_finite(schema: Schema, batch: ColumnBatch, nonfinite: str) -> int:
    """One ``isfinite().all()`` per checked column; values are counted only when one fails."""
    bad: dict[str, int] = {}
    for col in schema:
        if col.check_finite:
            data = batch.columns[col.name]
            t = data.values if isinstance(data, Ragged) else data
            if not bool(torch.isfinite(t).all()):
                bad[col.name] = int(t.numel() - torch.isfinite(t).sum())
    if bad and nonfinite == "reject":
        raise NonFiniteError(
            f"non-finite values (NaN or inf) in checked column(s) {bad}; fix the producer, or build the "
            "buffer with nonfinite='count' to store and count them"
        )
    return sum(bad.values())


def _check_offsets(name: str, data: Ragged) -> None:
    """Offsets must be 1-D int64, start at 0, never decrease and end at the number of values."""
    off = data.offsets
    if not isinstance(off, torch.Tensor) or not isinstance(data.values, torch.Tensor):
        raise SchemaError(f"column {name!r}: Ragged values and offsets must be tensors")
    if off.dtype != torch.int64 or off.dim() != 1 or off.numel() < 1:
        raise DTypeError(f"column {name!r}: offsets must be a non-empty 1-D int64 tensor")
    if data.values.dim() < 1:
        raise ShapeError(f"column {name!r}: Ragged values must have a leading (token) dimension")
    total = data.values.shape[0]
    first, last = int(off[0]), int(off[-1])
    if first != 0 or last != total:
        raise ShapeError(
            f"column {name!r}: offsets run from {first} to {last}, but must run from 0 to the "
            f"{total} values given"
        )
    if off.numel() > 1 and bool((off[1:] < off[:-1]).any()):
        raise ShapeError(f"column {name!r}: offsets decrease (an item of negative length)")
