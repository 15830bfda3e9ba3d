"""Both sum trees against a numpy reference: sums, mins, prefix search, sampling, state, errors.

Every test that takes the ``make`` fixture runs twice: on the torch reference ``SumTree`` and on the
fused numba ``FusedSumTree`` (float64 only). ``test_fused_sumtree.py`` compares the two directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.buffer import sumtree as sumtree_mod
from conduit.buffer.fused_sumtree import FusedSumTree
from conduit.buffer.sumtree import SumTree
from conduit.errors import ConduitError, ConfigError, ShapeError


class Reference:
    """Flat numpy model: last write wins, min over written leaves."""

    def __init__(self, capacity: int) -> None:
        self.values = np.zeros(capacity)
        self.written = np.zeros(capacity, dtype=bool)

    def update(self, slots: np.ndarray, values: np.ndarray) -> None:
        for s, v in zip(slots.tolist(), values.tolist()):
            self.values[s] = v
            self.written[s] = True

    def min(self) -> float:
        return float(self.values[self.written].min()) if self.written.any() else math.inf


def _apply(tree: SumTree, ref: Reference, slots: np.ndarray, values: np.ndarray) -> None:
    tree.update(torch.from_numpy(slots), torch.from_numpy(values))
    ref.update(slots, values)


def _check(tree: SumTree, ref: Reference) -> None:
    cap = tree.capacity
    np.testing.assert_array_equal(tree.get(torch.arange(cap)).numpy(), ref.values)
    assert tree.total() == pytest.approx(ref.values.sum(), rel=1e-12, abs=1e-12)
    assert tree.min() == ref.min()


updates = st.lists(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 20)), min_size=0, max_size=40),
    min_size=1,
    max_size=8,
)


@pytest.fixture(params=[None, 1], ids=["flat-top", "deep"])
def flat_top(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run a test twice: with the default flat top, and with a tree descended down from a single root."""
    if request.param is not None:
        monkeypatch.setattr(sumtree_mod, "_FLAT_TOP", request.param)


@pytest.fixture(params=["torch", "fused"])
def make(request: pytest.FixtureRequest) -> Callable[..., SumTree]:
    """A constructor ``make(capacity, arity=32, dtype=torch.float64)`` of one implementation."""

    def build(capacity: int, arity: int = 32, dtype: torch.dtype = torch.float64) -> SumTree:
        if request.param == "torch":
            return SumTree(capacity, arity=arity, dtype=dtype)
        if dtype != torch.float64:
            pytest.skip("the fused tree holds float64 priorities only")
        return FusedSumTree(capacity, arity=arity)

    return build


@pytest.mark.usefixtures("flat_top")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(1, 300), arity=st.integers(2, 9), batches=updates)
def test_total_min_get_match_reference(
    make: Callable[..., SumTree], capacity: int, arity: int, batches: list
) -> None:
    tree, ref = make(capacity, arity=arity), Reference(capacity)
    assert tree.total() == 0.0 and tree.min() == math.inf
    for batch in batches:
        slots = np.array([s % capacity for s, _ in batch], dtype=np.int64)
        values = np.array([v / 4 for _, v in batch], dtype=np.float64)  # exact binary fractions, zeros, dups
        _apply(tree, ref, slots, values)
        _check(tree, ref)


def test_duplicate_slots_last_occurrence_wins(make: Callable[..., SumTree]) -> None:
    tree = make(10, arity=4)
    tree.update(torch.tensor([3, 3, 7, 3, 7]), torch.tensor([1.0, 2.0, 5.0, 4.0, 0.5]))
    assert tree.get(torch.tensor([3, 7])).tolist() == [4.0, 0.5]
    assert tree.total() == 4.5 and tree.min() == 0.5
    for _ in range(20):  # many duplicates of one slot, in one call and across calls
        tree.update(torch.full((300,), 9), torch.arange(300, dtype=torch.float64))
    assert tree.get(torch.tensor([9])).item() == 299.0
    assert tree.total() == 303.5


@pytest.mark.usefixtures("flat_top")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(1, 400), arity=st.integers(2, 70), seed=st.integers(0, 2**32 - 1))
def test_find_matches_searchsorted_over_cumsum(
    make: Callable[..., SumTree], capacity: int, arity: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # Integer priorities keep every partial sum exact, so the tree must agree with numpy exactly.
    values = rng.integers(0, 5, capacity).astype(np.float64)
    values[rng.integers(0, capacity)] = 3.0
    tree = make(capacity, arity=arity)
    tree.update(torch.arange(capacity), torch.from_numpy(values))
    cs = np.cumsum(values)
    targets = np.concatenate([rng.random(500) * cs[-1], cs[values > 0] - values[values > 0], [0.0]])
    got = tree.find(torch.from_numpy(targets)).numpy()
    np.testing.assert_array_equal(got, np.searchsorted(cs, targets, side="right"))


@pytest.mark.usefixtures("flat_top")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("capacity,arity", [(1, 64), (7, 2), (1000, 3), (4097, 64), (100_000, 64)])
def test_find_never_returns_zero_or_out_of_range(
    make: Callable[..., SumTree], capacity: int, arity: int, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(capacity)
    values = torch.rand(capacity, generator=gen, dtype=dtype) * 1e3
    values[torch.rand(capacity, generator=gen) < 0.7] = 0.0  # mostly zeros, incl. the last leaves
    values[-min(capacity, 5) :] = 0.0
    values[0] = 0.0
    values[capacity // 2] = 1e-30 if dtype == torch.float64 else 1e-20  # tiny beside large ones
    tree = make(capacity, arity=arity, dtype=dtype)
    tree.update(torch.arange(capacity), values)
    total = torch.tensor(tree.total(), dtype=dtype)
    edges = [
        0.0,
        -1.0,
        float(total),
        float(total) * 2,
        float(torch.nextafter(total, torch.tensor(0.0, dtype=dtype))),
        math.nan,
        math.inf,
        -math.inf,
    ]
    targets = torch.cat(
        [torch.rand(20_000, generator=gen, dtype=dtype) * total, torch.tensor(edges, dtype=dtype)]
    )
    for got in (tree.find(targets), tree.sample(4096, gen), tree.sample(1, gen)):
        assert int(got.min()) >= 0 and int(got.max()) < capacity
        assert bool((values[got] > 0).all())


@pytest.mark.usefixtures("flat_top")
@pytest.mark.parametrize("arity", [8, 16, 64])
def test_find_survives_rounding_between_levels(make: Callable[..., SumTree], arity: int) -> None:
    # Row 0 = [1, 1e-16, ...]: its pairwise sum exceeds its sequential cumsum by a few ulps, so a target
    # just under the parent's prefix can overshoot the row; the descent must stay on a non-zero leaf.
    values = torch.zeros(4 * arity, dtype=torch.float64)
    values[:arity] = 1e-16
    values[0] = 1.0
    values[2 * arity - 1] = 1.0
    tree = make(4 * arity, arity=arity)
    tree.update(torch.arange(4 * arity), values)
    targets = 1.0 + torch.linspace(-1e-15, 1e-14, 4001, dtype=torch.float64)
    got = tree.find(targets)
    assert int(got.max()) < 4 * arity and bool((values[got] > 0).all())


def test_sampling_is_proportional(make: Callable[..., SumTree]) -> None:
    priorities = torch.arange(1, 11, dtype=torch.float64)
    tree = make(10, arity=4)
    tree.update(torch.arange(10), priorities)
    gen = torch.Generator().manual_seed(1234)
    draws = torch.cat([tree.sample(1000, gen) for _ in range(200)])
    freq = torch.bincount(draws, minlength=10).double() / draws.numel()
    expected = priorities / priorities.sum()
    assert float((freq - expected).abs().max()) < 0.01
    # Stratified: segment i's target lies in [i, i + 1) * total / n, so the draws come out sorted.
    one = tree.sample(1000, gen)
    assert bool((one[1:] >= one[:-1]).all())
    assert torch.equal(
        tree.sample(64, torch.Generator().manual_seed(7)), tree.sample(64, torch.Generator().manual_seed(7))
    )


def test_sampling_skips_zero_and_unwritten_leaves(make: Callable[..., SumTree]) -> None:
    tree = make(100, arity=8)
    tree.update(torch.tensor([5, 50, 99]), torch.tensor([1.0, 0.0, 3.0]))
    draws = tree.sample(10_000, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=100)
    assert set(torch.nonzero(counts).flatten().tolist()) == {5, 99}
    assert abs(counts[99].item() / 10_000 - 0.75) < 0.01
    assert tree.min() == 0.0  # a written zero counts for min, unwritten leaves do not


def test_capacity_one_and_find_shape(make: Callable[..., SumTree]) -> None:
    tree = make(1)
    assert tree.capacity == 1
    tree.update(torch.tensor([0]), torch.tensor([2.5]))
    assert tree.total() == 2.5 and tree.min() == 2.5
    assert tree.sample(5).tolist() == [0] * 5
    assert tree.find(torch.tensor([[0.0, 2.4], [2.5, 99.0]])).shape == (2, 2)
    assert tree.sample(0).shape == (0,)


def test_all_zero_tree_returns_in_range_indices(make: Callable[..., SumTree]) -> None:
    tree = make(130, arity=4)
    out = tree.sample(16)
    assert out.shape == (16,) and int(out.min()) >= 0 and int(out.max()) < 130


@pytest.mark.usefixtures("flat_top")
def test_state_dict_round_trip(make: Callable[..., SumTree]) -> None:
    gen = torch.Generator().manual_seed(3)
    tree = make(1000, arity=6)
    tree.update(
        torch.randint(0, 1000, (700,), generator=gen), torch.rand(700, generator=gen, dtype=torch.float64)
    )
    state = tree.state_dict()
    assert set(state) == {"priorities", "written"}
    other = make(1000, arity=6)
    other.load_state_dict(state)
    assert torch.equal(other.get(torch.arange(1000)), tree.get(torch.arange(1000)))
    assert other.total() == pytest.approx(tree.total(), rel=1e-12) and other.min() == tree.min()
    targets = torch.rand(2000, generator=gen, dtype=torch.float64) * tree.total()
    assert torch.equal(other.find(targets), tree.find(targets))
    # The restored tree keeps working incrementally, with last-wins dedupe intact.
    other.update(torch.tensor([1, 1]), torch.tensor([9.0, 0.25]))
    assert other.get(torch.tensor([1])).item() == 0.25
    before = tree.get(torch.tensor([0])).item()
    state["priorities"][0] += 123.0  # state_dict returns a copy, not a view of the tree
    assert tree.get(torch.tensor([0])).item() == before
    with pytest.raises(ShapeError):
        make(999).load_state_dict(tree.state_dict())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity": 0},
        {"capacity": -3},
        {"capacity": 2.0},
        {"capacity": True},
        {"capacity": 10, "arity": 1},
        {"capacity": 10, "arity": 3.5},
        {"capacity": 10, "dtype": torch.int64},
        {"capacity": 10, "device": "no-such-device"},
    ],
)
def test_bad_constructor_args_raise_config_error(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        SumTree(**kwargs)


def test_bad_update_args_raise_and_leave_tree_unchanged(make: Callable[..., SumTree]) -> None:
    tree = make(10, arity=4)
    tree.update(torch.tensor([1, 2]), torch.tensor([1.0, 2.0]))
    with pytest.raises(ShapeError):
        tree.update(torch.tensor([1, 2, 3]), torch.tensor([1.0, 2.0]))
    for slots, values in [
        ([10], [1.0]),
        ([-1], [1.0]),
        ([1], [-0.5]),
        ([1], [math.nan]),
        ([1], [math.inf]),
    ]:
        with pytest.raises(ConduitError):
            tree.update(torch.tensor(slots), torch.tensor(values))
    with pytest.raises(ConduitError):
        tree.get(torch.tensor([10]))
    with pytest.raises(ConfigError):
        tree.sample(-1)
    assert tree.total() == 3.0 and tree.min() == 1.0
    assert tree.get(torch.arange(10)).tolist() == [0.0, 1.0, 2.0] + [0.0] * 7


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    gen = torch.Generator().manual_seed(5)
    slots = torch.randint(0, 5000, (3000,), generator=gen)
    values = torch.randint(0, 4, (3000,), generator=gen).double()
    cpu, gpu = SumTree(5000, arity=16), SumTree(5000, device="cuda", arity=16)
    cpu.update(slots, values)
    gpu.update(slots.cuda(), values.cuda())
    assert torch.equal(gpu.get(torch.arange(5000, device="cuda")).cpu(), cpu.get(torch.arange(5000)))
    assert gpu.total() == cpu.total() and gpu.min() == cpu.min()
    targets = torch.rand(4096, generator=gen, dtype=torch.float64) * cpu.total()
    assert torch.equal(gpu.find(targets.cuda()).cpu(), cpu.find(targets))
    assert gpu.sample(256).device.type == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_reference_matches_fused_cpu_tree() -> None:
    """CUDA keeps the torch path: same slots, weights and priority updates as the fused CPU tree."""
    gen = torch.Generator().manual_seed(6)
    values = torch.rand(5000, generator=gen, dtype=torch.float64)
    cpu, gpu = FusedSumTree(5000), SumTree(5000, device="cuda")
    cpu.update(torch.arange(5000), values)
    gpu.update(torch.arange(5000, device="cuda"), values.cuda())
    slots = torch.randint(0, 5000, (256,), generator=gen)
    prio, live = torch.rand(256, generator=gen), torch.rand(256, generator=gen) > 0.2
    mp_c = cpu.set_priorities(slots, prio, live, 0.6, 1e-6, torch.ones((), dtype=torch.float64))
    mp_g = gpu.set_priorities(
        slots.cuda(), prio.cuda(), live.cuda(), 0.6, 1e-6, torch.ones((), dtype=torch.float64, device="cuda")
    )
    assert float(mp_c) == float(mp_g)
    torch.testing.assert_close(gpu.get(torch.arange(5000, device="cuda")).cpu(), cpu.get(torch.arange(5000)))
    targets = torch.rand(4096, generator=gen, dtype=torch.float64) * cpu.total()
    assert torch.equal(gpu.find(targets.cuda()).cpu(), cpu.find(targets))
    s, w = gpu.sample_with_weights(256, 0.4)
    assert s.device.type == w.device.type == "cuda" and w.dtype == torch.float32
