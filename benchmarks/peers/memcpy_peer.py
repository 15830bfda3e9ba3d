"""The physical reference: plain torch copies of the bytes each cell moves.

``insert``: copy a contiguous ``[B, dim]`` block into a ring-ordered ``[capacity, dim]`` store.
``sample``: copy a contiguous ``[B, dim]`` block out of the store (the bytes a gather returns, without
the random access). :func:`gather_reference` times the random-row gather itself (``index_select``),
which the report subtracts from Conduit's sample call to get its per-call overhead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness import Cell, Timing, group_by_buffer, make_row, time_call


def _insert_fn(store: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
    cap, b = store.shape[0], src.shape[0]
    pos = [0]

    def step() -> None:
        p = pos[0] if pos[0] + b <= cap else 0
        store[p : p + b].copy_(src)
        pos[0] = p + b

    return step


def _copy_out_fn(store: torch.Tensor, out: torch.Tensor) -> Callable[[], None]:
    cap, b = store.shape[0], out.shape[0]
    stride = max(1, (cap - b) // 7)  # walk the store so reads are not always the same cache lines
    pos = [0]

    def step() -> None:
        p = pos[0] if pos[0] + b <= cap else 0
        out.copy_(store[p : p + b])
        pos[0] = p + stride

    return step


def _gather_fn(store: torch.Tensor, out: torch.Tensor, n_sets: int = 16) -> Callable[[], None]:
    b = out.shape[0]
    idx_sets = [torch.randint(0, store.shape[0], (b,)) for _ in range(n_sets)]
    k = [0]

    def step() -> None:
        torch.index_select(store, 0, idx_sets[k[0] % n_sets], out=out)
        k[0] += 1

    return step


def run_memcpy(cells: Iterable[Cell], timing: Timing, on_row: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Time the memcpy reference for each cell (the sampler does not change the bytes moved)."""
    rows: list[dict[str, Any]] = []
    for (_sampler, dim, cap), group in group_by_buffer(cells).items():
        store = torch.randn(cap, dim)
        for cell in group:
            if cell.op == "insert":
                fn = _insert_fn(store, torch.randn(cell.batch, dim))
            else:
                fn = _copy_out_fn(store, torch.empty(cell.batch, dim))
            row = make_row(cell, "memcpy", time_call(fn, timing))
            rows.append(row)
            on_row(row)
        del store
    return rows


def gather_reference(batch: int, dims: Iterable[int], capacity_of: Callable[[int], int], timing: Timing) -> dict[int, float]:
    """Seconds per ``index_select`` of ``batch`` random rows, per dim, into a preallocated output."""
    out: dict[int, float] = {}
    for dim in dims:
        store = torch.randn(capacity_of(dim), dim)
        out[dim] = time_call(_gather_fn(store, torch.empty(batch, dim)), timing)
        del store
    return out
