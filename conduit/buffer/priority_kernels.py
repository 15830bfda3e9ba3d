# mypy: allow-untyped-defs
"""One pass over a priority update instead of a dozen tiny torch ops (each a dispatch and, for a
reduction read on the host, a sync): :func:`scan` checks slots and priorities (``check_priorities``),
and :func:`checked_update` checks, compares generations and finiteness, and applies the update to a
fused sum tree in one kernel call (the CPU prioritized sampler's hot path). CPU tensors only; the
buffer keeps its torch path for others. Kernels are numba, cached on disk and loaded by :func:`warm`."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from conduit.buffer import sumtree_kernels


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


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def _checked_update(
    vals, mins, vstart, mstart, rows, arity, slots, generations, stored, priorities, capacity, reject, alpha,
    eps, max_priority, live,
):  # fmt: skip
    bad_slot, nonfinite, negative, lowest = _scan(slots, priorities, capacity)
    if bad_slot >= 0 or (nonfinite and reject) or negative:
        return bad_slot, nonfinite, negative, lowest, -1  # nothing changed
    n_live, _ = _live(slots, generations, stored, priorities, live)
    sumtree_kernels.set_priorities(
        vals, mins, vstart, mstart, rows, arity, slots, priorities, live, alpha, eps, max_priority
    )
    return bad_slot, nonfinite, negative, lowest, n_live


def checked_update(
    tree: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int],
    slots: torch.Tensor,
    generations: torch.Tensor,
    stored: np.ndarray,
    priorities: torch.Tensor,
    capacity: int,
    reject_nonfinite: bool,
    alpha: float,
    eps: float,
    max_priority: np.ndarray,
) -> tuple[int, int, int, float, int]:
    """:func:`scan`, then (only if it found no fault) the live mask (generation unchanged, priority
    finite) and the sum tree's
    ``set_priorities`` on ``tree`` (its flat arrays), in one kernel call.

    Returns ``(bad slot index or -1, non-finite, negative, lowest negative, applied)``; ``applied`` is -1
    when a fault (a bad slot, a negative priority, a non-finite one with ``reject_nonfinite``) left
    everything unchanged. Tensors must be contiguous CPU tensors (:func:`fusable`).
    """
    n = slots.shape[0]
    live = np.empty(n, dtype=np.bool_)
    bad, nonfinite, negative, lowest, applied = _checked_update(
        *tree,
        slots.numpy(),
        generations.numpy(),
        stored,
        _np(priorities),
        capacity,
        reject_nonfinite,
        alpha,
        eps,
        max_priority,
        live,
    )
    return int(bad), int(nonfinite), int(negative), float(lowest), int(applied)


def fusable(*tensors: torch.Tensor) -> bool:
    """True when every tensor is a contiguous CPU tensor (the kernels' case)."""
    return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def scan(slots: torch.Tensor, priorities: torch.Tensor, capacity: int) -> tuple[int, int, int, float]:
    """``(first out-of-range slot index or -1, non-finite count, negative count, lowest negative)``."""
    return _scan(slots.numpy(), _np(priorities), capacity)  # type: ignore[no-any-return]


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return t.numpy() if t.dtype in (torch.float32, torch.float64) else t.double().numpy()


_warmed = False


def warm() -> None:
    """Load (or compile, on a cold cache) the kernels for float32 and float64 priorities; once."""
    global _warmed
    if _warmed:
        return
    slots, gens = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64)
    stored = torch.ones((2, 1), dtype=torch.int64)[0]  # the storage's generations (row 0 of its meta)
    for dtype in (torch.float32, torch.float64):
        p = torch.ones(1, dtype=dtype)
        scan(slots, p, 1)
        # a one-row tree of arity 2 (as sumtree_kernels.warm): sums, mins, level starts, rows, arity
        start = np.array([0, 3], dtype=np.int64)
        tree = (np.array([1.0, 2.0, 0.0, 3.0, 0.0]), np.array([1.0, 2.0, np.inf, 1.0]), start, start.copy(),
                np.array([1], dtype=np.int64), 2)  # fmt: skip
        got = checked_update(tree, slots, gens, stored.numpy(), p, 1, True, 0.6, 1e-6, np.ones(1))
        assert got[4] == 1
    _warmed = True
