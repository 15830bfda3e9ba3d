"""A TensorDict field as one batch-level column, and its form on the wire (numpy, for Ray's object store).

verl's TransferQueue fields come in three shapes; each becomes one column, never a list of per-sample
tensors (except opaque Python objects, which have no other form):

- ``scalar``: one number per sample (``[B]``), e.g. a reward or a length;
- ``jagged``: a leading variable-length axis per sample (token-level: ``[B, L]`` dense or a jagged
  nested tensor ``[B, j, *rest]``), kept as :class:`conduit.Ragged` (flat values + offsets);
- ``object``: anything else (``NonTensorStack`` strings and dicts, strided nested tensors).

On the way back a field is rebuilt as TransferQueue's own storage returns it: scalars dense, every
other tensor field as a jagged nested tensor, objects as a ``NonTensorStack``.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorStack

from conduit import Ragged, wire
from conduit.buffer.ragged_kernels import copy_segments
from conduit.buffer.recycled import host_pool
from conduit.errors import DTypeError
from conduit.port import Coalescer
from conduit_verl.errors import StorageBackendError

SCALAR, JAGGED, OBJECT = "scalar", "jagged", "object"


def torch_dtype(name: object) -> torch.dtype:
    """The dtype named ``name`` (:func:`conduit.wire.torch_dtype`); :class:`StorageBackendError` else."""
    try:
        return wire.torch_dtype(name)
    except DTypeError as e:
        raise StorageBackendError(str(e)) from None


@dataclass(frozen=True)
class Column:
    """One field of a batch: ``data`` is a tensor ``[B]`` (scalar), a :class:`Ragged` (jagged) or a list."""

    kind: str
    data: Any

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def dtype(self) -> torch.dtype | None:
        if self.kind == SCALAR:
            return self.data.dtype
        return self.data.values.dtype if self.kind == JAGGED else None

    @property
    def rest(self) -> tuple[int, ...]:
        """Per-token shape of a jagged column."""
        return tuple(self.data.values.shape[1:]) if self.kind == JAGGED else ()

    @property
    def nbytes(self) -> int:
        return 0 if self.kind == OBJECT else int(self.data.nbytes)

    def select(self, positions: torch.Tensor) -> Column:
        """The samples at ``positions`` (one vectorised gather)."""
        if self.kind == SCALAR:
            return Column(SCALAR, self.data.index_select(0, positions))
        if self.kind == JAGGED:
            return Column(JAGGED, self.data.index(positions))
        return Column(OBJECT, [self.data[i] for i in positions.tolist()])

    @staticmethod
    def cat(parts: Sequence[Column]) -> Column:
        """The samples of ``parts`` one after another (one copy)."""
        if len(parts) == 1:
            return parts[0]
        kind = parts[0].kind
        if kind == SCALAR:
            return Column(SCALAR, torch.cat([p.data for p in parts]))
        if kind == JAGGED:
            return Column(JAGGED, Ragged.cat([p.data for p in parts]))
        return Column(OBJECT, [x for p in parts for x in p.data])

    @staticmethod
    def merge(parts: Sequence[Column], positions: Sequence[torch.Tensor], size: int) -> Column:
        """One column of ``size`` samples with ``parts[k]``'s sample ``i`` at ``positions[k][i]`` (the
        parts of a get answered by several stores): each byte copied once, into pooled memory."""
        kind = parts[0].kind
        if kind == OBJECT:
            items: list[Any] = [None] * size
            for p, pos in zip(parts, positions):
                for i, x in zip(pos.tolist(), p.data):
                    items[i] = x
            return Column(OBJECT, items)
        if kind == SCALAR:
            first = parts[0].data
            out = torch.empty((size, *first.shape[1:]), dtype=first.dtype)
            for p, pos in zip(parts, positions):
                out.index_copy_(0, pos, p.data)
            return Column(SCALAR, out)
        lengths = torch.zeros(size, dtype=torch.int64)
        for p, pos in zip(parts, positions):
            lengths[pos] = p.data.lengths
        offsets = torch.zeros(size + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        values0 = parts[0].data.values
        values = host_pool().empty((int(offsets[-1]), *values0.shape[1:]), values0.dtype)
        for p, pos in zip(parts, positions):
            r: Ragged = p.data
            copy_segments(r.values.contiguous(), r.offsets[:-1], values, offsets[pos], r.lengths)
        return Column(JAGGED, Ragged(values, offsets))


def put_batcher(send: Callable[[np.ndarray, dict[str, Column]], Awaitable[None]]) -> Coalescer:
    """Puts to one store that queue behind calls in flight, sent together (:class:`conduit.port.Coalescer`:
    verl's agent loop puts one trajectory at a time, many at once): puts that bring the same fields of
    the same kinds, dtypes and shapes are joined field by field."""

    def join(parts: list[dict[str, Column]]) -> dict[str, Column]:
        return {name: Column.cat([p[name] for p in parts]) for name in parts[0]}

    def signature(columns: dict[str, Column]) -> tuple:
        return tuple(sorted((name, c.kind, str(c.dtype), c.rest) for name, c in columns.items()))

    return Coalescer(send, join, signature)


def column_of(name: str, value: Any) -> Column:
    """The column of TensorDict field ``name`` (no copy for dense and jagged tensors)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            if value.layout == torch.jagged and getattr(value, "_lengths", None) is not None:
                value = value.contiguous()  # a jagged view with holes (explicit lengths): compact it
            if value.layout == torch.jagged and getattr(value, "_ragged_idx", 1) == 1:
                return Column(JAGGED, Ragged.from_nested(value))
            return Column(OBJECT, list(value.unbind()))
        if value.dim() == 1:
            return Column(SCALAR, value)
        if value.dim() == 0:
            raise StorageBackendError(f"field {name!r}: a 0-d tensor has no batch dimension")
        b, length = value.shape[0], value.shape[1]
        offsets = torch.arange(b + 1, dtype=torch.int64) * length
        return Column(JAGGED, Ragged(value.reshape(b * length, *value.shape[2:]), offsets))
    if isinstance(value, NonTensorStack):
        return Column(OBJECT, value.tolist())
    if isinstance(value, list | tuple):
        return Column(OBJECT, list(value))
    raise StorageBackendError(f"field {name!r}: cannot store a {type(value).__name__}")


def spec_of(column: Column) -> tuple[str, str | None, tuple[int, ...], int]:
    """What a write plan needs of a column: ``(kind, dtype, per-token shape, longest sample)``."""
    dtype = None if column.dtype is None else str(column.dtype)
    longest = int(column.data.lengths.max()) if column.kind == JAGGED and column.size else 0
    return column.kind, dtype, column.rest, longest


def field_schema(data: Any, columns: dict[str, Column]) -> dict[str, dict[str, Any]]:
    """TransferQueue's ``extract_field_schema(data)`` (what the controller records per field), computed
    from the columns: per-sample shapes of a jagged nested field come from its lengths in one
    ``tolist`` (TQ's own function unbinds every nested field twice, ~25 ms for 1 024 x 4 fields).
    Fields of any other form are left to TQ's function."""
    from transfer_queue.metadata import extract_field_schema

    out: dict[str, dict[str, Any]] = {}
    others = []
    for name, value in data.items():
        column = columns.get(name)
        nested = isinstance(value, torch.Tensor) and value.is_nested and value.layout == torch.jagged
        if column is None or column.kind != JAGGED or not nested or column.size == 0:
            others.append(name)
            continue
        rest = column.rest
        lengths = column.data.lengths.tolist()
        out[name] = {
            "dtype": column.dtype,
            "shape": torch.Size((lengths[0], *rest)),
            "is_nested": True,
            "is_non_tensor": False,
            "per_sample_shapes": [(n, *rest) for n in lengths],
        }
    if others:
        out.update(extract_field_schema(data.select(*others)))
    return {name: out[name] for name in data.keys()}


def field_of(column: Column) -> Any:
    """The TensorDict value TransferQueue's own storage would return for ``column``."""
    if column.kind == SCALAR:
        return column.data
    if column.kind == JAGGED:
        return column.data.to_nested()  # with its min/max length, as TQ's own storage gives them
    items = column.data
    if items and all(isinstance(x, torch.Tensor) for x in items):
        try:
            return torch.nested.as_nested_tensor(items, layout=torch.strided)
        except (RuntimeError, TypeError):
            pass
    return NonTensorStack(*items)


# -- the wire: numpy arrays travel through Ray's shared-memory object store without pickling -------


def _to_numpy(t: torch.Tensor) -> tuple[str, np.ndarray]:
    torch_dtype(str(t.dtype))  # a dtype the store does not take is refused here, by the writer
    return wire.to_numpy(t)


def _from_numpy(dtype: str, a: np.ndarray) -> torch.Tensor:
    try:
        return wire.from_numpy(dtype, a)
    except DTypeError as e:
        raise StorageBackendError(str(e)) from None


def to_wire(column: Column) -> tuple:
    if column.kind == SCALAR:
        return (SCALAR, *_to_numpy(column.data))
    if column.kind == JAGGED:
        dtype, values = _to_numpy(column.data.values)
        return (JAGGED, dtype, values, column.data.offsets.numpy())
    return (OBJECT, column.data)


def from_wire(wire: tuple, writable: bool = False) -> Column:
    """The column of a wire tuple, checked (:class:`StorageBackendError` for a malformed one: an
    unknown kind or dtype, a scalar column that is not 1-d, offsets that do not start at 0, go back or
    end past the values). Arrays from the data port are read-only: ``writable`` copies them; without it
    the column is a read-only view (the store only copies out of it)."""

    def tensor(dtype: str, a: np.ndarray) -> torch.Tensor:
        if writable and isinstance(a, np.ndarray) and not a.flags.writeable:
            a = np.array(a, copy=True)
        with warnings.catch_warnings():  # a read-only view is fine for a reader that only copies out
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return _from_numpy(dtype, a)

    kind = wire[0] if isinstance(wire, tuple | list) and wire else None
    if kind == SCALAR and len(wire) == 3:
        data = tensor(wire[1], wire[2])
        if data.dim() != 1:
            raise StorageBackendError(f"a scalar column is 1-d; this one has shape {tuple(data.shape)}")
        return Column(SCALAR, data)
    if kind == JAGGED and len(wire) == 4:
        values = tensor(wire[1], wire[2])
        offsets = wire[3]
        if values.dim() < 1 or not isinstance(offsets, np.ndarray) or offsets.dtype != np.int64:
            raise StorageBackendError("a jagged column is values of 1 or more dims and int64 offsets")
        _check_offsets(offsets, values.shape[0])
        return Column(JAGGED, Ragged(values, torch.from_numpy(np.array(offsets, copy=True))))
    if kind == OBJECT and len(wire) == 2 and isinstance(wire[1], list | tuple):
        return Column(OBJECT, list(wire[1]))
    raise StorageBackendError(f"malformed column: kind {kind!r} with {len(wire) if kind else 0} parts")


def _check_offsets(offsets: np.ndarray, total: int) -> None:
    """Offsets of ``total`` values: 1-d, from 0, never going back, ending at ``total`` (vectorised)."""
    if (
        offsets.ndim != 1
        or offsets.size < 1
        or offsets[0] != 0
        or offsets[-1] != total
        or bool((offsets[1:] < offsets[:-1]).any())
    ):
        raise StorageBackendError(
            f"jagged offsets must run from 0 to the {total} values without going back; "
            f"got {offsets.size} offsets {offsets[:8].tolist()}..."
        )
