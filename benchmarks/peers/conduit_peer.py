"""Conduit's side of the benchmark: ``ExperienceBuffer`` insert, and sample (+ priority update)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from harness import ALPHA, BETA, Cell, System

PREFILL_CHUNK = 8192
N_PRIORITY_SETS = 16


class ConduitSystem(System):
    """A full ``ExperienceBuffer`` with one ``obs`` float32 column; prioritized cells update priorities."""

    name = "conduit"

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        from conduit import BufferConfig, Column, ColumnBatch, Schema

        schema = Schema([Column("obs", torch.float32, (dim,))])
        cfg = BufferConfig(capacity=capacity, sampler=sampler, alpha=ALPHA, beta=BETA)
        self._buf: Any = cfg.build(schema)
        filled = 0
        while filled < capacity:
            n = min(PREFILL_CHUNK, capacity - filled)
            self._buf.extend(ColumnBatch({"obs": torch.randn(n, dim)}))
            filled += n

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        from conduit import ColumnBatch

        buf = self._buf
        if cell.op == "insert":
            src = torch.randn(cell.batch, cell.dim)
            return lambda: buf.extend(ColumnBatch({"obs": src}))
        # A steady-state consumer reuses its batch memory: sample(out=...) gathers into the previous
        # batch (like the memcpy and gather references, which copy into a preallocated output).
        out = [buf.sample(cell.batch).batch]
        if cell.sampler != "prioritized":

            def sample() -> None:
                out[0] = buf.sample(cell.batch, out=out[0]).batch

            return sample
        prio_sets = [torch.rand(cell.batch) * 2 + 1e-3 for _ in range(N_PRIORITY_SETS)]
        k = [0]

        def sample_and_update() -> None:
            s = buf.sample(cell.batch, out=out[0])
            out[0] = s.batch
            buf.update_priorities(s.slots, s.generations, prio_sets[k[0] % N_PRIORITY_SETS])
            k[0] += 1

        return sample_and_update

    def close(self) -> None:
        super().close()
        self._buf = None
