# mypy: allow-untyped-defs
"""One-pass frame stacking: gather, pad, interleave and decode a batch's frames in a single copy.

``torch`` would gather ``[B * F, H * W]``, fill the padded rows, transpose to ``[B, H * W, F]`` (a slow
copy with a small last axis) and convert; :func:`stack_frames` writes each output value once, on the
calling thread, without the GIL (a delivery thread never blocks the learner). Cached on disk
(``cache=True``); :func:`warm_stack_frames` compiles or loads it when a frame store is built.
"""

from __future__ import annotations

import torch
from numba import njit


@njit(cache=True, nogil=True, boundscheck=False)
def _stack(src, slots, pad, table, out):
    batch, frames = slots.shape
    pixels = src.shape[1]
    for b in range(batch):
        for f in range(frames):  # one frame at a time: a sequential read (faster than output order)
            if pad[b, f]:
                value = table[256]  # the padding's decoded value
                for p in range(pixels):
                    out[b, p, f] = value
            else:
                row = slots[b, f]
                if row < 0 or row >= src.shape[0]:
                    raise IndexError("stack_frames: slot out of range")
                for p in range(pixels):
                    out[b, p, f] = table[src[row, p]]


def stack_frames(
    src: torch.Tensor, slots: torch.Tensor, pad: torch.Tensor, table: torch.Tensor
) -> torch.Tensor:
    """``out[b, p, f] = table[src[slots[b, f], p]]``, or ``table[256]`` where ``pad[b, f]``.

    Args:
        src: ``[N, P]`` uint8 codes (CPU, contiguous).
        slots: ``[B, F]`` int64 rows of ``src``; pad: ``[B, F]`` bool.
        table: ``[257]`` decoded value of each code, then the padding's value (its dtype is the output's).

    Returns:
        ``[B, P, F]`` in ``table``'s dtype.
    """
    b, f = slots.shape
    out = torch.empty((b, src.shape[1], f), dtype=table.dtype)
    _stack(
        src.numpy(),
        slots.to(torch.int64).contiguous().numpy(),
        pad.contiguous().numpy(),
        table.contiguous().numpy(),
        out.numpy(),
    )
    return out


def warm_stack_frames(dtype: torch.dtype) -> None:
    """Compile (or load from the cache) the kernel for ``dtype`` output."""
    table = torch.zeros(257, dtype=dtype)
    stack_frames(
        torch.zeros((1, 1), dtype=torch.uint8),
        torch.zeros((1, 1), dtype=torch.int64),
        torch.zeros((1, 1), dtype=torch.bool),
        table,
    )


__all__ = ["stack_frames", "warm_stack_frames"]
