"""Columnar storage of TransferQueue fields, slot = global index, on Conduit's memory tiers.

A field is one preallocated array on one tier: scalars ``[capacity]``; jagged fields row-padded
``[capacity, max_len, *rest]`` with a length per row (Conduit's ring layout: a write or a read of a
whole batch is one compiled pass over its rows' valid prefixes, :mod:`conduit.buffer.ragged_kernels`,
no padding and no per-sample Python), and per global index the row that holds it (:class:`KeyIndex`:
sorted keys, memory in proportion to the indexes held, not to the largest). Capacity and ``max_len``
grow by doubling (one copy). Objects (strings, dicts) are kept in a list.

A writer on the same node can fill rows itself (:func:`write_mapped`): the store reserves fresh rows
for it (a write plan), the writer scatters its tensor into the mapped file (one copy), and a commit
points the indexes at the rows. A plan whose field grew into a new file meanwhile is refused (its
rows were written into the old file); the writer plans again or sends the data.

Tiers: ``shm`` (the default without a planner; a named file under ``/dev/shm`` that readers on the
same node map and gather from directly), ``disk`` (the same, under a directory), ``host`` (pageable), ``pinned`` and ``cuda``
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

import numpy as np
import torch

from conduit import Ragged
from conduit.buffer.ragged_kernels import gather_prefixes, scatter_prefixes
from conduit.buffer.recycled import host_pool
from conduit.buffer.tiers import allocate, reserve_file
from conduit_verl.errors import StorageBackendError
from conduit_verl.tq_store.columns import JAGGED, OBJECT, SCALAR, Column, torch_dtype

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

    def take(self, field: str, tier: str, nbytes: int, free: dict[str, int | None] | None = None) -> str:
        """Reserve ``nbytes`` for ``field`` on ``tier`` or the first tier after it with room (in
        ``free``, a copy of :attr:`free` to try a write's growth before making it, when given)."""
        book = self.free if free is None else free
        start = SPILL_ORDER.index(tier)
        for t in SPILL_ORDER[start:]:
            left = book[t]
            if t in ("cuda", "pinned") and not torch.cuda.is_available():
                continue
            if left is None or left >= nbytes:
                if left is not None:
                    book[t] = left - nbytes
                if t != tier and free is None:
                    logger.warning(
                        "conduit tq store: field %r spilled from %s to %s (%d bytes; %s had %s free)",
                        field, tier, t, nbytes, tier, self.free[tier],
                    )  # fmt: skip
                return t
        left = {t: book[t] for t in SPILL_ORDER[start:]}
        raise StorageBackendError(
            f"field {field!r} needs {nbytes} bytes on tier {tier!r} or a later one; free bytes per tier: {left}"
        )

    def give(self, tier: str, nbytes: int, free: dict[str, int | None] | None = None) -> None:
        book = self.free if free is None else free
        if book[tier] is not None:
            book[tier] += nbytes  # type: ignore[operator]


class KeyIndex:
    """Per global index the row holding it: sorted keys and their rows (memory in proportion to the
    indexes held, whatever their values). Every operation is vectorised over a batch (numpy: a few
    microseconds a call at the batch sizes of a put)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros(0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.rows.nbytes

    def _find(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per slot its position in :attr:`keys` and whether it is there."""
        if not self.keys.size:
            return np.zeros(slots.size, dtype=np.int64), np.zeros(slots.size, dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, slots), self.keys.size - 1)
        return pos, self.keys[pos] == slots

    def find(self, slots: torch.Tensor) -> torch.Tensor:
        """The rows holding ``slots``; -1 where none."""
        s = slots.numpy()
        if not self.keys.size:
            return torch.full_like(slots, -1)
        pos, hit = self._find(s)
        return torch.from_numpy(np.where(hit, self.rows[pos], -1))

    def set(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Point ``slots`` (distinct) at ``rows``."""
        s, r = slots.numpy(), rows.numpy()
        if not s.size:
            return
        increasing = s.size == 1 or bool((s[1:] > s[:-1]).all())
        if increasing and (not self.keys.size or s[0] > self.keys[-1]):
            self.keys, self.rows = np.concatenate([self.keys, s]), np.concatenate([self.rows, r])
            return  # keys that come in increasing order, past the ones held (TransferQueue's counter)
        pos, hit = self._find(s)
        self.rows[pos[hit]] = r[hit]
        new = ~hit
        if not new.any():
            return
        order = np.argsort(s[new], kind="stable")
        keys, new_rows = s[new][order], r[new][order]
        at = np.searchsorted(self.keys, keys) + np.arange(keys.size)
        total = self.keys.size + keys.size
        old = np.ones(total, dtype=bool)
        old[at] = False
        merged_keys, merged_rows = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
        merged_keys[at], merged_rows[at] = keys, new_rows
        merged_keys[old], merged_rows[old] = self.keys, self.rows
        self.keys, self.rows = merged_keys, merged_rows

    def remove(self, slots: torch.Tensor) -> torch.Tensor:
        """Forget ``slots``; the rows they had."""
        pos, hit = self._find(slots.numpy())
        gone = pos[hit]
        rows = self.rows[gone]
        if gone.size:
            keep = np.ones(self.keys.size, dtype=bool)
            keep[gone] = False
            self.keys, self.rows = self.keys[keep], self.rows[keep]
        return torch.from_numpy(rows)


class FieldArray:
    """One field's storage: rows of one array, and per global index the row holding it (:attr:`index`).

    A put of an index that has a row overwrites the row in place; an index without one takes a free
    row. A same-node writer's plan (:meth:`reserve`) takes fresh rows no index points at: the writer
    fills them in place and :meth:`commit` points the indexes at them (freeing the rows they had), so
    nothing a plan writes is visible before its commit, and an upsert replaces the old value whole.
    """

    def __init__(self, name: str, kind: str, dtype: torch.dtype | None, rest: tuple[int, ...], tier: str,
                 budgets: Budgets, directory: str) -> None:  # fmt: skip
        self.name, self.kind, self.dtype, self.rest = name, kind, dtype, rest
        self.wanted_tier, self.tier, self.budgets, self.directory = tier, tier, budgets, directory
        self.capacity, self.max_len = 0, 0  # rows; tokens per row
        self.data: torch.Tensor | None = None
        self.lengths = torch.zeros(0, dtype=torch.int64)  # per row
        self.used = torch.zeros(0, dtype=torch.bool)  # per row: an index's, or reserved by a plan
        self._in_use: int | None = 0  # used.sum(), None when stale
        self.index = KeyIndex()  # per global index its row
        self.objects: list[object] = []  # per row
        self.path: str | None = None
        self.fd, self.inode = -1, 0
        self.nbytes = 0
        self.spilled = False
        self.generation = 0  # bumped when the array moves to new memory: plans made before are stale

    # -- growth --------------------------------------------------------------------------------

    def _target(self, capacity: int, max_len: int) -> tuple[int, int] | None:
        """The (capacity, max_len) a write needing ``capacity`` rows of ``max_len`` tokens grows to;
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

    @property
    def in_use(self) -> int:
        """Rows in use (an index's, or reserved by a plan)."""
        if self._in_use is None:
            self._in_use = int(self.used.sum())
        return self._in_use

    def new_rows(self, slots: torch.Tensor) -> int:
        """How many of ``slots`` (global indexes) have no row yet."""
        return int((self.index.find(slots) < 0).sum())

    def next_nbytes(self, new_rows: int, longest: int) -> int | None:
        """Bytes this field's array takes after a write of ``new_rows`` more rows of up to ``longest``
        tokens if the write grows it (a re-allocation: the moment its tier can change at no extra
        copy); None if it fits."""
        target = self._target(self.in_use + new_rows, longest if self.kind == JAGGED else 0)
        return None if target is None else self._array_nbytes(*target)

    def try_grow(self, new_rows: int, longest: int, free: dict[str, int | None]) -> None:
        """:meth:`grow`'s budget bookkeeping on ``free`` (a copy of the budgets): raises
        :class:`StorageBackendError` where :meth:`grow` would, and changes nothing else."""
        nbytes = self.next_nbytes(new_rows, longest)
        if nbytes is None or self.kind == OBJECT:
            return
        if self.data is not None:
            self.budgets.give(self.tier, self.nbytes, free)
        self.budgets.take(self.name, self.wanted_tier, nbytes, free)

    def grow(self, new_rows: int, longest: int) -> None:
        """Make room for ``new_rows`` more rows and rows of ``longest`` tokens (the contents kept)."""
        self._ensure(self.in_use + new_rows, longest if self.kind == JAGGED else 0)

    def _ensure(self, capacity: int, max_len: int) -> None:
        target = self._target(capacity, max_len)
        if target is None:
            return
        capacity, max_len = target
        old_cap = self.capacity
        if self.kind == OBJECT:
            self.lengths = _grow(self.lengths, capacity)
            self.used = _grow(self.used, capacity)
            self.objects.extend([None] * (capacity - len(self.objects)))
            self.capacity = capacity
            return
        assert self.dtype is not None
        shape = (capacity,) if self.kind == SCALAR else (capacity, max_len, *self.rest)
        nbytes = self._array_nbytes(capacity, max_len)
        held = self.nbytes if self.data is not None else 0
        self.budgets.give(self.tier, held)
        try:
            tier = self.budgets.take(self.name, self.wanted_tier, nbytes)
        except StorageBackendError:
            self.budgets.give(self.tier, -held)
            raise
        try:
            data, path, fd, inode = self._allocate(shape, tier)
        except Exception as e:  # noqa: BLE001  (out of memory, /dev/shm or the disk full): nothing changed
            self.budgets.give(tier, nbytes)
            self.budgets.give(self.tier, -held)
            raise StorageBackendError(
                f"field {self.name!r}: cannot allocate {nbytes} bytes on tier {tier!r}: {e}"
            ) from e
        self.lengths = _grow(self.lengths, capacity)
        self.used = _grow(self.used, capacity)
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
        self.generation += 1

    def _allocate(self, shape: tuple[int, ...], tier: str) -> tuple[torch.Tensor, str | None, int, int]:
        """The array, and for mappable tiers the reader's path, the open descriptor and the inode."""
        assert self.dtype is not None
        if tier not in MAPPABLE:
            return allocate(shape, self.dtype, tier), None, -1, 0
        directory = "/dev/shm" if tier == "shm" else self.directory
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"conduit-tq-{self.name}-{uuid.uuid4().hex[:12]}")
        numel = max(math.prod(shape), 1)
        # the blocks reserved first: a full file system is an error here (PlacementCapacityError), never
        # SIGBUS on a later write through the mapping
        reserve_file(path, numel * self.dtype.itemsize, tier, f"field {self.name!r}")
        flat = torch.from_file(path, shared=True, size=numel, dtype=self.dtype)
        fd = os.open(path, os.O_RDWR)
        os.unlink(path)
        return flat[: math.prod(shape)].view(shape), f"/proc/{os.getpid()}/fd/{fd}", fd, os.fstat(fd).st_ino

    def _release(self) -> None:
        if self.path is not None:  # readers that mapped it keep their mapping; later ones get the new layout
            os.close(self.fd)
            self.path = None

    def _take(self, n: int, longest: int) -> torch.Tensor:
        """``n`` free rows (ascending), marked used; the array grown to hold them and ``longest`` tokens."""
        self._ensure(self.in_use + n, longest if self.kind == JAGGED else 0)
        rows = torch.nonzero(~self.used).flatten()[:n]
        self.used[rows] = True
        self._in_use = None
        return rows

    # -- batch operations ------------------------------------------------------------------------

    def check(self, column: Column) -> None:
        self.check_spec(column.kind, column.dtype, column.rest)

    def check_spec(self, kind: str, dtype: torch.dtype | None, rest: tuple[int, ...]) -> None:
        if kind != self.kind or dtype != self.dtype or tuple(rest) != self.rest:
            raise StorageBackendError(
                f"field {self.name!r} holds {self.kind} {self.dtype} {self.rest}; a put brought "
                f"{kind} {dtype} {tuple(rest)} (clear the field's samples first)"
            )

    def put(self, slots: torch.Tensor, column: Column, rows: torch.Tensor | None = None) -> None:
        """Store ``column`` for ``slots`` (distinct; ``rows``: their rows now, ``index.find(slots)``, if
        known). Cannot fail once :meth:`grow` made room for it."""
        self.check(column)
        longest = int(column.data.lengths.max()) if self.kind == JAGGED and column.size else 0
        rows = self.index.find(slots) if rows is None else rows.clone()
        new = rows < 0
        taken = self._take(int(new.sum()), longest)  # also grows max_len for rows written in place
        if taken.numel():
            rows[new] = taken
            self.index.set(slots[new], taken)
        if self.kind == OBJECT:
            for r, x in zip(rows.tolist(), column.data):
                self.objects[r] = x
        elif self.kind == SCALAR:
            assert self.data is not None
            self.data.index_copy_(0, rows.to(self.data.device), column.data.to(self.data.device))
        else:
            assert self.data is not None
            ragged: Ragged = column.data
            if self.data.device.type == "cpu":  # one pass, each byte copied once (ragged_kernels)
                scatter_prefixes(self.data, rows, ragged.offsets, ragged.values.contiguous())
            else:  # the valid tokens to the device once, then one scatter there
                scatter_tokens(self.data, rows, ragged.offsets, ragged.values)
            self.lengths.index_copy_(0, rows, ragged.lengths)

    def reserve(self, n: int, longest: int) -> torch.Tensor:
        """``n`` fresh rows (ascending) of at least ``longest`` tokens for a same-node writer to fill;
        no index points at them until :meth:`commit`."""
        return self._take(n, longest)

    def release(self, rows: torch.Tensor) -> None:
        """Free rows a plan reserved and never committed (growth keeps row numbers)."""
        self.used[rows] = False
        self._in_use = None

    def commit(self, slots: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor | None) -> None:
        """Point ``slots`` (distinct) at the reserved ``rows`` (written by the plan's writer); free
        their old rows."""
        if lengths is not None:
            self.lengths.index_copy_(0, rows, lengths)
        old = self.index.find(slots)
        self.used[old[old >= 0]] = False
        self._in_use = None
        self.index.set(slots, rows)

    def missing(self, slots: torch.Tensor) -> list[int]:
        return slots[self.index.find(slots) < 0].tolist()

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        """The rows holding ``slots`` (all present)."""
        return self.index.find(slots)

    def get(self, slots: torch.Tensor) -> Column:
        rows = self.rows(slots)
        if self.kind == OBJECT:
            return Column(OBJECT, [self.objects[r] for r in rows.tolist()])
        assert self.data is not None
        if self.kind == SCALAR:
            return Column(SCALAR, self.data.index_select(0, rows.to(self.data.device)).to("cpu"))
        return Column(JAGGED, gather_padded(self.data, rows, self.lengths.index_select(0, rows)))

    def layout(self) -> Layout | None:
        if self.path is None or self.data is None:
            return None
        return Layout(self.path, self.inode, str(self.dtype), tuple(self.data.shape), self.name)

    def clear(self, slots: torch.Tensor) -> None:
        rows = self.index.remove(slots)
        self.used[rows] = False
        self._in_use = None
        if self.kind == OBJECT:
            for r in rows.tolist():
                self.objects[r] = None

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
        dtype = torch_dtype(layout.dtype)
        numel = math.prod(layout.shape)
        flat = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=max(numel, 1), dtype=dtype)
    finally:
        os.close(fd)  # the mapping stays valid
    array = flat[:numel].view(layout.shape)
    if key not in _MAPPED and len(_MAPPED) >= _MAPPED_MAX:
        _MAPPED.pop(next(iter(_MAPPED)))
    _MAPPED[key] = (layout.inode, array)
    return array


def read_mapped(layout: Layout, rows: torch.Tensor, lengths: torch.Tensor | None, kind: str) -> Column:
    """A same-node reader's gather of ``rows`` straight from the store's memory: one copy, into its
    own tensor."""
    array = _map(layout)
    if kind == SCALAR:
        return Column(SCALAR, array.index_select(0, rows))
    assert lengths is not None
    return Column(JAGGED, gather_padded(array, rows, lengths))


def write_mapped(layout: Layout, rows: torch.Tensor, column: Column) -> torch.Tensor | None:
    """A same-node writer's scatter of ``column`` straight into the store's memory, sample ``i`` into
    row ``rows[i]`` (the fresh rows of a write plan): one copy. Returns the row lengths the
    commit records (None for a scalar field)."""
    array = _map(layout)
    if column.kind == SCALAR:
        array.index_copy_(0, rows, column.data.to(array.device, array.dtype))
        return None
    ragged: Ragged = column.data
    lengths = ragged.lengths
    if lengths.numel() and int(lengths.max()) > array.shape[1]:
        raise StaleLayoutError(
            f"field {layout.field!r}: a row of {int(lengths.max())} in rows of {array.shape[1]}"
        )
    scatter_prefixes(array, rows, ragged.offsets, ragged.values.contiguous())
    return lengths


def token_positions(
    rows: torch.Tensor, offsets: torch.Tensor, max_len: int, device: torch.device
) -> torch.Tensor:
    """Flat positions, in a ``[capacity, max_len]`` array viewed as ``[capacity * max_len]``, of every
    valid token of a batch whose sample ``i`` is the prefix of row ``rows[i]`` with ``offsets[i + 1] -
    offsets[i]`` tokens, in the batch's token order. Vectorised, built on ``device`` (token ``k`` of
    sample ``i`` sits at ``rows[i] * max_len + k - offsets[i]``)."""
    total = int(offsets[-1]) if offsets.numel() else 0
    rows, offsets = rows.to(device), offsets.to(device)
    starts = rows * max_len - offsets[:-1]
    lengths = offsets[1:] - offsets[:-1]
    within = torch.repeat_interleave(starts, lengths, output_size=total)
    return within + torch.arange(total, device=device, dtype=within.dtype)


def _flat(array: torch.Tensor) -> torch.Tensor:
    return array.view(array.shape[0] * array.shape[1], *array.shape[2:])


def scatter_tokens(
    array: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor
) -> None:
    """:func:`~conduit.buffer.ragged_kernels.scatter_prefixes` for an array on a device: the valid
    tokens cross to the device once (no padding), then one ``index_copy_`` there."""
    lengths = offsets[1:] - offsets[:-1]
    if lengths.numel() and int(lengths.max()) > array.shape[1]:
        raise StorageBackendError(f"a row of {int(lengths.max())} tokens in rows of {array.shape[1]}")
    positions = token_positions(rows, offsets, array.shape[1], array.device)
    _flat(array).index_copy_(0, positions, values.to(array.device, array.dtype))


def gather_tokens(array: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The valid tokens of ``rows`` (lengths from ``offsets``), flat, on the array's device: one gather."""
    return _flat(array).index_select(0, token_positions(rows, offsets, array.shape[1], array.device))


def gather_padded(array: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor) -> Ragged:
    """The first ``lengths[i]`` steps of rows ``slots[i]`` of ``[capacity, max_len, *rest]``, flat.

    On CPU one pass copies each valid token once (:func:`conduit.buffer.ragged_kernels.gather_prefixes`)
    into memory from the process's :class:`~conduit.buffer.recycled.HostPool`: once the consumer drops
    an earlier batch, the next one reuses its pages instead of faulting in fresh ones. On a device one
    gather there (:func:`gather_tokens`), and only the valid tokens cross to the host.
    """
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    rest = tuple(array.shape[2:])
    if array.device.type == "cpu":
        out = host_pool().empty((int(offsets[-1]), *rest), array.dtype)
        return Ragged(gather_prefixes(array, slots, offsets, out), offsets)
    return Ragged(gather_tokens(array, slots, offsets).to("cpu"), offsets)


def _grow(t: torch.Tensor, n: int, fill: int = 0) -> torch.Tensor:
    out = torch.full((n,), fill, dtype=t.dtype)
    out[: t.numel()] = t
    return out
