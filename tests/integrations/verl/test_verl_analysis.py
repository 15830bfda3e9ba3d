"""The verl benchmark's analysis: where conduit's exposed time went (``exposed_profile``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_analysis import exposed_profile, rows_for_run


def _write_run(work: Path, steps: list[dict[str, float]]) -> None:
    """A run's ``metrics.jsonl`` and generation log: step ``s`` generated from t=10s to t=10s+4."""
    metrics, events = [], []
    for step, m in enumerate(steps, start=1):
        data = {"timing_s/step": 9.0, "timing_s/gen": 4.3, "timing_s/old_log_prob": 0.6, "timing_s/ref": 0.5}
        data.update(m)
        metrics.append(json.dumps({"step": step, "data": data}))
        events.append(json.dumps({"version": step, "t0": 10.0 * step, "t1": 10.0 * step + 4.0, "length": 5}))
    work.mkdir()
    (work / "metrics.jsonl").write_text("\n".join(metrics))
    (work / "gen_events.jsonl").write_text("\n".join(events))


def test_profile_splits_exposed_time_into_wait_last_piece_delivery_and_probes(tmp_path: Path) -> None:
    streamed = {
        "conduit/streamed": 1.0,
        "conduit/pieces": 5.0,
        "conduit/exposed_s": 0.35,
        "conduit/op/ingest_tail_s": 0.34,
        "conduit/op/deliver_s": 0.01,
        "conduit/policy/contention": 1.1,
    }
    whole = {
        "conduit/streamed": 0.0,
        "conduit/pieces": 1.0,
        "conduit/exposed_s": 1.2,
        "conduit/op/ingest_tail_s": 1.19,
        "conduit/op/deliver_s": 0.01,
    }
    _write_run(tmp_path / "run", [streamed, streamed, whole, streamed, streamed])
    rows = rows_for_run(tmp_path / "run", "grpo", "conduit", 1, {})
    assert len(rows) == 4 and all(r["conduit"]["deliver_s"] == 0.01 for r in rows)
    profile = exposed_profile(rows, "conduit")
    assert profile["whole_batch_iterations"] == 1
    assert profile["exposed_s_whole_batch"] == pytest.approx(0.3 + 1.2)  # gen 4.3 - busy 4.0, + ingestion
    assert profile["exposed_s_streamed"] == pytest.approx(0.3 + 0.35)
    assert profile["gen_wait_exposed_s"] == pytest.approx(0.3)
    assert profile["last_piece_s"] == pytest.approx(0.34)
    assert profile["pieces_streamed"] == 5.0 and profile["contention_last"] == 1.1
    assert exposed_profile(rows_for_run(tmp_path / "run", "grpo", "verl_sync", 1, {}), "verl_sync") == {}


def test_losses_are_equal_only_to_a_loss_the_baseline_itself_produced() -> None:
    from verl_analysis import baseline_repeats, losses_equal

    def row(system: str, rnd: int, it: int, loss: float) -> dict[str, object]:
        return {"system": system, "round": rnd, "iteration": it, "actor_loss": loss}

    # verl's two rounds differ at iteration 2 (0.5 vs 0.6): either value is verl's own outcome
    base = [row("v", 0, 1, 0.1), row("v", 0, 2, 0.5), row("v", 1, 1, 0.1), row("v", 1, 2, 0.6)]
    assert baseline_repeats(base, "v") == {"iterations_repeated": 2, "iterations_differing": 1}
    assert losses_equal([*base, row("c", 0, 1, 0.1), row("c", 0, 2, 0.5), row("c", 1, 2, 0.6)], "c", "v")
    # a value verl never produced there is a difference, in any round
    assert not losses_equal([*base, row("c", 0, 1, 0.1), row("c", 1, 2, 0.55)], "c", "v")
    assert not losses_equal([*base, row("c", 1, 1, 0.5)], "c", "v")  # 0.5 was verl's at iteration 2, not 1
    assert losses_equal([*base, row("c", 0, 9, 0.1)], "c", "v") is None  # no common iteration


def test_ppo_is_judged_by_the_critic_loss_too() -> None:
    """PPO's actor loss is ~1e-8 and equal to anything within the absolute tolerance; the critic's
    loss tells runs apart."""
    from verl_analysis import losses_equal, ratios

    def row(system: str, loss: float, critic: float) -> dict[str, object]:
        work = {"responses": 8, "response_tokens": 80}
        return {
            "system": system,
            "round": 0,
            "iteration": 2,
            "actor_loss": loss,
            "critic_loss": critic,
            "wall_s": 1.0,
            "exposed_s": 0.5,
            "work": work,
        }

    rows = [row("verl_sync_tuned", 2e-8, 0.31), row("conduit", -5e-8, 0.47)]
    assert losses_equal(rows, "conduit", "verl_sync_tuned") is True  # vacuous for PPO
    assert losses_equal(rows, "conduit", "verl_sync_tuned", key="critic_loss") is False
    found = ratios(rows, ["verl_sync_tuned"])
    assert found["critic_losses_equal/conduit_vs_verl_sync_tuned"] is False


def _timed(system: str, it: int, wall: float, rnd: int = 0) -> dict[str, object]:
    return {
        "system": system,
        "round": rnd,
        "iteration": it,
        "actor_loss": 0.1 * it,
        "wall_s": wall,
        "exposed_s": wall / 10,
        "work": {"responses": 128, "response_tokens": 1000 + it},
        "stages": {"update_actor": 2.0},
    }


def test_every_system_is_measured_over_the_same_iterations() -> None:
    """The steady ratio takes both systems' iterations from 8 on, and the targets use the ratio over
    all measured iterations of both: never conduit's late iterations against all of verl's."""
    from verl_analysis import ratios, targets

    STEADY_FROM = 8  # conduit's piece_groups=auto measures its options before this iteration
    # both systems slow in their first iterations (start-up, auto's measurement), fast later
    rows = [_timed("verl_sync_tuned", it, 12.0 if it < STEADY_FROM else 10.0) for it in range(2, 12)]
    rows += [_timed("conduit", it, 11.0 if it < STEADY_FROM else 9.0) for it in range(2, 12)]
    found = ratios(rows, ["verl_sync_tuned"], steady_from=STEADY_FROM)
    assert found["wall/conduit_steady_over_verl_sync_tuned"] == pytest.approx(9.0 / 10.0)  # not 9 / 12
    assert found["wall/conduit_over_verl_sync_tuned"] == pytest.approx(11.0 / 12.0, abs=1e-3)  # 6 of 10 slow
    t = targets(found, {})
    assert t["ratios_used"] == "conduit_over_verl_sync_tuned"
    rows = [r for r in rows if not (r["system"] == "conduit" and r["iteration"] >= STEADY_FROM)]
    rows += [_timed("conduit", it, 8.4) for it in range(STEADY_FROM, 12)]
    found = ratios(rows, ["verl_sync_tuned"], steady_from=STEADY_FROM)
    assert found["wall/conduit_steady_over_verl_sync_tuned"] == pytest.approx(0.84)
    assert targets(found, {})["wall<=0.85x"] is False  # steady 0.84 meets it, all iterations do not


def test_the_control_separates_the_backend_from_the_trainer_mode() -> None:
    from verl_analysis import ratios, targets

    rows = [_timed("verl_sync_tuned", it, 10.0) for it in range(2, 6)]
    rows += [_timed("verl_sync_tuned+tq_conduit", it, 9.5) for it in range(2, 6)]
    rows += [_timed("conduit", it, 8.55) for it in range(2, 6)]
    found = ratios(rows, ["verl_sync_tuned", "verl_sync_tuned+tq_conduit"])
    assert found["backend/wall/verl_sync_tuned+tq_conduit_over_verl_sync_tuned"] == pytest.approx(0.95)
    assert found["wall/conduit_over_verl_sync_tuned+tq_conduit"] == pytest.approx(0.9)
    assert targets(found, {})["vs_control"]["wall"] == pytest.approx(0.9)
    assert found["median_update_actor_s/conduit"] == 2.0
    # unequal work: no backend ratio, the reason instead
    rows[4]["work"] = {"responses": 128, "response_tokens": 7}
    found = ratios(rows, ["verl_sync_tuned", "verl_sync_tuned+tq_conduit"])
    assert "backend/wall/verl_sync_tuned+tq_conduit_over_verl_sync_tuned" not in found
    assert "refused/backend/verl_sync_tuned+tq_conduit_over_verl_sync_tuned" in found


def test_a_trainer_running_ahead_is_not_judged_by_its_last_versions_cut_generation() -> None:
    from verl_analysis import ratios

    rows = [_timed("verl_colocate_async", it, 10.0) for it in range(2, 6)]
    rows += [_timed("verl_colocate_async+tq_conduit", it, 9.0) for it in range(2, 6)]
    rows[-1]["work"] = {"responses": 112, "response_tokens": 7}  # the last version, cut by the run's end
    found = ratios(rows, [])
    assert found["backend/wall/verl_colocate_async+tq_conduit_over_verl_colocate_async"] == pytest.approx(0.9)
    rows[-2]["work"] = {"responses": 127, "response_tokens": 7}  # an earlier iteration: refused
    found = ratios(rows, [])
    assert "iteration 4" in found["refused/backend/verl_colocate_async+tq_conduit_over_verl_colocate_async"]
    # a sync trainer finishes every version inside its step: its last iteration counts
    sync = [_timed("verl_sync_tuned", it, 10.0) for it in range(2, 6)]
    sync += [_timed("verl_sync_tuned+tq_conduit", it, 9.0) for it in range(2, 6)]
    sync[-1]["work"] = {"responses": 112, "response_tokens": 7}
    assert "refused/backend/verl_sync_tuned+tq_conduit_over_verl_sync_tuned" in ratios(sync, [])


def test_the_baseline_gets_the_best_period_of_the_sweep() -> None:
    from verl_analysis import choose_poll

    noisy = {0.5: [16.0, 16.5, 17.5], 0.1: [18.0, 17.0, 17.4], 0.01: [16.8, 17.6, 16.2]}
    chosen, info = choose_poll(noisy)
    # the lowest median (16.5), not the smallest period within 3% of it (0.01 at 16.8: the old rule)
    assert chosen == 0.5 and info["chosen"] == 0.5
    assert info["resolved"] is False  # medians 0.3 apart, steps 0.5 around them: not ordered
    clear = {0.5: [17.0, 17.1, 16.9], 0.05: [15.0, 15.1, 14.9]}
    chosen, info = choose_poll(clear)
    assert chosen == 0.05 and info["resolved"] is True and info["gap_to_next_best_s"] == pytest.approx(2.0)


def test_rounds_alternate_the_sides_and_reverse() -> None:
    import verl_runs

    systems = ["verl_sync", "verl_sync_tuned", "verl_sync_tuned+tq_conduit", "conduit", "conduit_stream"]
    r0, r1 = verl_runs.round_order(systems, 0), verl_runs.round_order(systems, 1)
    assert r0 == ["verl_sync", "conduit", "verl_sync_tuned", "conduit_stream", "verl_sync_tuned+tq_conduit"]
    assert r1 == r0[::-1] and verl_runs.round_order(systems, 2) == r0
    mean = {s: (r0.index(s) + r1.index(s)) / 2 for s in systems}
    assert set(mean.values()) == {2.0}  # over two rounds every system sits in the middle on average
