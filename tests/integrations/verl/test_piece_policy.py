"""The ``auto`` piece policy: the cost fit and the schedule it picks from group finish times."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from conduit_verl.piece_policy import HYSTERESIS, PiecePolicy, simulate  # noqa: E402


def test_simulate_replays_the_streaming_schedule() -> None:
    finish = [1.0, 2.0, 3.0, 4.0]
    # one piece: wait for all four, one call: 4 + (1 + 0.1 * 4)
    assert simulate(finish, 4, 1.0, 0.1, 1) == pytest.approx(5.4)
    # g=2: [1, 2] at 2 → 3.2, [3, 4] at 4 → 5.2; g=1: four pieces, each pays the fixed cost → 5.4
    assert simulate(finish, 2, 1.0, 0.1, 1) == pytest.approx(5.2)
    assert simulate(finish, 1, 1.0, 0.1, 1) == pytest.approx(5.4)
    # a slow fixed cost makes pieces pile up: after the first piece every finished group is taken
    assert simulate(finish, 1, 3.0, 0.1, 1) == pytest.approx(1 + 3.1 + 3.3)


def test_cost_fit_recovers_fixed_and_per_group_costs() -> None:
    policy = PiecePolicy("auto", groups=8, unit=1)
    for k in (1, 2, 4, 8):
        policy.record_piece(k, 0.2 + 0.05 * k)
    a, b = policy.cost()
    assert a == pytest.approx(0.2) and b == pytest.approx(0.05)


def test_auto_streams_when_groups_finish_spread_out_and_not_when_clustered() -> None:
    spread = PiecePolicy("auto", groups=8, unit=1)
    assert spread.g_ing() == 4  # before any measurement: two pieces
    for k in (2, 4):
        spread.record_piece(k, 0.05 + 0.01 * k)
    finish = [0.5 * i for i in range(1, 9)]  # one group every 0.5 s: cheap pieces keep up
    spread.record_step(finish)
    g = spread.g_ing()
    assert g < 8  # streams; its last piece ends about as early as with one group per piece
    a, b = spread.cost()
    assert simulate(finish, g, a, b, 1) <= simulate(finish, 1, a, b, 1) * (1 + HYSTERESIS)
    assert simulate(finish, g, a, b, 1) < simulate(finish, 8, a, b, 1)
    clustered = PiecePolicy("auto", groups=8, unit=1)
    for k in (2, 4):
        clustered.record_piece(k, 1.0 + 0.01 * k)  # a large fixed cost per piece
    clustered.record_step([4.0 + 0.001 * i for i in range(8)])  # all finish together
    assert clustered.g_ing() == 8  # one piece, like verl's whole-batch call


def test_fixed_setting_is_kept_and_units_respected() -> None:
    assert PiecePolicy(3, groups=9, unit=3).g_ing() == 3
    assert PiecePolicy(0, groups=9, unit=3).g_ing() == 9  # 0 = whole batch
    auto = PiecePolicy("auto", groups=12, unit=4)
    assert auto.g_ing() == 8  # half of 12 = 6, rounded up to whole units of 4
    auto.record_piece(4, 0.1)
    auto.record_step([1.0 * i for i in range(1, 13)])
    assert auto.g_ing() % 4 == 0


def _run_steps(policy: PiecePolicy, seconds: dict[str, float], steps: int) -> list[int]:
    """Drive ``begin_step`` with iterations that take ``seconds[arm]``; the ``g_ing`` of each step."""
    now, chosen = 0.0, []
    for _ in range(steps):
        chosen.append(policy.begin_step(now))
        now += seconds[policy.arm]
    return chosen


def test_auto_measures_both_schedules_then_keeps_the_faster() -> None:
    policy = PiecePolicy("auto", groups=4, unit=1)
    chosen = _run_steps(policy, {"stream": 1.2, "whole": 1.0}, 20)
    assert chosen[:2] == [2, 2]  # warm-up, then the first probe of the streaming schedule
    assert sorted(chosen[1:7]) == [2, 2, 2, 4, 4, 4]  # three probes of each
    # then the faster (one whole-batch piece), re-probing the other every 10th step
    assert chosen[7:] == [2 if step % 10 == 0 else 4 for step in range(8, 21)]
    faster_stream = PiecePolicy("auto", groups=4, unit=1)
    assert _run_steps(faster_stream, {"stream": 0.8, "whole": 1.0}, 20)[7:] == [
        4 if step % 10 == 0 else 2 for step in range(8, 21)
    ]
    fixed = PiecePolicy(1, groups=4, unit=1)
    assert set(_run_steps(fixed, {"stream": 5.0, "whole": 1.0}, 12)) == {1}  # a fixed g_ing never changes


def test_the_policy_fit_is_the_core_cost_model() -> None:
    from conduit.costmodel import OperatorCost, Sample

    policy = PiecePolicy("auto", groups=8, unit=1)
    pieces = [(1, 0.31), (2, 0.33), (4, 0.46), (8, 0.62)]  # noisy: not on one line
    for k, s in pieces:
        policy.record_piece(k, s)
    core = OperatorCost.fit([Sample(1, k, 0, s) for k, s in pieces])
    assert policy.cost() == pytest.approx((core.a, core.b))
    assert simulate([1.0, 2.0], 1, core.a, core.b, 1) == pytest.approx(2.0 + core.a + core.b)
