"""The physical references: plain torch copies of the bytes each cell moves.

``MemcpySystem`` — insert: copy a contiguous ``[B, dim]`` block into a ring-ordered ``[capacity, dim]``
store; sample: copy a contiguous ``[B, dim]`` block out of it (the bytes a gather returns, without the
random access), walking the whole store. ``GatherSystem`` — sample cells only: a bare
``index_select`` of ``B`` random rows into a preallocated output, which the report subtracts from
Conduit's sample call to get its per-call overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from harness import Cell, System, work_record

N_INDEX_SETS = 16


def _walk(cap: int, b: int, copy: Callable[[int], object]) -> Callable[[], object]:
    """A step that applies ``copy(p)`` at successive block offsets ``p``, wrapping around the store;
    it returns what ``copy`` returns (the block copied)."""
    pos = [0]

    def step() -> object:
        p = pos[0] if pos[0] + b <= cap else 0
        out = copy(p)
        pos[0] = p + b
        return out

    return step


class MemcpySystem(System):
    """Contiguous block copies into / out of a ``[capacity, dim]`` float32 store."""

    name = "memcpy"

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        self._store: torch.Tensor | None = torch.randn(capacity, dim)

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        store = self._store
        assert store is not None
        if cell.op == "insert":
            src = torch.randn(cell.batch, cell.dim)
            return _walk(cell.capacity, cell.batch, lambda p: store[p : p + cell.batch].copy_(src))
        out = torch.empty(cell.batch, cell.dim)
        return _walk(cell.capacity, cell.batch, lambda p: out.copy_(store[p : p + cell.batch]))

    def measure(self, cell: Cell, payload: object) -> dict[str, Any]:
        assert isinstance(payload, torch.Tensor)
        return work_record(
            cell.batch, {"obs": payload.numel() * payload.element_size()}, False, "contiguous copy"
        )

    def close(self) -> None:
        super().close()
        self._store = None


class GatherSystem(MemcpySystem):
    """``index_select`` of ``B`` random rows (pre-drawn index sets) into a preallocated output."""

    name = "gather"

    def supports(self, cell: Cell) -> bool:
        return cell.op == "sample"

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        store = self._store
        assert store is not None
        out = torch.empty(cell.batch, cell.dim)
        idx_sets = [torch.randint(0, cell.capacity, (cell.batch,)) for _ in range(N_INDEX_SETS)]
        k = [0]

        def step() -> torch.Tensor:
            torch.index_select(store, 0, idx_sets[k[0] % N_INDEX_SETS], out=out)
            k[0] += 1
            return out

        return step

    def measure(self, cell: Cell, payload: object) -> dict[str, Any]:
        assert isinstance(payload, torch.Tensor)
        return work_record(cell.batch, {"obs": payload.numel() * payload.element_size()}, False, "gather")
