"""Keyed rows on a tier that grow, and that other processes on the node map: :class:`RowArray`.

A :class:`RowArray` is one column's storage by key (e.g. TransferQueue's global index): fixed rows
``[capacity, *shape]``, or ragged rows ``[capacity, max_len, *shape]`` with a length per row (the ring's
layout, :class:`~conduit.buffer.storage.RingStorage`: a batch's write or read is one compiled pass over
its rows' valid prefixes, :mod:`conduit.buffer.ragged_kernels`; no padding, no per-item Python), and
per key the row holding it (:class:`KeyIndex`: memory in proportion to the keys held, not to the
largest). Capacity and ``max_len`` grow geometrically (amortised one copy each); a growth is the moment
the array may change tier at no extra copy (:attr:`RowArray.wanted_tier`, set by a planner).

Memory comes from the core's allocator (:func:`~conduit.buffer.tiers.allocate`; on ``shm`` and ``disk``
:func:`~conduit.buffer.tiers.map_file`) within a :class:`TierBudgets` ledger: an array that would not fit
its tier's budget goes to the next tier of :data:`SPILL_ORDER` with room (logged). On ``shm`` and
``disk`` the array is a file, unlinked as it is created, that a process on the same node maps through
the owner's open descriptor (:class:`~conduit.buffer.mapped.Layout`): :func:`~conduit.buffer.mapped.read_mapped`
gathers straight from it, and :func:`~conduit.buffer.mapped.write_mapped` fills rows the owner reserved (:meth:`RowArray.reserve`); :meth:`RowArray.commit`
then points the keys at them, so nothing a writer fills is visible before its commit.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import torch

from conduit.batch import Ragged
from conduit.buffer.mapped import Layout, read_rows, write_rows
from conduit.buffer.tiers import allocate, map_file
from conduit.errors import CapacityError, ConduitError, PlacementCapacityError

logger = logging.getLogger(__name__)

TIERS = ("cuda", "pinned", "shm", "host", "disk")
#: where an array goes when its tier's budget is spent: the next tier in this order with room
SPILL_ORDER = TIERS
MAPPABLE = ("shm", "disk")  # tiers a same-node process maps and reads in place


class TierBudgets:
    """Bytes left per tier (``None``: no limit), and the spill rule (:meth:`take`)."""

    def __init__(self, limits: dict[str, int] | None) -> None:
        unknown = sorted(set(limits or {}) - set(TIERS))
        if unknown:
            raise CapacityError(f"unknown tier(s) {unknown} in budgets; tiers: {', '.join(TIERS)}")
        self.free: dict[str, int | None] = {t: None for t in TIERS}
        self.free.update({t: int(v) for t, v in (limits or {}).items()})

    def take(self, what: str, tier: str, nbytes: int, free: dict[str, int | None] | None = None) -> str:
        """Reserve ``nbytes`` for ``what`` on ``tier`` or the first tier after it with room (in ``free``,
        a copy of :attr:`free` to try a growth before making it, when given); the tier taken.
        :class:`PlacementCapacityError` naming ``what``, the bytes and the free bytes when none has room."""
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
                        "conduit: %s spilled from %s to %s (%d bytes; %s had %s free)",
                        what, tier, t, nbytes, tier, self.free[tier],
                    )  # fmt: skip
                return t
        frees = {t: book[t] for t in SPILL_ORDER[start:]}
        raise PlacementCapacityError(
            f"{what} needs {nbytes} bytes on tier {tier!r} or a later one; free bytes per tier: {frees}",
            missing_bytes=nbytes,
            tiers=list(frees),
        )

    def give(self, tier: str, nbytes: int, free: dict[str, int | None] | None = None) -> None:
        book = self.free if free is None else free
        left = book[tier]
        if left is not None:
            book[tier] = left + nbytes


class KeyIndex:
    """Per key the row holding it: sorted keys and their rows (memory in proportion to the keys held,
    whatever their values). Every operation is vectorised over a batch."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros(0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.rows.nbytes

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per key its position in :attr:`keys` and whether it is there."""
        if not self.keys.size:
            return np.zeros(keys.size, dtype=np.int64), np.zeros(keys.size, dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return pos, self.keys[pos] == keys

    def find(self, keys: torch.Tensor) -> torch.Tensor:
        """The rows holding ``keys``; -1 where none."""
        if not self.keys.size:
            return torch.full_like(keys, -1)
        pos, hit = self._find(keys.numpy())
        return torch.from_numpy(np.where(hit, self.rows[pos], -1))

    def set(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Point ``keys`` (distinct) at ``rows``."""
        s, r = keys.numpy(), rows.numpy()
        if not s.size:
            return
        increasing = s.size == 1 or bool((s[1:] > s[:-1]).all())
        if increasing and (not self.keys.size or s[0] > self.keys[-1]):
            self.keys, self.rows = np.concatenate([self.keys, s]), np.concatenate([self.rows, r])
            return  # keys that come in increasing order, past the ones held (a counter's)
        pos, hit = self._find(s)
        self.rows[pos[hit]] = r[hit]
        new = ~hit
        if not new.any():
            return
        order = np.argsort(s[new], kind="stable")
        added, added_rows = s[new][order], r[new][order]
        at = np.searchsorted(self.keys, added) + np.arange(added.size)
        total = self.keys.size + added.size
        old = np.ones(total, dtype=bool)
        old[at] = False
        merged_keys, merged_rows = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
        merged_keys[at], merged_rows[at] = added, added_rows
        merged_keys[old], merged_rows[old] = self.keys, self.rows
        self.keys, self.rows = merged_keys, merged_rows

    def remove(self, keys: torch.Tensor) -> torch.Tensor:
        """Forget ``keys``; the rows they had."""
        pos, hit = self._find(keys.numpy())
        gone = pos[hit]
        rows = self.rows[gone]
        if gone.size:
            keep = np.ones(self.keys.size, dtype=bool)
            keep[gone] = False
            self.keys, self.rows = self.keys[keep], self.rows[keep]
        return torch.from_numpy(rows)


class RowArray:
    """One column's rows by key, on a tier (see the module docstring); ``shape``: per item (fixed) or per
    token (ragged).

    A write of a key that has a row overwrites the row in place; a key without one takes a free row. A
    same-node writer's rows (:meth:`reserve`) are fresh rows no key points at until :meth:`commit` (which
    frees the rows the keys had), so an upsert replaces the old value whole.
    """

    def __init__(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], ragged: bool, tier: str,
                 budgets: TierBudgets, directory: str, noun: str = "column") -> None:  # fmt: skip
        self.name, self.dtype, self.shape, self.ragged = name, dtype, tuple(shape), ragged
        self.what = f"{noun} {name!r}"  # how errors and logs name it
        self.wanted_tier, self.tier, self.budgets, self.directory = tier, tier, budgets, directory
        self.capacity, self.max_len = 0, 0  # rows; tokens per row
        self.data: torch.Tensor | None = None
        self.lengths = torch.zeros(0, dtype=torch.int64)  # per row
        self.used = torch.zeros(0, dtype=torch.bool)  # per row: a key's, or reserved by a writer
        self._in_use: int | None = 0  # used.sum(), None when stale
        self.index = KeyIndex()
        self.fd, self.inode = -1, 0
        self.nbytes = 0
        self.spilled = False
        self.generation = 0  # bumped when the array moves to new memory: reservations made before are stale

    # -- growth --------------------------------------------------------------------------------

    def _target(self, capacity: int, max_len: int) -> tuple[int, int] | None:
        """The (capacity, max_len) a write needing ``capacity`` rows of ``max_len`` tokens grows to; None
        when it fits. Only the short dimension grows, geometrically."""
        max_len = max_len if self.ragged else 0
        if capacity <= self.capacity and max_len <= self.max_len:
            return None
        capacity = self.capacity if capacity <= self.capacity else max(capacity, 2 * self.capacity, 64)
        if max_len > self.max_len:
            max_len = max(max_len, self.max_len + self.max_len // 2)
        else:
            max_len = self.max_len
        return capacity, max_len

    def _full_shape(self, capacity: int, max_len: int) -> tuple[int, ...]:
        return (capacity, max_len, *self.shape) if self.ragged else (capacity, *self.shape)

    @property
    def in_use(self) -> int:
        """Rows in use (a key's, or reserved by a writer)."""
        if self._in_use is None:
            self._in_use = int(self.used.sum())
        return self._in_use

    def next_nbytes(self, new_rows: int, longest: int) -> int | None:
        """Bytes the array takes after a write of ``new_rows`` more rows of up to ``longest`` tokens if
        the write grows it; None if it fits."""
        target = self._target(self.in_use + new_rows, longest)
        return None if target is None else math.prod(self._full_shape(*target)) * self.dtype.itemsize

    def try_grow(self, new_rows: int, longest: int, free: dict[str, int | None]) -> None:
        """:meth:`grow`'s budget bookkeeping on ``free`` (a copy of the budgets' :attr:`~TierBudgets.free`):
        raises where :meth:`grow` would, and changes nothing else."""
        nbytes = self.next_nbytes(new_rows, longest)
        if nbytes is None:
            return
        if self.data is not None:
            self.budgets.give(self.tier, self.nbytes, free)
        self.budgets.take(self.what, self.wanted_tier, nbytes, free)

    def grow(self, new_rows: int, longest: int) -> None:
        """Make room for ``new_rows`` more rows and rows of ``longest`` tokens (the contents kept; on
        :attr:`wanted_tier` or the tier it spills to)."""
        target = self._target(self.in_use + new_rows, longest)
        if target is None:
            return
        capacity, max_len = target
        shape = self._full_shape(capacity, max_len)
        nbytes = math.prod(shape) * self.dtype.itemsize
        held = self.nbytes if self.data is not None else 0
        self.budgets.give(self.tier, held)
        try:
            tier = self.budgets.take(self.what, self.wanted_tier, nbytes)
        except ConduitError:
            self.budgets.give(self.tier, -held)
            raise
        try:
            if tier in MAPPABLE:
                directory = "/dev/shm" if tier == "shm" else self.directory
                data, fd = map_file(shape, self.dtype, tier, directory, self.what, keep_open=True)
            else:
                data, fd = allocate(shape, self.dtype, tier), -1
        except Exception as e:  # noqa: BLE001  (out of memory, /dev/shm or the disk full): nothing changed
            self.budgets.give(tier, nbytes)
            self.budgets.give(self.tier, -held)
            raise CapacityError(f"{self.what}: cannot allocate {nbytes} bytes on tier {tier!r}: {e}") from e
        self.lengths = _grown(self.lengths, capacity)
        self.used = _grown(self.used, capacity)
        if self.data is not None:
            (data[: self.capacity, : self.max_len] if self.ragged else data[: self.capacity]).copy_(self.data)
        self._release()
        self.data, self.tier, self.nbytes, self.fd = data, tier, nbytes, fd
        self.inode = os.fstat(fd).st_ino if fd >= 0 else 0
        self.spilled = tier != self.wanted_tier
        self.capacity, self.max_len = capacity, max_len
        self.generation += 1

    def _release(self) -> None:
        if self.fd >= 0:  # processes that mapped it keep their mapping; later ones get the new layout
            os.close(self.fd)
            self.fd = -1

    def _take(self, n: int, longest: int) -> torch.Tensor:
        """``n`` free rows (ascending), marked used; the array grown to hold them and ``longest`` tokens."""
        self.grow(n, longest)
        rows = torch.nonzero(~self.used).flatten()[:n]
        self.used[rows] = True
        self._in_use = None
        return rows

    # -- batch operations ------------------------------------------------------------------------

    def write(
        self, keys: torch.Tensor, data: torch.Tensor | Ragged, rows: torch.Tensor | None = None
    ) -> None:
        """Store ``data`` (a tensor ``[B, *shape]``, or a :class:`Ragged` of ``B`` items) for ``keys``
        (distinct; ``rows``: their rows now, ``index.find(keys)``, if known). Cannot fail once
        :meth:`grow` made room for it."""
        rows = self.index.find(keys) if rows is None else rows.clone()
        new = rows < 0
        longest = int(data.lengths.max()) if isinstance(data, Ragged) and len(data) else 0
        taken = self._take(int(new.sum()), longest)  # also grows max_len for rows written in place
        if taken.numel():
            rows[new] = taken
            self.index.set(keys[new], taken)
        assert self.data is not None
        if isinstance(data, Ragged):
            write_rows(self.data, rows, data)
            self.lengths.index_copy_(0, rows, data.lengths)
        else:
            self.data.index_copy_(0, rows.to(self.data.device), data.to(self.data.device))

    def reserve(self, n: int, longest: int) -> torch.Tensor:
        """``n`` fresh rows (ascending) of at least ``longest`` tokens for a same-node writer to fill; no
        key points at them until :meth:`commit`."""
        return self._take(n, longest)

    def release(self, rows: torch.Tensor) -> None:
        """Free rows reserved and never committed (growth keeps row numbers)."""
        self.used[rows] = False
        self._in_use = None

    def commit(self, keys: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor | None) -> None:
        """Point ``keys`` (distinct) at the reserved ``rows`` (filled by their writer, ``lengths`` tokens
        each); free their old rows."""
        if lengths is not None:
            self.lengths.index_copy_(0, rows, lengths)
        old = self.index.find(keys)
        self.used[old[old >= 0]] = False
        self._in_use = None
        self.index.set(keys, rows)

    def missing(self, keys: torch.Tensor) -> list[int]:
        return keys[self.index.find(keys) < 0].tolist()

    def read(self, keys: torch.Tensor) -> torch.Tensor | Ragged:
        """The items of ``keys`` (all present), on the host: one gather."""
        rows = self.index.find(keys)
        assert self.data is not None
        if self.ragged:
            return read_rows(self.data, rows, self.lengths.index_select(0, rows))
        return self.data.index_select(0, rows.to(self.data.device)).to("cpu")

    def layout(self) -> Layout | None:
        """Where a same-node process maps the array; None off ``shm`` and ``disk``."""
        if self.fd < 0 or self.data is None:
            return None
        path = f"/proc/{os.getpid()}/fd/{self.fd}"
        return Layout(path, self.inode, str(self.dtype), tuple(self.data.shape), self.name)

    def clear(self, keys: torch.Tensor) -> None:
        """Forget ``keys`` (their rows are free again)."""
        rows = self.index.remove(keys)
        self.used[rows] = False
        self._in_use = None

    def close(self) -> None:
        self._release()
        self.budgets.give(self.tier, self.nbytes)
        self.data, self.nbytes = None, 0


def _grown(t: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros((n,), dtype=t.dtype)
    out[: t.numel()] = t
    return out
