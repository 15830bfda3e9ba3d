"""GPU tiers and delivery (skipped without CUDA; run on a GPU machine with ``pytest -m gpu``)."""

import pytest
import torch

from conduit import (
    BufferConfig,
    Column,
    ColumnBatch,
    Conduit,
    Ragged,
    SchedulerConfig,
    Schema,
)
from conduit.build_buffer import build_buffer

pytestmark = pytest.mark.gpu
SCHEMA = Schema([Column("obs", torch.float32, (16,)), Column("tok", torch.int64, ragged=True, max_len=8)])


def batch(n: int, device: str = "cpu") -> ColumnBatch:
    lens = torch.randint(1, 9, (n,))
    tok = Ragged.from_lengths(torch.arange(int(lens.sum())), lens)
    return ColumnBatch({"obs": torch.arange(n * 16.0).view(n, 16), "tok": tok}).to(device)


@pytest.mark.parametrize("tier", ["cuda", "pinned"])
def test_gpu_and_pinned_tiers(tier):
    b = build_buffer(BufferConfig(capacity=64, tier=tier, sampler="fifo"), SCHEMA)
    src = batch(10)
    b.extend(src)
    s = b.sample(10)
    assert torch.equal(s.batch["obs"].cpu(), src["obs"])
    assert torch.equal(s.batch["tok"].values.cpu(), src["tok"].values)
    if tier == "pinned":
        assert b.storage.data["obs"].is_pinned()


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_delivery_to_cuda_from_host(overlap):
    c = Conduit(
        SCHEMA, BufferConfig(capacity=64, sampler="fifo"), SchedulerConfig(overlap=overlap), device="cuda"
    )
    src = batch(32)
    c.put(src)
    c.flush()
    d = c.get(32)
    assert d.batch["obs"].is_cuda
    assert torch.equal(d.batch["obs"].cpu(), src["obs"])
    assert c.end_iteration()["bytes/host->cuda"] > 0
    c.close()


def test_prioritized_sum_tree_on_gpu():
    b = build_buffer(BufferConfig(capacity=1024, tier="cuda", sampler="prioritized"), SCHEMA)
    b.extend(batch(512, "cuda"))
    s = b.sample(256)
    assert s.slots.is_cuda and s.weights.is_cuda
    b.update_priorities(s.slots, s.generations, torch.rand(256, device="cuda"))
