"""Issue 49, item 2: a get of a size that is no batch (huge, zero, negative, not an int) is refused with a
``ConfigError`` naming it, in the caller, before anything is allocated; the runtime keeps serving.

A sampler that draws with replacement may return more items than the buffer holds, but not without
bound: at most ``buffer.max_batch`` (the capacity, or what ``MAX_BATCH_BYTES`` holds, whichever is more).
The huge sizes here would allocate terabytes if the bound came after the allocation.
"""

from __future__ import annotations

import re

import pytest
import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, SchedulerConfig, Schema
from conduit.buffer.buffer import MAX_BATCH_BYTES, SAMPLE_META_BYTES
from conduit.errors import ConfigError

SCHEMA = Schema([Column("id", torch.int64), Column("obs", torch.float32, (4,))])
BAD = [2**40, 10**9, 0, -1, True, 1.5]


def conduit(sampler: str, overlap: str) -> Conduit:
    buf = BufferConfig(capacity=16, sampler=sampler)
    c = Conduit(SCHEMA, buf, SchedulerConfig(overlap=overlap), seed=0)
    ids = torch.arange(16)
    c.put(ColumnBatch({"id": ids, "obs": torch.zeros(16, 4)}))
    c.flush()
    return c


@pytest.mark.parametrize("overlap", ["sync", "async"])
@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_a_get_of_no_batch_size_is_refused_in_the_caller_and_later_gets_work(sampler, overlap):
    c = conduit(sampler, overlap)
    for n in BAD:
        with pytest.raises(ConfigError, match=rf"get\({re.escape(repr(n))}\)|got {re.escape(repr(n))}$"):
            c.get(n)
        assert c.get(4).batch.size == 4  # the runtime (async: its delivery worker) still serves
    with pytest.raises(ConfigError, match="at most"):
        c.get_epochs(4, num_epochs=2**40)
    assert c.get(4).batch.size == 4
    c.close()


def test_the_bound_is_the_capacity_or_a_gigabyte_of_items_whichever_is_more():
    c = conduit("uniform", "sync")
    bound = max(16, MAX_BATCH_BYTES // (SCHEMA.nbytes_per_item + SAMPLE_META_BYTES))
    assert c.buffer.max_batch == bound
    with pytest.raises(ConfigError, match=rf"get\({bound + 1}\): at most {bound} items"):
        c.get(bound + 1)
    assert c.get(64).batch.size == 64  # with replacement: more than the buffer holds is a batch
    c.close()


def test_a_bare_buffer_refuses_a_huge_sample_before_it_draws():
    c = conduit("prioritized", "sync")
    with pytest.raises(ConfigError, match=r"sample\(1099511627776\)"):
        c.buffer.sample(2**40)
    assert c.buffer.sample(8).batch.size == 8
    c.close()
