"""Conduit's side of the benchmark: ``ExperienceBuffer`` insert and sample (+ priority update)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness import ALPHA, BETA, Cell, Timing, group_by_buffer, make_row, time_call

PREFILL_CHUNK = 8192
N_PRIORITY_SETS = 16


def _make_buffer(sampler: str, dim: int, capacity: int) -> Any:
    from conduit import BufferConfig, Column, ColumnBatch, ExperienceBuffer, Schema

    schema = Schema([Column("obs", torch.float32, (dim,))])
    buf = ExperienceBuffer(schema, BufferConfig(capacity=capacity, sampler=sampler, alpha=ALPHA, beta=BETA))
    filled = 0
    while filled < capacity:
        n = min(PREFILL_CHUNK, capacity - filled)
        buf.extend(ColumnBatch({"obs": torch.randn(n, dim)}))
        filled += n
    return buf


def _insert_fn(buf: Any, src: torch.Tensor) -> Callable[[], None]:
    from conduit import ColumnBatch

    def step() -> None:
        buf.extend(ColumnBatch({"obs": src}))

    return step


def _sample_fn(buf: Any, batch: int, prioritized: bool) -> Callable[[], None]:
    prio_sets = [torch.rand(batch) * 2 + 1e-3 for _ in range(N_PRIORITY_SETS)]
    k = [0]

    def sample_only() -> None:
        buf.sample(batch)

    def sample_and_update() -> None:
        s = buf.sample(batch)
        buf.update_priorities(s.slots, s.generations, prio_sets[k[0] % N_PRIORITY_SETS])
        k[0] += 1

    return sample_and_update if prioritized else sample_only


def run_conduit(cells: Iterable[Cell], timing: Timing, on_row: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Time Conduit on each cell; one prefilled (full) buffer per (sampler, dim)."""
    rows: list[dict[str, Any]] = []
    for (sampler, dim, cap), group in group_by_buffer(cells).items():
        buf = _make_buffer(sampler, dim, cap)
        for cell in sorted(group, key=lambda c: c.op == "insert"):  # sample before insert
            if cell.op == "insert":
                fn = _insert_fn(buf, torch.randn(cell.batch, dim))
            else:
                fn = _sample_fn(buf, cell.batch, sampler == "prioritized")
            row = make_row(cell, "conduit", time_call(fn, timing))
            rows.append(row)
            on_row(row)
        del buf
    return rows
