"""Rules of the verl auto-tuner benchmark (``benchmarks/autotune_verl.py``): ``auto``'s gap to the best
fixed ``g`` is a share of the part the tuner controls (``rest``) beside its share of the iteration, and
both are measured on the same steps as the grid's."""

from __future__ import annotations

import pytest
from autotune_verl_analysis import gaps, grid_view, same_steps, targets


def _view(rests: dict[int, tuple[int, float]], wall: float = 12.0) -> dict:
    """A grid view whose step ``s`` ran ``g`` with ``rest`` (``rests[s] = (g, rest)``), no generation."""
    rows = [{"iteration": s, "wall_s": wall, "exposed_s": 0.0} for s in rests]
    trace = {s: {"g": g, "tail": 0.1} for s, (g, _) in rests.items()}
    for row, (_, rest) in zip(rows, rests.values(), strict=True):
        row["stages"] = {"update_actor": wall - rest}
    return grid_view(rows, trace, sorted({g for g, _ in rests.values()}), {}, scale=1.0)


def test_the_gap_is_a_share_of_the_tuned_part_beside_the_share_of_the_iteration() -> None:
    # the committed run at 64 tokens: best rest 0.70 s, auto 1.11 s, a 12.8 s iteration
    out = gaps(1.11, 0.70, 12.8)
    assert out["tuned"] == pytest.approx(0.41 / 0.70)  # +59 %: what the tuner controls
    assert out["iteration"] == pytest.approx(0.41 / 12.8)  # +3.2 %: end to end
    met = targets(0.9, out["tuned"], out["iteration"])
    assert met == {
        "tau_tail>=0.8": True,
        "auto_within_10%_of_tuned": False,
        "auto_within_5%_of_iteration": True,
    }
    assert targets(0.9, 0.09, 0.01)["auto_within_10%_of_tuned"]
    assert gaps(1.0, None, 12.8) == {"tuned": None, "iteration": None}


def test_auto_is_compared_on_the_grid_s_steps_only() -> None:
    # grid steps 4..9: g 1 and 2 alternate, g = 2 the better by 0.2 s
    view = _view({s: (1 + s % 2, 1.0 if s % 2 else 1.2) for s in range(4, 10)})
    # auto's early steps (2, 3: before the grid measured) are cheap; on the grid's steps it is 1.3 s
    rests = {2: 0.5, 3: 0.5, 4: 1.3, 5: 1.3, 6: 1.3, 7: 1.3, 8: 1.3, 9: 1.3, 10: 0.5}
    out = same_steps(view, rests)
    assert out["auto_steps_compared"] == [4, 5, 6, 7, 8, 9]
    assert out["auto_rest_s"] == pytest.approx(1.3)  # not the median of all its steps (1.3 vs 0.5s)
    assert out["auto_best_g"] == 2 and out["auto_best_rest_s"] == pytest.approx(1.0)
    assert out["auto_gap_tuned"] == pytest.approx(0.3)
    assert out["auto_gap_iteration"] == pytest.approx(0.3 / 12.0)
    assert out["auto_rank"] == 3 and out["auto_rank_among"] == 2


def test_a_shorter_auto_run_compares_each_g_on_the_steps_both_measured() -> None:
    # g = 1 was best on steps 4, 6 but ran badly on step 8, which auto did not reach
    view = _view({4: (1, 1.0), 5: (2, 1.1), 6: (1, 1.0), 7: (2, 1.1), 8: (1, 5.0), 9: (2, 1.1)})
    out = same_steps(view, {4: 1.05, 5: 1.05, 6: 1.05})
    assert out["auto_steps_compared"] == [4, 5, 6]
    assert out["auto_best_g"] == 1 and out["auto_best_rest_s"] == pytest.approx(1.0)
    assert out["auto_rank"] == 2
    assert same_steps(view, {2: 1.0, 3: 1.0})["auto_rest_s"] is None  # no step in common: no gap
