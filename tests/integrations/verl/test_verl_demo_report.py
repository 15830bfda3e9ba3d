"""``benchmarks/verl_demo.py``'s reading of where the wall time went: per stage, conduit's seconds less
verl_sync_tuned's over the iterations both measured (rows as the benchmark writes them)."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
import verl_demo


def _row(system: str, iteration: int, **stages: float) -> dict:
    return {"system": system, "iteration": iteration, "stages": stages}


def test_stage_gaps_sum_common_iterations_and_rank_by_size() -> None:
    rows = [
        _row("verl_sync_tuned", 2, gen=4.0, old_log_prob=0.8, update_actor=11.0),
        _row("conduit", 2, gen=4.5, old_log_prob=1.6, update_actor=12.5),
        _row("verl_sync_tuned", 3, gen=4.0, old_log_prob=0.5, update_actor=7.0),
        _row("conduit", 3, gen=4.0, old_log_prob=1.4, update_actor=9.0, ref=0.01),
        _row("conduit", 4, gen=9.0, update_actor=50.0),  # sync has no iteration 4: not compared
    ]
    gaps = verl_demo.stage_gaps(rows)
    assert [k for k, _ in gaps] == ["update_actor", "old_log_prob", "gen"]  # ref's 0.01 s is under the floor
    assert dict(gaps) == pytest.approx({"update_actor": 3.5, "old_log_prob": 1.7, "gen": 0.5})
    assert verl_demo.stage_gaps([_row("conduit", 2, gen=1.0)]) == []


def test_paired_ratios_pair_the_same_iteration_of_both_systems() -> None:
    rows = [
        {"system": "verl_sync_tuned", "iteration": 2, "wall_s": 10.0},
        {"system": "conduit", "iteration": 2, "wall_s": 9.0},
        {"system": "verl_sync_tuned", "iteration": 3, "wall_s": 8.0},
        {"system": "conduit", "iteration": 3, "wall_s": 10.0},
        {"system": "conduit", "iteration": 4, "wall_s": 1.0},  # sync has no iteration 4: not paired
        {"system": "verl_sync_tuned", "iteration": 5, "wall_s": 0.0},  # nothing to divide by
        {"system": "conduit", "iteration": 5, "wall_s": 1.0},
    ]
    assert verl_demo.paired_ratios(rows, "wall_s") == pytest.approx([0.9, 1.25])
    assert verl_demo.paired_ratios(rows, "exposed_s") == []
