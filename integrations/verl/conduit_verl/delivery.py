"""Ready GRPO groups, held in Conduit's grouped FIFO buffer until ``update_actor`` takes them.

The buffer stores one reference per sample (``piece``, ``row``: which ingested piece, which row of
it); the token-level columns stay in TransferQueue, where verl's workers read them. A group of
``n`` responses lands whole or not at all (``writer="grouped"``) and is consumed exactly once
(``sampler="fifo"``), by the policy version that produced it (``max_staleness=0``).
"""

from __future__ import annotations

import torch

from conduit import BufferConfig, Column, ColumnBatch, Metrics, Schema
from conduit.build_buffer import build_buffer
from conduit_verl.compat import KVBatchMeta

REF_SCHEMA = Schema([Column("piece", torch.int64), Column("row", torch.int64)])


class GroupFifo:
    """Whole groups in, mini-batches of sample references out, in ingestion order."""

    def __init__(self, group_size: int, capacity: int, metrics: Metrics) -> None:
        config = BufferConfig.on_policy(max(capacity, group_size), group_size, max_staleness=0, mode="error")
        self.buffer = build_buffer(config, REF_SCHEMA, metrics)
        self.pieces: list[KVBatchMeta] = []

    def put(self, piece: KVBatchMeta, groups: list[list[int]], version: int) -> None:
        """Commit ``piece``'s groups (row indices, each a whole group) under policy ``version``."""
        rows = torch.tensor([r for g in groups for r in g], dtype=torch.int64)
        index = torch.full_like(rows, len(self.pieces))
        self.pieces.append(piece)
        self.buffer.extend(ColumnBatch({"piece": index, "row": rows}), version=version)

    def __len__(self) -> int:
        return len(self.buffer)

    def take(self, n: int, version: int) -> KVBatchMeta:
        """The next ``n`` samples (consumed) as one batch of TransferQueue keys."""
        refs = self.buffer.sample(n, version=version).batch
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

    def reset(self) -> None:
        """Forget this step's pieces (the buffer itself must be empty: every group consumed)."""
        assert len(self.buffer) == 0, f"{len(self.buffer)} samples were never delivered"
        self.pieces = []
