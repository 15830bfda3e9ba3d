"""Conduit's side of the benchmark: ``ExperienceBuffer`` insert, and sample (+ priority update)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from harness import ALPHA, BETA, N_PRIORITY_SETS, Cell, System, prefill, work_record

from conduit.build_buffer import build_buffer


class ConduitSystem(System):
    """A full ``ExperienceBuffer`` with one ``obs`` float32 column; prioritized cells update priorities."""

    name = "conduit"

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        from conduit import BufferConfig, Column, ColumnBatch, Schema

        schema = Schema([Column("obs", torch.float32, (dim,))])
        cfg = BufferConfig(capacity=capacity, sampler=sampler, alpha=ALPHA, beta=BETA)
        self._buf: Any = build_buffer(cfg, schema)
        prefill(lambda n: self._buf.extend(ColumnBatch({"obs": torch.randn(n, dim)})), capacity)

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        from conduit import ColumnBatch

        buf = self._buf
        if cell.op == "insert":
            src = torch.randn(cell.batch, cell.dim)

            def insert() -> ColumnBatch:
                batch = ColumnBatch({"obs": src})
                buf.extend(batch)
                return batch

            return insert
        # A steady-state consumer reuses its batch memory: sample(out=...) gathers into the previous
        # batch (like the memcpy and gather references, which copy into a preallocated output).
        out = [buf.sample(cell.batch).batch]
        if cell.sampler != "prioritized":

            def sample() -> ColumnBatch:
                out[0] = buf.sample(cell.batch, out=out[0]).batch
                return out[0]

            return sample
        prio_sets = [torch.rand(cell.batch) * 2 + 1e-3 for _ in range(N_PRIORITY_SETS)]
        k = [0]

        def sample_and_update() -> ColumnBatch:
            s = buf.sample(cell.batch, out=out[0])
            out[0] = s.batch
            buf.update_priorities(s.slots, s.generations, prio_sets[k[0] % N_PRIORITY_SETS])
            k[0] += 1
            return s.batch

        return sample_and_update

    def measure(self, cell: Cell, payload: object) -> dict[str, Any]:
        return batch_work(payload, cell.op == "sample" and cell.sampler == "prioritized")

    def close(self) -> None:
        super().close()
        self._buf = None


def batch_work(batch: Any, priority_update: bool) -> dict[str, Any]:
    """The work record of a ``ColumnBatch`` delivered (sample) or taken in (insert)."""
    cols = {k: v.numel() * v.element_size() for k, v in batch.columns.items()}
    return work_record(batch.size, cols, priority_update, "buffer")
