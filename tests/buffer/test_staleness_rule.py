"""``samplers.is_stale``: the one staleness rule, and the FIFO sampler evicting by exactly it."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit import BufferConfig, Column, ColumnBatch, RateLimit, Schema
from conduit.buffer.samplers import is_stale
from conduit.build_buffer import build_buffer

SCHEMA = Schema([Column("id", torch.int64)])


def test_bound_by_hand() -> None:
    versions = torch.tensor([0, 1, 2, 3])
    # consumer 3: bound 0 keeps only version 3, bound 1 keeps 2 and 3, bound 3 keeps all
    assert is_stale(versions, 3, 0).tolist() == [True, True, True, False]
    assert is_stale(versions, 3, 1).tolist() == [True, True, False, False]
    assert is_stale(versions, 3, 3).tolist() == [False, False, False, False]
    # a consumer older than the items (never in a FIFO, possible for groups): never stale
    assert not is_stale(versions, 0, 0).any()


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    bound=st.integers(0, 3),
    ahead=st.integers(0, 6),
)
def test_fifo_evicts_what_the_rule_says(sizes: list[int], bound: int, ahead: int) -> None:
    """Writes of versions 0, 1, ...; a read by a later version returns exactly the items the rule keeps."""
    cfg = BufferConfig(capacity=64, sampler="fifo", rate_limit=RateLimit(max_staleness=bound))
    b = build_buffer(cfg, SCHEMA)
    versions: list[int] = []
    for v, n in enumerate(sizes):
        b.extend(ColumnBatch({"id": torch.arange(len(versions), len(versions) + n)}), version=v)
        versions += [v] * n
    consumer = len(sizes) - 1 + ahead
    keep = ~is_stale(torch.tensor(versions), consumer, bound)
    if int(keep.sum()) == 0:
        return  # nothing left to read (a read would wait)
    got = b.sample(int(keep.sum()), version=consumer)
    assert got.batch["id"].tolist() == torch.nonzero(keep).flatten().tolist()
    assert b.metrics.totals().get("count/stale_evicted", 0) == int((~keep).sum())
