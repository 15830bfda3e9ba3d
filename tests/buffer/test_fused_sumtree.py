"""The fused numba sum tree against the torch reference: same slots, same sums, same weights.

Both trees get the same writes; the fused tree sums rows sequentially and torch may vectorise, so
inner sums agree to rounding and a random target could only pick another leaf within an ulp of a
boundary (probability ~1e-13 per target, never hit by these seeds).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit import BufferConfig, Column, ColumnBatch, Schema
from conduit.buffer import priority_kernels
from conduit.buffer import sumtree as sumtree_mod
from conduit.buffer import sumtree_kernels as kernels
from conduit.buffer.fused_sumtree import FusedSumTree
from conduit.buffer.samplers import make_sum_tree
from conduit.buffer.sumtree import SumTree
from conduit.build_buffer import build_buffer

KERNELS = (
    kernels.find,
    kernels.sample,
    kernels.update,
    kernels.rebuild,
    kernels.set_priorities,
    priority_kernels._checked_update,
)


@pytest.fixture(params=[None, 1], ids=["flat-top", "deep"])
def flat_top(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default flat top, and with every level below a single root (deepest descent)."""
    if request.param is not None:
        monkeypatch.setattr(sumtree_mod, "_FLAT_TOP", request.param)


def _pair(capacity: int, arity: int, values: np.ndarray) -> tuple[SumTree, FusedSumTree]:
    ref, fused = SumTree(capacity, arity=arity), FusedSumTree(capacity, arity=arity)
    for tree in (ref, fused):
        tree.update(torch.arange(capacity), torch.from_numpy(values))
    return ref, fused


def _priorities(rng: np.random.Generator, capacity: int) -> np.ndarray:
    """Random priorities with a zero run (a whole zero subtree when long enough) and scattered zeros."""
    values = rng.random(capacity) * rng.choice([1e-3, 1.0, 1e6])
    start = int(rng.integers(0, capacity))
    values[start : start + int(rng.integers(0, capacity + 1))] = 0.0
    values[rng.random(capacity) < 0.2] = 0.0
    return values


def _random_trees(examples: int, max_capacity: int, max_arity: int) -> Callable[[Callable], Callable]:
    """A test over ``examples`` random ``(capacity, arity, seed)``, under both tree depths (``flat_top``)."""

    def wrap(test: Callable) -> Callable:
        cases = given(
            capacity=st.integers(1, max_capacity),
            arity=st.integers(2, max_arity),
            seed=st.integers(0, 2**32 - 1),
        )
        checks = settings(
            max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
        )
        return pytest.mark.usefixtures("flat_top")(checks(cases(test)))

    return wrap


def _assert_same_tree(ref: SumTree, fused: FusedSumTree, leaf_rtol: float = 0.0) -> None:
    """Leaves and mins equal (to ``leaf_rtol``: torch's vectorised pow rounds differently), sums to rounding."""
    cap = ref.capacity
    close = {"rtol": leaf_rtol, "atol": 0.0}
    torch.testing.assert_close(fused.get(torch.arange(cap)), ref.get(torch.arange(cap)), **close)
    for rv, fv, rm, fm in zip(ref._v, fused._v, ref._m, fused._m):  # lower levels, scratch slot excluded
        torch.testing.assert_close(fv[:-1], rv[:-1], rtol=max(leaf_rtol, 1e-12), atol=1e-300)
        torch.testing.assert_close(fm[:-1], rm[:-1], **close)
    torch.testing.assert_close(fused._top, ref._top, rtol=max(leaf_rtol, 1e-12), atol=1e-300)
    torch.testing.assert_close(fused._top_m, ref._top_m, **close)
    assert fused.total() == pytest.approx(ref.total(), rel=1e-12) and fused.min() == ref.min()


@_random_trees(examples=40, max_capacity=700, max_arity=40)
def test_same_tree_same_slots_same_weights(capacity: int, arity: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref, fused = _pair(capacity, arity, _priorities(rng, capacity))
    slots = rng.integers(0, capacity, int(rng.integers(0, 3 * capacity)))  # duplicates: last one wins
    values = torch.from_numpy(rng.random(slots.size) * (rng.random(slots.size) > 0.3))
    for tree in (ref, fused):
        tree.update(torch.from_numpy(slots), values)
    _assert_same_tree(ref, fused)
    total = ref.total()
    targets = torch.from_numpy(
        np.concatenate([rng.random(300) * total, [0.0, -1.0, total, 2 * total, math.nan, math.inf]])
    )
    assert torch.equal(fused.find(targets), ref.find(targets))
    for n in (1, 7, 2 * capacity + 3, 256):  # incl. more draws than non-zero leaves
        beta = float(rng.random())
        rs, rw = ref.sample_with_weights(n, beta, torch.Generator().manual_seed(seed % 1000 + n))
        fs, fw = fused.sample_with_weights(n, beta, torch.Generator().manual_seed(seed % 1000 + n))
        assert torch.equal(fs, rs)
        torch.testing.assert_close(fw, rw, rtol=1e-6, atol=0.0, equal_nan=True)  # 0/0 if all zero
        assert fw.dtype == torch.float32 and fs.dtype == torch.int64
        if total > 0:
            assert bool((ref.get(fs) > 0).all()) and int(fs.max()) < capacity


@_random_trees(examples=30, max_capacity=500, max_arity=33)
def test_set_priorities_matches_reference(capacity: int, arity: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref, fused = _pair(capacity, arity, _priorities(rng, capacity))
    alpha, eps = float(rng.random()), float(rng.choice([0.0, 1e-6]))
    max_r = torch.ones((), dtype=torch.float64)
    max_f = torch.ones((), dtype=torch.float64)
    for _ in range(3):
        n = int(rng.integers(0, 2 * capacity + 2))
        slots = torch.from_numpy(rng.integers(0, capacity, n))
        prio = torch.from_numpy(rng.normal(size=n) * rng.choice([0.1, 10.0])).float()
        live = torch.from_numpy(rng.random(n) > 0.25)
        prio[~live] = math.nan  # a dead entry's priority is never read
        max_r = ref.set_priorities(slots, prio, live, alpha, eps, max_r)
        max_f = fused.set_priorities(slots, prio, live, alpha, eps, max_f)
        assert float(max_f) == float(max_r)
        _assert_same_tree(ref, fused, leaf_rtol=1e-14)


@pytest.mark.usefixtures("flat_top")
def test_loaded_state_keeps_row_sums_sequential() -> None:
    rng = np.random.default_rng(11)
    ref, _ = _pair(5000, 7, _priorities(rng, 5000))
    fused = FusedSumTree(5000, arity=7)
    fused.load_state_dict(ref.state_dict())
    _assert_same_tree(ref, fused)
    targets = torch.from_numpy(rng.random(5000) * ref.total())
    assert torch.equal(fused.find(targets), ref.find(targets))


def test_single_item_and_empty_draws() -> None:
    fused = FusedSumTree(1)
    fused.update(torch.tensor([0]), torch.tensor([0.5], dtype=torch.float64))
    slots, weights = fused.sample_with_weights(5, 0.4)
    assert slots.tolist() == [0] * 5 and weights.tolist() == [1.0] * 5
    slots, weights = fused.sample_with_weights(0, 0.4)
    assert slots.shape == weights.shape == (0,)


def test_cpu_gets_the_fused_tree_other_devices_the_reference() -> None:
    assert type(make_sum_tree(100, "cpu")) is FusedSumTree
    assert type(make_sum_tree(100, torch.device("meta"))) is SumTree


def test_kernels_are_cached_and_compiled_once_for_every_call_of_a_buffer() -> None:
    """Construction warms every kernel; later calls (any priority dtype, dead entries, an empty update)
    reuse those signatures, so no user call pays a JIT compile."""
    schema = Schema([Column("obs", torch.float32, (3,))])
    buf = build_buffer(BufferConfig(capacity=300, sampler="prioritized", alpha=0.7, beta=0.5), schema)
    signatures = {k: list(k.signatures) for k in KERNELS}
    assert all(len(s) >= 1 for s in signatures.values())  # set_priorities: float32/64 (checked update)
    assert all(type(k._cache).__name__ != "NullCache" for k in KERNELS)  # cache=True: on disk
    buf.extend(ColumnBatch({"obs": torch.randn(300, 3)}))
    for dtype in (torch.float32, torch.float64, torch.float16):
        s = buf.sample(64)
        buf.update_priorities(s.slots, s.generations, torch.rand(64, dtype=dtype))
    buf.update_priorities(s.slots[:0], s.generations[:0], torch.rand(0))
    buf.extend(ColumnBatch({"obs": torch.randn(10, 3)}))  # overwritten slots: their updates are dead
    buf.update_priorities(s.slots, s.generations, torch.rand(64))
    buf.load_state_dict(buf.state_dict())
    assert {k: list(k.signatures) for k in KERNELS} == signatures
