# mypy: allow-untyped-defs
"""One pass over a priority update instead of a dozen tiny torch ops (each a dispatch and, for a
reduction read on the host, a sync): :func:`scan` checks slots and priorities (outside the lock),
:func:`live_mask` compares generations and finiteness (under it). CPU tensors only; the buffer keeps
its torch path for others. Kernels are numba, cached on disk and loaded by :func:`warm`."""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit


@njit(cache=True, nogil=True, boundscheck=False)
def _scan(slots, priorities, capacity):
    bad_slot, nonfinite, negative, lowest = -1, 0, 0, np.inf
    for i in range(slots.shape[0]):
        s = slots[i]
        if (s < 0 or s >= capacity) and bad_slot < 0:
            bad_slot = i
        p = priorities[i]
        if not np.isfinite(p):
            nonfinite += 1
        elif p < 0:
            negative += 1
            lowest = min(lowest, p)
    return bad_slot, nonfinite, negative, lowest


@njit(cache=True, nogil=True, boundscheck=False)
def _live(slots, generations, stored, priorities, out):
    n_live, n_nonfinite = 0, 0
    for i in range(slots.shape[0]):
        finite = np.isfinite(priorities[i])
        ok = stored[slots[i]] == generations[i] and finite
        out[i] = ok
        n_live += ok
        n_nonfinite += not finite
    return n_live, n_nonfinite


def fusable(*tensors: torch.Tensor) -> bool:
    """True when every tensor is a contiguous CPU tensor (the kernels' case)."""
    return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def scan(slots: torch.Tensor, priorities: torch.Tensor, capacity: int) -> tuple[int, int, int, float]:
    """``(first out-of-range slot index or -1, non-finite count, negative count, lowest negative)``."""
    return _scan(slots.numpy(), _np(priorities), capacity)  # type: ignore[no-any-return]


def live_mask(
    slots: torch.Tensor, generations: torch.Tensor, stored: torch.Tensor, priorities: torch.Tensor
) -> tuple[torch.Tensor, int, int]:
    """``(live, n_live, n_nonfinite)``: an entry is live when its slot still holds the generation it
    was sampled at and its priority is finite (``stored`` may be a strided column)."""
    out = torch.empty(slots.numel(), dtype=torch.bool)
    n_live, n_nonfinite = _live(
        slots.numpy(), generations.numpy(), stored.numpy(), _np(priorities), out.numpy()
    )
    return out, int(n_live), int(n_nonfinite)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy() if t.dtype in (torch.float32, torch.float64) else t.double().numpy()


_warmed = False


def warm() -> None:
    """Load (or compile, on a cold cache) the kernels for float32 and float64 priorities; once."""
    global _warmed
    if _warmed:
        return
    slots, gens = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    stored = torch.ones((1, 2), dtype=torch.int64)[:, 0]  # a column of the storage's (generation, version)
    for dtype in (torch.float32, torch.float64):
        p = torch.ones(1, dtype=dtype)
        scan(slots, p, 1)
        live, n, _ = live_mask(slots, gens, stored, p)
        assert n == 1 and bool(live[0]) and math.isfinite(float(p[0]))
    _warmed = True
