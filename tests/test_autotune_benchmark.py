"""The core autotune benchmark's measuring parts: the half-vs-half noise ceiling and the tuner's probes
(each candidate's ``Conduit`` built once and kept open between its probes)."""

from __future__ import annotations

import pytest
from autotune_loop import PROBE_ITERS, PROBE_WARMUP, Probes, SyntheticLoop
from autotune_rank import ranking, split_halves

from conduit.costmodel import Knobs
from conduit.errors import ClosedError


def test_split_halves_compares_the_even_rounds_with_the_odd() -> None:
    agree = [[1.0, 2.0, 3.0], [1.1, 2.1, 3.1], [0.9, 1.9, 2.9], [1.0, 2.0, 3.0]]
    assert split_halves(agree) == pytest.approx(1.0)
    # the even rounds rank the configurations one way, the odd ones the other way
    disagree = [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]
    assert split_halves(disagree) == pytest.approx(-1.0)
    assert split_halves([[1.0, 2.0, 3.0]]) is None


def test_ranking_names_the_best_the_models_best_and_the_agreement() -> None:
    rounds = [[3.0, 1.0, 2.0, 4.0], [3.1, 1.1, 2.2, 4.1]]
    measured = [3.05, 1.05, 2.1, 4.05]
    r = ranking(["a", "b", "c", "d"], measured, [1.0, 2.0, 3.0, 4.0], rounds, top=2)
    assert r["best_measured"] == {"config": "b", "seconds": 1.05}
    assert r["predicted_best"] == {"config": "a", "measured_seconds": 3.05}
    assert r["top2_overlap"] == 1 and not r["top2_same_set"] and not r["top2_same_order"]  # {b, c} vs {a, b}
    assert r["kendall_tau_between_rounds"] == pytest.approx(1.0)
    assert r["kendall_tau"] == pytest.approx(1 / 3)  # 4 of the 6 pairs in the same order


def test_probes_build_each_candidate_once_and_count_every_iteration() -> None:
    loop = SyntheticLoop(8, 8, "cpu")
    probes = Probes(loop)
    sync, overlap = Knobs("sync", g_del=2), Knobs("async", 2, 1, 1)
    try:
        seconds = [probes(sync), probes(overlap), probes(sync)]
        assert all(s > 0 for s in seconds)
        assert set(probes.open) == {sync, overlap}
        conduit = probes.open[sync]
        probes(sync)
        assert probes.open[sync] is conduit  # reused, not rebuilt
        # warm-up only on a candidate's first probe
        assert probes.iterations == 2 * (PROBE_ITERS + PROBE_WARMUP) + 2 * PROBE_ITERS
    finally:
        probes.close()
    assert probes.open == {}
    with pytest.raises(ClosedError):
        conduit.put(loop.produce())
