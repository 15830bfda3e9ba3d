"""One column of a batch by key, of one of three kinds, and its wire form (numpy arrays, nothing pickled).

- ``scalar``: one number per item (a 1-d tensor ``[B]``), e.g. a reward or a length;
- ``jagged``: a leading variable-length axis per item, kept as :class:`conduit.Ragged` (flat values +
  offsets), e.g. token ids;
- ``object``: a list of Python values without an array form (strings, dicts).

A :class:`Column` is what a :class:`~conduit.buffer.keyed.KeyedStore` served to other processes takes
and gives (:mod:`conduit.buffer.keyed_service`, :mod:`conduit.buffer.keyed_client`): a batch-level
column, never a list of per-item tensors. :func:`to_wire` / :func:`from_wire` give its form on the wire
(``(kind, dtype name, array[, offsets])``); :func:`from_wire` checks what came (kind, dtype, dims,
offsets) and raises :class:`~conduit.errors.SchemaError` (:class:`~conduit.errors.DTypeError` for a
dtype) naming the problem.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from conduit import wire
from conduit.batch import Ragged
from conduit.buffer.keyed import JAGGED, OBJECT, SCALAR, Data, Spec
from conduit.buffer.ragged_kernels import copy_segments
from conduit.buffer.recycled import host_pool
from conduit.errors import SchemaError

KINDS = (SCALAR, JAGGED, OBJECT)


@dataclass(frozen=True)
class Column:
    """One column of a batch: ``data`` is a tensor ``[B]`` (scalar), a :class:`Ragged` (jagged) or a list."""

    kind: str
    data: Data

    @staticmethod
    def of(data: Data) -> Column:
        """The column holding ``data`` (its kind from its type)."""
        return Column(Spec.of(data).kind, data)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def spec(self) -> Spec:
        return Spec.of(self.data)

    @property
    def dtype(self) -> torch.dtype | None:
        return self.spec.dtype

    @property
    def rest(self) -> tuple[int, ...]:
        """Per-item (scalar) or per-token (jagged) shape."""
        return self.spec.shape

    @property
    def nbytes(self) -> int:
        return 0 if isinstance(self.data, list) else int(self.data.nbytes)

    def plan_spec(self) -> tuple[str, str | None, tuple[int, ...], int]:
        """What a write plan needs of the column: ``(kind, dtype name, per-token shape, longest item)``."""
        dtype = None if self.dtype is None else str(self.dtype)
        longest = int(self.data.lengths.max()) if isinstance(self.data, Ragged) and self.size else 0
        return self.kind, dtype, self.rest, longest

    def select(self, positions: torch.Tensor) -> Column:
        """The items at ``positions`` (one vectorised gather)."""
        if isinstance(self.data, list):
            return Column(OBJECT, [self.data[i] for i in positions.tolist()])
        if isinstance(self.data, Ragged):
            return Column(JAGGED, self.data.index(positions))
        return Column(SCALAR, self.data.index_select(0, positions))

    @staticmethod
    def cat(parts: Sequence[Column]) -> Column:
        """The items of ``parts`` one after another (one copy)."""
        if len(parts) == 1:
            return parts[0]
        kind = parts[0].kind
        if kind == SCALAR:
            return Column(SCALAR, torch.cat([p.data for p in parts]))  # type: ignore[misc]
        if kind == JAGGED:
            return Column(JAGGED, Ragged.cat([p.data for p in parts]))  # type: ignore[misc]
        return Column(OBJECT, [x for p in parts for x in p.data])  # type: ignore[union-attr]

    @staticmethod
    def merge(parts: Sequence[Column], positions: Sequence[torch.Tensor], size: int) -> Column:
        """One column of ``size`` items with ``parts[k]``'s item ``i`` at ``positions[k][i]`` (the parts
        of a read answered by several stores): each byte copied once, into pooled memory."""
        kind = parts[0].kind
        if kind == OBJECT:
            items: list[Any] = [None] * size
            for p, pos in zip(parts, positions):
                for i, x in zip(pos.tolist(), p.data):  # type: ignore[arg-type]
                    items[i] = x
            return Column(OBJECT, items)
        if kind == SCALAR:
            first: torch.Tensor = parts[0].data  # type: ignore[assignment]
            out = torch.empty((size, *first.shape[1:]), dtype=first.dtype)
            for p, pos in zip(parts, positions):
                out.index_copy_(0, pos, p.data)  # type: ignore[arg-type]
            return Column(SCALAR, out)
        ragged: list[Ragged] = [p.data for p in parts]  # type: ignore[misc]
        lengths = torch.zeros(size, dtype=torch.int64)
        for r, pos in zip(ragged, positions):
            lengths[pos] = r.lengths
        offsets = torch.zeros(size + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        values0 = ragged[0].values
        values = host_pool().empty((int(offsets[-1]), *values0.shape[1:]), values0.dtype)
        for r, pos in zip(ragged, positions):
            copy_segments(r.values.contiguous(), r.offsets[:-1], values, offsets[pos], r.lengths)
        return Column(JAGGED, Ragged(values, offsets))


# -- the wire: numpy arrays travel through a data port or Ray's object store without pickling -------


def to_wire(column: Column) -> tuple:
    """``(kind, dtype, values[, offsets])`` of a column (:class:`~conduit.errors.DTypeError` for a dtype
    the wire does not carry); an object column is ``(kind, list)``."""
    if isinstance(column.data, Ragged):
        dtype, values = wire.to_numpy(column.data.values)
        return (JAGGED, dtype, values, column.data.offsets.numpy())
    if isinstance(column.data, torch.Tensor):
        return (SCALAR, *wire.to_numpy(column.data))
    return (OBJECT, column.data)


def from_wire(form: Any, writable: bool = False) -> Column:
    """The column of a wire tuple, checked (:class:`~conduit.errors.SchemaError` for a malformed one: an
    unknown kind, a scalar column that is not 1-d, offsets that do not start at 0, go back or end past the
    values; :class:`~conduit.errors.DTypeError` for a dtype). Arrays from a data port are read-only:
    ``writable`` copies them; without it the column is a read-only view (for a reader that only copies
    out of it)."""

    def tensor(dtype: str, a: np.ndarray) -> torch.Tensor:
        if writable and isinstance(a, np.ndarray) and not a.flags.writeable:
            a = np.array(a, copy=True)
        with warnings.catch_warnings():  # a read-only view is fine for a reader that only copies out
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return wire.from_numpy(dtype, a)

    kind = form[0] if isinstance(form, tuple | list) and form else None
    if kind == SCALAR and len(form) == 3:
        data = tensor(form[1], form[2])
        if data.dim() != 1:
            raise SchemaError(f"a scalar column is 1-d; this one has shape {tuple(data.shape)}")
        return Column(SCALAR, data)
    if kind == JAGGED and len(form) == 4:
        values = tensor(form[1], form[2])
        offsets = form[3]
        if values.dim() < 1 or not isinstance(offsets, np.ndarray) or offsets.dtype != np.int64:
            raise SchemaError("a jagged column is values of 1 or more dims and int64 offsets")
        _check_offsets(offsets, values.shape[0])
        return Column(JAGGED, Ragged(values, torch.from_numpy(np.array(offsets, copy=True))))
    if kind == OBJECT and len(form) == 2 and isinstance(form[1], list | tuple):
        return Column(OBJECT, list(form[1]))
    raise SchemaError(f"malformed column: kind {kind!r} with {len(form) if kind else 0} parts")


def _check_offsets(offsets: np.ndarray, total: int) -> None:
    """Offsets of ``total`` values: 1-d, from 0, never going back, ending at ``total`` (vectorised)."""
    if (
        offsets.ndim != 1
        or offsets.size < 1
        or offsets[0] != 0
        or offsets[-1] != total
        or bool((offsets[1:] < offsets[:-1]).any())
    ):
        raise SchemaError(
            f"jagged offsets must run from 0 to the {total} values without going back; "
            f"got {offsets.size} offsets {offsets[:8].tolist()}..."
        )
