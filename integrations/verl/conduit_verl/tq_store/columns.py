"""A TensorDict field as one core :class:`~conduit.buffer.columns.Column` (scalar, jagged or object),
never a list of per-sample tensors (except opaque Python objects, which have no other form): dense
``[B, L, *rest]`` and jagged nested tensors become :class:`conduit.Ragged`; strided nested tensors and
``NonTensorStack`` strings and dicts are objects. On the way back a field is rebuilt as TransferQueue's
own storage returns it: scalars dense, every other tensor field as a jagged nested tensor, objects as a
``NonTensorStack``.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import NonTensorStack

from conduit import Ragged
from conduit.buffer.columns import JAGGED, OBJECT, SCALAR, Column
from conduit_verl.errors import StorageBackendError


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
