"""The CPU prioritized buffer checks, compares generations and applies a priority update in one kernel
call; it must do exactly what the step-by-step torch path does, and change nothing on a fault."""

from __future__ import annotations

import math

import pytest
import torch

from conduit import BufferConfig, Column, ColumnBatch, Schema
from conduit.buffer.buffer import ExperienceBuffer
from conduit.build_buffer import build_buffer
from conduit.errors import PriorityError

CAP = 64


def _buffer(nonfinite: str = "reject") -> ExperienceBuffer:
    b = build_buffer(
        BufferConfig(capacity=CAP, sampler="prioritized", nonfinite=nonfinite),
        Schema([Column("x", torch.float32, (3,))]),
        seed=0,
    )
    b.extend(ColumnBatch({"x": torch.randn(48, 3)}))
    return b


def _state(b: ExperienceBuffer) -> tuple[torch.Tensor, float]:
    s = b.sampler.state_dict()
    return s["tree"]["priorities"].clone(), s["max_priority"]  # type: ignore[index]


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor: the buffer then takes its step-by-step torch path."""
    return torch.stack([t, t], 1)[:, 0]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("nonfinite", ["reject", "count"])
def test_one_pass_update_equals_the_step_by_step_path(seed: int, nonfinite: str) -> None:
    g = torch.Generator().manual_seed(seed)
    fused, stepwise = _buffer(nonfinite), _buffer(nonfinite)
    for _ in range(5):
        n = int(torch.randint(1, 40, (1,), generator=g))
        slots = torch.randint(0, 48, (n,), generator=g)  # duplicates included
        gens = fused.storage.generation.index_select(0, slots).clone()
        gens[torch.rand(n, generator=g) < 0.2] -= 1  # some were overwritten since they were sampled
        pri = torch.rand(n, generator=g, dtype=torch.float64) * 3
        pri[torch.rand(n, generator=g) < 0.2] = 0.0
        if nonfinite == "count":
            pri[torch.rand(n, generator=g) < 0.2] = math.nan
        a = fused.update_priorities(slots, gens, pri)
        b = stepwise.update_priorities(slots, _strided(gens), pri)
        assert a == b
        pa, ma = _state(fused)
        pb, mb = _state(stepwise)
        assert torch.equal(pa, pb) and ma == mb
    counts = [
        {k: v for k, v in b.metrics.end_iteration().items() if k.startswith("count/")}
        for b in (fused, stepwise)
    ]
    assert counts[0] == counts[1]


@pytest.mark.parametrize(
    ("slots", "priorities", "match"),
    [
        ([1, 2, CAP], [1.0, 1.0, 1.0], "slots must lie"),
        ([1, -1, 2], [1.0, 1.0, 1.0], "slots must lie"),
        ([1, 2, 3], [1.0, math.nan, 1.0], "finite"),
        ([1, 2, 3], [1.0, -math.inf, 1.0], "finite"),
        ([1, 2, 3], [1.0, 2.0, -0.5], ">= 0"),
    ],
)
def test_a_faulty_update_changes_nothing(slots: list[int], priorities: list[float], match: str) -> None:
    b = _buffer()
    before = _state(b)
    s = torch.tensor(slots)
    gens = b.storage.generation.index_select(0, s.clamp(0, CAP - 1)).clone()
    with pytest.raises(PriorityError, match=match):
        b.update_priorities(s, gens, torch.tensor(priorities))
    after = _state(b)
    assert torch.equal(before[0], after[0]) and before[1] == after[1]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_priorities_of_any_float_dtype_and_with_grad_are_taken(dtype: torch.dtype) -> None:
    b, ref = _buffer(), _buffer()
    s = b.sample(8)
    td = (torch.arange(8, dtype=dtype) + 1).requires_grad_(dtype != torch.bfloat16)
    assert b.update_priorities(s.slots, s.generations, td) == 8
    ref.update_priorities(s.slots, s.generations, td.detach().double())
    pa, ma = _state(b)
    pb, mb = _state(ref)
    assert torch.equal(pa, pb) and ma == mb
