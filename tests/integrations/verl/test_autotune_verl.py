"""The verl autotune benchmark's parts: the harness's per-step ``g`` schedule and piece trace
(``conduit_verl_cpu/piece_trace.py``) on the real piece policy, and the analysis (τ, picks, gaps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from autotune_verl import SETTLE, schedule
from autotune_verl_analysis import (
    evaluate,
    grid_view,
    read_trace,
    recorded,
    repeatability,
    replay,
)
from conduit_verl_cpu import piece_trace

from conduit.costmodel import CostWindow
from conduit.errors import ConfigError
from conduit.piece_policy import PiecePolicy


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``PiecePolicy`` wrapped by the harness for this test only (its methods restored after)."""
    for name in ("piece_groups", "begin_step", "record_piece", "record_step"):
        monkeypatch.setattr(PiecePolicy, name, getattr(PiecePolicy, name))
    monkeypatch.setattr(PiecePolicy, "_conduit_traced", False, raising=False)
    path = tmp_path / "pieces.jsonl"
    monkeypatch.setenv(piece_trace.TRACE_ENV, str(path))
    monkeypatch.setenv(piece_trace.SCHEDULE_ENV, "4,4,1,0,2")
    piece_trace.install()
    return path


def _step(policy: PiecePolicy, t0: float, finish: list[float], tokens: float = 100.0) -> int:
    """One step: pieces of ``g`` groups as they finish, each 0.1 s + 1 ms per token."""
    g = policy.begin_step(t0)
    taken = 0
    while taken < policy.groups:
        k = min(g, policy.groups - taken)
        last = taken + k >= policy.groups
        policy.record_piece(k, 0.1 + 0.001 * tokens * k, overlapped=not last, work=[tokens] * k)
        taken += k
    policy.record_step(finish, ended=max(finish) + 0.5)
    return g


def test_schedule_drives_the_pieces_and_the_trace_predicts_from_earlier_steps_only(traced: Path) -> None:
    policy = PiecePolicy("auto", groups=8, unit=1)
    finish = [0.5 * (i + 1) for i in range(8)]
    ran = [_step(policy, 10.0 * s, finish) for s in range(5)]
    assert ran == [4, 4, 1, 8, 2]  # 0 = the whole step; the last value repeats
    lines = [json.loads(x) for x in traced.read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    assert lines[0]["fit_before"] is None and lines[1]["fit_before"] is None  # warm-up is never recorded
    assert lines[2]["fit_before"] is not None and lines[2]["predicted_tail"] is not None
    assert set(lines[2]["predicted_tail"]) == {str(g) for g in range(1, 9)}
    assert lines[3]["tail"] == pytest.approx(0.5)
    assert [len(line["pieces"]) for line in lines] == [2, 2, 8, 1, 4]
    # the fit before step 3 saw step 2's two pieces only, not step 3's eight
    window = CostWindow(32)
    window.record(1, 4.0, 0.5, nbytes=400.0, slowed=True)
    window.record(1, 4.0, 0.5, nbytes=400.0, slowed=False)
    cost, k = window.fit_slowed()
    want = {"a": cost.a, "b": cost.b, "per_token": cost.per_byte, "contention": k}
    assert lines[2]["fit_before"] == pytest.approx(want)
    assert lines[3]["fit_before"] != lines[2]["fit_before"]
    tails = piece_trace.predicted_tails(policy, finish, [100.0] * 8, (cost.a, cost.b, cost.per_byte, k))
    assert lines[2]["predicted_tail"] == pytest.approx({str(g): t for g, t in tails.items()})
    # the benchmark's offline replay of the recorded pieces with this code gives the same predictions
    trace = read_trace(traced.parent)
    again = replay(trace, groups=8)
    assert set(again) == set(recorded(trace)) == {3, 4, 5}
    for step, preds in recorded(trace).items():
        assert again[step] == pytest.approx(preds)


def test_schedule_values_are_checked() -> None:
    with pytest.raises(ConfigError, match="whole numbers"):
        piece_trace.g_schedule("4,x")
    with pytest.raises(ConfigError, match="whole numbers"):
        piece_trace.g_schedule("-1")
    with pytest.raises(ConfigError, match="step 2 asks for pieces of 3 groups"):
        piece_trace.scheduled_g([4, 3], 2, groups=16, unit=2)
    with pytest.raises(ConfigError, match="a step has 16"):
        piece_trace.scheduled_g([32], 1, groups=16, unit=1)
    assert piece_trace.scheduled_g([4, 0], 9, groups=16, unit=2) == 16


def test_grid_schedule_repeats_every_g_in_new_orders() -> None:
    plan = schedule([1, 2, 4, 16], reps=3, seed=0)
    assert tuple(plan[: len(SETTLE)]) == SETTLE
    body = plan[len(SETTLE) :]
    reps = [body[i : i + 4] for i in range(0, 12, 4)]
    assert all(sorted(r) == [1, 2, 4, 16] for r in reps)
    assert len({tuple(r) for r in reps}) > 1


def _trace_and_rows(tails: dict[int, list[float]], preds: dict[int, float]) -> tuple[list, dict]:
    rows, trace, step = [], {}, 4
    for rep in range(max(len(v) for v in tails.values())):
        for g, ts in tails.items():
            if rep >= len(ts):
                continue
            trace[step] = {"step": step, "g": g, "tail": ts[rep], "predicted_tail": {str(g): preds[g]}}
            # generation differs by step (3 s + 0.5 s per step, x scale 2): the rest is 4 + tail
            # and the update 1 s + 0.1 s per step
            row = {"iteration": step, "wall_s": 11.0 + 1.1 * step + ts[rep], "exposed_s": ts[rep]}
            rows.append(
                {**row, "model_gen_s": 3.0 + 0.5 * step, "stages": {"update_actor": 1.0 + 0.1 * step}}
            )
            step += 1
    return rows, trace


def test_evaluation_ranks_and_gaps() -> None:
    tails = {1: [1.0, 1.1], 2: [0.6, 0.7], 4: [0.5, 0.4], 16: [2.0, 2.2]}
    preds = {1: 0.9, 2: 0.55, 4: 0.6, 16: 2.1}  # swaps 2 and 4
    rows, trace = _trace_and_rows(tails, preds)
    view = grid_view(rows, trace, [1, 2, 4, 16], recorded(trace), scale=2.0)
    assert view["medians"]["4"]["tail"] == pytest.approx(0.45)
    assert view["medians"]["4"]["rest"] == pytest.approx(4.45)  # not the wall: its steps differ
    iteration = view["median_wall_s"]
    # auto's steps 3..5: step 3 is not a grid step (settling there), so auto is compared on 4 and 5
    auto_rows = [
        {"iteration": i, "wall_s": w, "model_gen_s": 3.0} for i, w in ((3, 10.0), (4, 10.6), (5, 12.0))
    ]
    auto_trace = {3: {"g": 4, "arm": "stream"}, 4: {"g": 4, "arm": "stream"}, 5: {"g": 16, "arm": "whole"}}
    ev = evaluate(view, auto_rows, auto_trace, scale=2.0)
    assert ev["tau_tail"] == pytest.approx(4 / 6)  # 5 of 6 pairs agree
    assert ev["best_g"] == 4 and ev["model_pick"] == 2
    assert ev["model_pick_gap_tuned"] == pytest.approx((4.65 - 4.45) / 4.45)
    assert ev["model_pick_gap_iteration"] == pytest.approx((4.65 - 4.45) / iteration)
    assert ev["top3_overlap"] == 3
    # grid steps 4 and 5 ran g = 1 and 2 (rest 5.0 and 4.6); auto's rest there: 4.6 and 6.0
    assert ev["auto_steps_compared"] == [4, 5]
    assert ev["auto_best_g"] == 2 and ev["auto_rest_s"] == pytest.approx(5.3)
    assert ev["auto_gap_tuned"] == pytest.approx((5.3 - 4.6) / 4.6)
    assert ev["auto_gap_iteration"] == pytest.approx((5.3 - 4.6) / iteration)
    assert ev["auto_rank"] == 3 and ev["auto_rank_among"] == 2
    assert ev["auto_probes"] == 1 and ev["auto_g"] == [4, 4, 16]
    assert ev["auto_probe_share"] == pytest.approx((6.0 - 4.3) / 32.6)  # all its steps
    assert ev["targets"] == {
        "tau_tail>=0.8": False,
        "auto_within_10%_of_tuned": False,
        "auto_within_5%_of_iteration": True,
    }


def test_repeatability_needs_two_repetitions_of_three_g() -> None:
    per_g = {"1": {"tail": [1.0, 1.2]}, "2": {"tail": [0.5, 0.6]}, "4": {"tail": [0.7]}}
    assert repeatability(per_g, "tail") is None
    per_g["4"]["tail"].append(0.4)
    assert repeatability(per_g, "tail") == pytest.approx(1 / 3)  # 4's second run swaps with 2
