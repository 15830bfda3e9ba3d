"""Host tensors whose memory comes back to a pool when the last view of them is freed.

A batch handed to a consumer must be memory the consumer owns. Fresh memory costs a page fault per
4 KiB page on first touch (on the development VM, 25 MB of fresh pages cost ~9 ms: three times the
copy that fills them). :class:`HostPool` hands out tensors backed by blocks it keeps: when the
consumer drops the last tensor or view that uses a block, the block returns to the pool (a
``numpy.ndarray`` subclass's finaliser, reached through the tensor's storage) and the next request
of a similar size reuses its already-mapped pages. Blocks come in 8 size classes per power of two
(at most 12.5% unused); the pool keeps at most ``max_free_bytes`` of returned blocks and frees the rest.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from typing import Any

import numpy as np
import torch

MIN_POOLED_BYTES = 1 << 16  # smaller requests come from torch's allocator (no page-fault cost to save)
DEFAULT_MAX_FREE_BYTES = 2 << 30


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of 8 steps per power of two."""
    if nbytes <= 8:
        return 8
    step = 1 << max(nbytes.bit_length() - 4, 0)
    return -(-nbytes // step) * step


class _Lease(np.ndarray):
    """A block lent out; its finaliser gives the block back (once every view of it is gone)."""

    _pool: HostPool | None
    _block: np.ndarray | None

    def __del__(self) -> None:
        pool, block = getattr(self, "_pool", None), getattr(self, "_block", None)
        if pool is not None and block is not None:
            self._pool = self._block = None
            pool._give_back(block)


class HostPool:
    """Recycles the memory of host tensors it hands out (see the module docstring)."""

    def __init__(self, max_free_bytes: int = DEFAULT_MAX_FREE_BYTES) -> None:
        self.max_free_bytes = int(max_free_bytes)
        self._free: dict[int, list[np.ndarray]] = defaultdict(list)
        self._lock = threading.RLock()  # a finaliser can run on this thread while it holds the lock
        self.free_bytes = 0
        self.hits = 0
        self.misses = 0

    def empty(self, shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised CPU tensor; its memory returns to this pool when the tensor is freed."""
        shape = tuple(int(d) for d in shape)
        numel = math.prod(shape)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes < MIN_POOLED_BYTES:
            return torch.empty(shape, dtype=dtype)
        cls = size_class(nbytes)
        with self._lock:
            blocks = self._free.get(cls)
            block = blocks.pop() if blocks else None
            if block is not None:
                self.free_bytes -= cls
                self.hits += 1
            else:
                self.misses += 1
        if block is None:
            block = np.empty(cls, dtype=np.uint8)
        lease = block.view(_Lease)
        lease._pool, lease._block = self, block
        flat = torch.frombuffer(lease, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        return flat.view(shape)

    def _give_back(self, block: np.ndarray) -> None:
        with self._lock:
            if self.free_bytes + block.nbytes > self.max_free_bytes:
                return  # dropped: numpy frees it
            self._free[block.nbytes].append(block)
            self.free_bytes += block.nbytes

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "free_bytes": self.free_bytes}

    def clear(self) -> None:
        """Free every returned block."""
        with self._lock:
            self._free.clear()
            self.free_bytes = 0


_DEFAULT: HostPool | None = None
_DEFAULT_LOCK = threading.Lock()


def host_pool() -> HostPool:
    """This process's shared pool."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = HostPool()
        return _DEFAULT
