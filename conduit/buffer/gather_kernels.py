# mypy: allow-untyped-defs
"""Row gather for CPU storage that never waits for a busy core.

``torch.index_select`` splits a gather of more than ``GRAIN`` values across its intra-op threads; when
another process keeps a core busy (a learner, an env runner), the call waits for the thread on that
core, up to a scheduler time slice (milliseconds for a sub-millisecond copy). :func:`gather_rows`
copies such gathers on the calling thread with a numba kernel (rows as raw bytes, so any dtype), and
leaves the small ones (which torch runs on one thread anyway) and non-CPU tensors to torch.
The kernel is cached on disk (``cache=True``); :func:`warm_gather` loads it (and starts numba, a
one-time ~0.5 s) when a storage is built, so no ``sample()`` pays for it.
"""

from __future__ import annotations

import math

import torch
from numba import njit

GRAIN = 32768  # torch's at::internal::GRAIN_SIZE: index_select stays on one thread below it


@njit(cache=True, nogil=True, boundscheck=False)
def _gather_bytes(src, index, out):
    rows, width = src.shape
    for i in range(index.shape[0]):
        j = index[i]
        if j < 0 or j >= rows:
            raise IndexError("gather_rows: index out of range")
        for k in range(width):
            out[i, k] = src[j, k]


def gather_rows(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.index_select(src, 0, index, out=out)``, single-threaded for large CPU gathers."""
    n, per_row = index.numel(), math.prod(src.shape[1:])
    big = n * per_row >= GRAIN and src.device.type == "cpu" and index.device.type == "cpu"
    if not (
        big and src.is_contiguous() and (out is None or (out.is_contiguous() and out.dtype == src.dtype))
    ):
        return torch.index_select(src, 0, index, out=out) if out is not None else src.index_select(0, index)
    if out is None:
        out = torch.empty((n, *src.shape[1:]), dtype=src.dtype)
    elif tuple(out.shape) != (n, *src.shape[1:]) or out.device.type != "cpu":
        return torch.index_select(src, 0, index, out=out)  # torch resizes or raises, as before
    _gather_bytes(
        src.reshape(src.shape[0], -1).view(torch.uint8).numpy(),
        index.to(torch.int64).contiguous().numpy(),
        out.view(n, -1).view(torch.uint8).numpy(),
    )
    return out


_warmed = False


def warm_gather() -> None:
    """Load (or compile, on a cold cache) the kernel for the one signature it is called with; once."""
    global _warmed
    if not _warmed:
        gather_rows(torch.zeros(2, GRAIN), torch.zeros(1, dtype=torch.int64))
        _warmed = True
