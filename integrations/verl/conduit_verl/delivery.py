"""Ready GRPO groups, held in a Conduit until ``update_actor`` takes them.

The Conduit (on-policy preset, inline) stores one reference per sample (``piece``, ``row``: which
ingested piece, which row of it); the token-level columns stay in TransferQueue, where verl's workers
read them. Each ingested piece is one ``put`` of whole groups (a group of ``n`` responses lands whole
or not at all) and each actor mini-batch one ``get``: consumed exactly once, in ingestion order, by
the policy version that produced it (``max_staleness=0``). The Conduit keeps its own metrics: the
step's spans (``ingest``, ``deliver``) already time these calls, and a piece put while generation
runs is not exposed; its counters join the step's metrics as ``conduit/buffer/*``.
"""

from __future__ import annotations

import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Metrics, Schema
from conduit_verl.compat import KVBatchMeta
from conduit_verl.errors import VerlIntegrationError

REF_SCHEMA = Schema([Column("piece", torch.int64), Column("row", torch.int64)])


class GroupFifo:
    """Whole groups in (``put``), mini-batches of sample references out (``take``), in ingestion order."""

    def __init__(self, group_size: int, capacity: int) -> None:
        config = BufferConfig.on_policy(max(capacity, group_size), group_size, max_staleness=0, mode="error")
        self.conduit = Conduit(REF_SCHEMA, config, metrics=Metrics(trace=False))
        self.pieces: list[KVBatchMeta] = []

    def put(self, piece: KVBatchMeta, groups: list[list[int]], version: int) -> None:
        """Commit ``piece``'s groups (row indices, each a whole group) under policy ``version``."""
        rows = torch.tensor([r for g in groups for r in g], dtype=torch.int64)
        index = torch.full_like(rows, len(self.pieces))
        self.conduit.put(ColumnBatch({"piece": index, "row": rows}), version=version)
        self.pieces.append(piece)

    def __len__(self) -> int:
        return len(self.conduit.buffer)

    def take(self, n: int, version: int) -> KVBatchMeta:
        """The next ``n`` samples (consumed) as one batch of TransferQueue keys."""
        refs = self.conduit.get(n, version=version).batch
        keys, tags = [], []
        for p, r in zip(refs["piece"].tolist(), refs["row"].tolist(), strict=True):  # type: ignore[union-attr]
            piece = self.pieces[p]
            keys.append(piece.keys[r])
            tags.append(piece.tags[r])
        first = self.pieces[0]
        return KVBatchMeta(
            partition_id=first.partition_id, keys=keys, tags=tags, extra_info=dict(first.extra_info or {})
        )

    def all_samples(self) -> KVBatchMeta:
        """Every key put this step (padding rows included): what ``fit`` reports on and clears."""
        keys = [k for p in self.pieces for k in p.keys]
        tags = [t for p in self.pieces for t in p.tags]
        return KVBatchMeta(partition_id=self.pieces[0].partition_id, keys=keys, tags=tags)

    def end_step(self) -> dict[str, float]:
        """Forget this step's pieces; the Conduit's counters of the step (``conduit/buffer/*``:
        samples inserted, sampled). Every group must have been consumed."""
        if len(self):
            raise VerlIntegrationError(f"{len(self)} samples of this step were never delivered")
        self.pieces = []
        counts = self.conduit.metrics.end_iteration()
        return {f"conduit/buffer/{k}": counts.get(f"count/{k}", 0.0) for k in ("inserted", "sampled")}
