"""Columnar storage of TransferQueue fields, slot = global index, on Conduit's memory tiers.

A field is one preallocated array on one tier: scalars ``[capacity]``; jagged fields slot-padded
``[capacity, max_len, *rest]`` with a length per slot (Conduit's ring layout: a write or a read of a
whole batch is one ``index_copy_`` / one gather, no per-sample work). Capacity and ``max_len`` grow by
doubling (one copy). Objects (strings, dicts) are kept in a list.

Tiers: ``shm`` (the default without a planner; a named file under ``/dev/shm`` that readers on the same node map and gather
from directly), ``disk`` (the same, under a directory), ``host`` (pageable), ``pinned`` and ``cuda``
(GPU machines). Each tier can have a byte budget; a field that would not fit its tier's remaining
budget goes to the next tier in :data:`SPILL_ORDER` that has room (logged, and counted in ``stats``);
if none has, :class:`StorageBackendError` names the field, the bytes it needs and what is free.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from dataclasses import dataclass

import torch

from conduit import Ragged
from conduit.buffer.ragged_kernels import gather_prefixes, scatter_prefixes
from conduit.buffer.recycled import host_pool
from conduit.buffer.tiers import allocate
from conduit_verl.errors import StorageBackendError
from conduit_verl.tq_store.columns import JAGGED, OBJECT, SCALAR, Column

logger = logging.getLogger(__name__)

TIERS = ("cuda", "pinned", "shm", "host", "disk")
#: where a field goes when its tier's budget is spent: the next tier in this order with room
SPILL_ORDER = TIERS
MAPPABLE = ("shm", "disk")  # tiers a same-node reader maps and reads in place


@dataclass(frozen=True)
class Layout:
    """Where a mappable field's memory is, for a reader on the same node.

    The file is unlinked as soon as it is created (nothing is left behind if the actor dies); readers
    open it through the actor's open descriptor (``/proc/<pid>/fd/<fd>``) and check its inode, since a
    descriptor number can be reused once the field has grown into a new file.
    """

    path: str
    inode: int
    dtype: str
    shape: tuple[int, ...]  # the whole array: [capacity] or [capacity, max_len, *rest]
    field: str = ""


class Budgets:
    """Bytes left per tier (``None``: no limit)."""

    def __init__(self, limits: dict[str, int] | None) -> None:
        unknown = sorted(set(limits or {}) - set(TIERS))
        if unknown:
            raise StorageBackendError(f"unknown tier(s) {unknown} in budgets; tiers: {', '.join(TIERS)}")
        self.free: dict[str, int | None] = {t: None for t in TIERS}
        self.free.update({t: int(v) for t, v in (limits or {}).items()})

    def take(self, field: str, tier: str, nbytes: int) -> str:
        """Reserve ``nbytes`` for ``field`` on ``tier`` or the first tier after it with room."""
        start = SPILL_ORDER.index(tier)
        for t in SPILL_ORDER[start:]:
            left = self.free[t]
            if t in ("cuda", "pinned") and not torch.cuda.is_available():
                continue
            if left is None or left >= nbytes:
                if left is not None:
                    self.free[t] = left - nbytes
                if t != tier:
                    logger.warning(
                        "conduit tq store: field %r spilled from %s to %s (%d bytes; %s had %s free)",
                        field, tier, t, nbytes, tier, self.free[tier],
                    )  # fmt: skip
                return t
        free = {t: self.free[t] for t in SPILL_ORDER[start:]}
        raise StorageBackendError(
            f"field {field!r} needs {nbytes} bytes on tier {tier!r} or a later one; free bytes per tier: {free}"
        )

    def give(self, tier: str, nbytes: int) -> None:
        if self.free[tier] is not None:
            self.free[tier] += nbytes  # type: ignore[operator]


class FieldArray:
    """One field's storage: slot ``g`` holds global index ``g``."""

    def __init__(self, name: str, kind: str, dtype: torch.dtype | None, rest: tuple[int, ...], tier: str,
                 budgets: Budgets, directory: str) -> None:  # fmt: skip
        self.name, self.kind, self.dtype, self.rest = name, kind, dtype, rest
        self.wanted_tier, self.tier, self.budgets, self.directory = tier, tier, budgets, directory
        self.capacity, self.max_len = 0, 0
        self.data: torch.Tensor | None = None
        self.lengths = torch.zeros(0, dtype=torch.int64)
        self.present = torch.zeros(0, dtype=torch.bool)
        self.objects: list[object] = []
        self.path: str | None = None
        self.fd, self.inode = -1, 0
        self.nbytes = 0
        self.spilled = False

    # -- growth --------------------------------------------------------------------------------

    def _target(self, capacity: int, max_len: int) -> tuple[int, int] | None:
        """The (capacity, max_len) a write up to ``capacity`` slots of ``max_len`` tokens grows to;
        None when it fits. Only the short dimension grows, geometrically (amortised one copy)."""
        if capacity <= self.capacity and max_len <= self.max_len:
            return None
        capacity = self.capacity if capacity <= self.capacity else max(capacity, 2 * self.capacity, 64)
        if self.kind != JAGGED:
            max_len = 0
        elif max_len > self.max_len:
            max_len = max(max_len, self.max_len + self.max_len // 2)
        else:
            max_len = self.max_len
        return capacity, max_len

    def _array_nbytes(self, capacity: int, max_len: int) -> int:
        if self.kind == OBJECT or self.dtype is None:
            return 0
        shape = (capacity,) if self.kind == SCALAR else (capacity, max_len, *self.rest)
        return math.prod(shape) * torch.empty((), dtype=self.dtype).element_size()

    def next_nbytes(self, slots: torch.Tensor, column: Column) -> int | None:
        """Bytes this field's array takes after writing ``column`` at ``slots`` if the write grows it
        (a re-allocation: the moment its tier can change at no extra copy); None if it fits."""
        longest = int(column.data.lengths.max()) if self.kind == JAGGED and column.size else 0
        target = self._target(int(slots.max()) + 1, longest) if slots.numel() else None
        return None if target is None else self._array_nbytes(*target)

    def _ensure(self, capacity: int, max_len: int) -> None:
        target = self._target(capacity, max_len)
        if target is None:
            return
        capacity, max_len = target
        old_cap = self.capacity
        self.lengths = _grow(self.lengths, capacity)
        self.present = _grow(self.present, capacity)
        if self.kind == OBJECT:
            self.objects.extend([None] * (capacity - len(self.objects)))
            self.capacity = capacity
            return
        assert self.dtype is not None
        shape = (capacity,) if self.kind == SCALAR else (capacity, max_len, *self.rest)
        nbytes = self._array_nbytes(capacity, max_len)
        if self.data is not None:
            self.budgets.give(self.tier, self.nbytes)
        tier = self.budgets.take(self.name, self.wanted_tier, nbytes)
        data, path, fd, inode = self._allocate(shape, tier)
        if self.data is not None:
            if self.kind == SCALAR:
                data[:old_cap].copy_(self.data)
            else:
                data[:old_cap, : self.max_len].copy_(self.data)
        self._release()
        self.data, self.path, self.tier, self.nbytes = data, path, tier, nbytes
        self.fd, self.inode = fd, inode
        self.spilled = tier != self.wanted_tier
        self.capacity, self.max_len = capacity, max_len

    def _allocate(self, shape: tuple[int, ...], tier: str) -> tuple[torch.Tensor, str | None, int, int]:
        """The array, and for mappable tiers the reader's path, the open descriptor and the inode."""
        assert self.dtype is not None
        if tier not in MAPPABLE:
            return allocate(shape, self.dtype, tier), None, -1, 0
        directory = "/dev/shm" if tier == "shm" else self.directory
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"conduit-tq-{self.name}-{uuid.uuid4().hex[:12]}")
        numel = max(math.prod(shape), 1)
        flat = torch.from_file(path, shared=True, size=numel, dtype=self.dtype)
        fd = os.open(path, os.O_RDWR)
        os.unlink(path)
        return flat[: math.prod(shape)].view(shape), f"/proc/{os.getpid()}/fd/{fd}", fd, os.fstat(fd).st_ino

    def _release(self) -> None:
        if self.path is not None:  # readers that mapped it keep their mapping; later ones get the new layout
            os.close(self.fd)
            self.path = None

    # -- batch operations ------------------------------------------------------------------------

    def check(self, column: Column) -> None:
        if column.kind != self.kind or column.dtype != self.dtype or column.rest != self.rest:
            raise StorageBackendError(
                f"field {self.name!r} holds {self.kind} {self.dtype} {self.rest}; a put brought "
                f"{column.kind} {column.dtype} {column.rest} (clear the field's samples first)"
            )

    def put(self, slots: torch.Tensor, column: Column) -> None:
        self.check(column)
        longest = int(column.data.lengths.max()) if self.kind == JAGGED and column.size else 0
        self._ensure(int(slots.max()) + 1, longest)
        if self.kind == OBJECT:
            for s, x in zip(slots.tolist(), column.data):
                self.objects[s] = x
        elif self.kind == SCALAR:
            assert self.data is not None
            self.data.index_copy_(0, slots.to(self.data.device), column.data.to(self.data.device))
        else:
            assert self.data is not None
            ragged: Ragged = column.data
            if self.data.device.type == "cpu":  # one pass, each byte copied once (ragged_kernels)
                scatter_prefixes(self.data, slots, ragged.offsets, ragged.values.contiguous())
            else:
                padded = _pad_to_longest(ragged, longest)  # the batch's longest, not the field's
                self.data[:, :longest].index_copy_(0, slots.to(self.data.device), padded.to(self.data.device))
            self.lengths.index_copy_(0, slots, ragged.lengths)
        self.present[slots] = True

    def missing(self, slots: torch.Tensor) -> list[int]:
        inside = slots < self.capacity
        ok = torch.zeros_like(slots, dtype=torch.bool)
        ok[inside] = self.present[slots[inside]]
        return slots[~ok].tolist()

    def get(self, slots: torch.Tensor) -> Column:
        if self.kind == OBJECT:
            return Column(OBJECT, [self.objects[s] for s in slots.tolist()])
        assert self.data is not None
        if self.kind == SCALAR:
            return Column(SCALAR, self.data.index_select(0, slots.to(self.data.device)).to("cpu"))
        return Column(JAGGED, gather_padded(self.data, slots, self.lengths.index_select(0, slots)))

    def layout(self) -> Layout | None:
        if self.path is None or self.data is None:
            return None
        return Layout(self.path, self.inode, str(self.dtype), tuple(self.data.shape), self.name)

    def clear(self, slots: torch.Tensor) -> None:
        slots = slots[slots < self.capacity]
        self.present[slots] = False
        if self.kind == OBJECT:
            for s in slots.tolist():
                self.objects[s] = None

    def close(self) -> None:
        self._release()
        self.budgets.give(self.tier, self.nbytes)
        self.data, self.nbytes = None, 0


class StaleLayoutError(Exception):
    """The mapped file is gone or another file now has its descriptor: ask the store again."""


# per reader process: (store process, field) -> (inode, mapped array); a field that grew into a new
# file replaces its entry, so the old file's pages are freed once the store drops it too
_MAPPED: dict[tuple[str, str], tuple[int, torch.Tensor]] = {}
_MAPPED_MAX = 256


def _map(layout: Layout) -> torch.Tensor:
    key = (layout.path.rsplit("/fd/", 1)[0], layout.field)
    hit = _MAPPED.get(key)
    if hit is not None and hit[0] == layout.inode and tuple(hit[1].shape) == layout.shape:
        return hit[1]
    try:
        fd = os.open(layout.path, os.O_RDONLY)
    except OSError as e:
        raise StaleLayoutError(str(e)) from e
    try:
        if os.fstat(fd).st_ino != layout.inode:
            raise StaleLayoutError(f"{layout.path} is another file now")
        dtype = getattr(torch, layout.dtype.removeprefix("torch."))
        numel = math.prod(layout.shape)
        flat = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=max(numel, 1), dtype=dtype)
    finally:
        os.close(fd)  # the mapping stays valid
    array = flat[:numel].view(layout.shape)
    if key not in _MAPPED and len(_MAPPED) >= _MAPPED_MAX:
        _MAPPED.pop(next(iter(_MAPPED)))
    _MAPPED[key] = (layout.inode, array)
    return array


def read_mapped(layout: Layout, slots: torch.Tensor, lengths: torch.Tensor | None, kind: str) -> Column:
    """A same-node reader's gather straight from the store's memory: one copy, into its own tensor."""
    array = _map(layout)
    if kind == SCALAR:
        return Column(SCALAR, array.index_select(0, slots))
    assert lengths is not None
    return Column(JAGGED, gather_padded(array, slots, lengths))


_SAME_WIDTH_FLOAT = {torch.int64: torch.float64, torch.int32: torch.float32, torch.int16: torch.float16}


def _pad_to_longest(ragged: Ragged, longest: int) -> torch.Tensor:
    """``[B, longest, *rest]`` right-padded with zeros (torch's jagged-to-padded kernel, through a
    same-width float view for integers)."""
    fast = _SAME_WIDTH_FLOAT.get(ragged.values.dtype)
    values = ragged.values.view(fast) if fast is not None else ragged.values
    if len(ragged) == 0 or longest == 0:
        return values.new_zeros((len(ragged), longest, *values.shape[1:]))
    nt = torch.nested.nested_tensor_from_jagged(values, ragged.offsets, max_seqlen=longest)
    return torch.nested.to_padded_tensor(nt, 0.0)


def gather_padded(array: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> Ragged:
    """The first ``lengths[i]`` steps of rows ``slots[i]`` of ``[capacity, max_len, *rest]``, flat.

    On CPU one pass copies each valid token once (:func:`conduit.buffer.ragged_kernels.gather_prefixes`)
    into memory from the process's :class:`~conduit.buffer.recycled.HostPool`: once the consumer drops
    an earlier batch, the next one reuses its pages instead of faulting in fresh ones. On a device the
    rows are gathered whole and their prefixes concatenated by torch.
    """
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    rest = tuple(array.shape[2:])
    if array.device.type == "cpu":
        out = host_pool().empty((int(offsets[-1]), *rest), array.dtype)
        return Ragged(gather_prefixes(array, slots, offsets, out), offsets)
    fast = _SAME_WIDTH_FLOAT.get(array.dtype)
    source = array.view(fast) if fast is not None else array
    rows = source.index_select(0, slots.to(array.device)).to("cpu")
    max_len = array.shape[1]
    if lengths.numel() == 0:
        values = rows.reshape(0, *rest)
    else:
        sizes = torch.stack([lengths, max_len - lengths], 1).reshape(-1).tolist()
        values = torch.cat(rows.reshape(-1, *rest).split(sizes)[::2])
    return Ragged(values.view(array.dtype) if fast is not None else values, offsets)


def _grow(t: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=t.dtype)
    out[: t.numel()] = t
    return out
