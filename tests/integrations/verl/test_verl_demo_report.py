"""``benchmarks/verl_demo.py``'s pure parts: where the wall time went (per stage, conduit's seconds less
verl_sync_tuned's over the iterations both measured), the live lines tailed from a run's metrics.jsonl,
the staleness each system had, and the ratios it shows or refuses (rows as the benchmark writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("verl")
import verl_demo  # noqa: E402
import verl_staleness  # noqa: E402
from verl_plots import rollout_title  # noqa: E402
from verl_runs import round_order  # noqa: E402


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


# --- the live progress lines: tailing a run's metrics.jsonl while it is written ---------------------------


def _rec(step: int, **data: float) -> bytes:
    return (json.dumps({"step": step, "data": data}) + "\n").encode()


def test_complete_lines_keep_an_unended_line_for_later() -> None:
    assert verl_demo.complete_lines(b'{"a": 1}\n\n{"b"') == ([b'{"a": 1}'], b'{"b"')
    assert verl_demo.complete_lines(b"") == ([], b"")


def test_metrics_tail_reads_each_record_once_as_it_lands(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    tail = verl_demo.MetricsTail(path)
    assert tail.read() == []  # the run has not started: no file, no error
    path.parent.mkdir()
    first = _rec(1, **{"timing_s/step": 9.0})
    path.write_bytes(first[:10])  # the logger is half-way through the line
    assert tail.read() == []
    path.write_bytes(first + b"not json\n" + _rec(2, **{"timing_s/step": 5.0})[:-1])
    assert [r["step"] for r in tail.read()] == [1]  # the torn line is skipped, step 2 not ended yet
    with path.open("ab") as f:
        f.write(b"\n")
    assert [r["step"] for r in tail.read()] == [2]
    assert tail.read() == []  # nothing new: nothing twice
    path.write_bytes(_rec(1, **{"timing_s/step": 7.0}))  # the run started again in its dir
    assert [r["data"]["timing_s/step"] for r in tail.read()] == [7.0]


def test_progress_line_names_the_system_iteration_and_timers() -> None:
    rec = {
        "step": 3,
        "data": {
            "timing_s/step": 10.256,
            "timing_s/gen": 4.5,
            "timing_s/update_actor": 2.0,
            "conduit/staleness/max": 1.0,
            "training/off_policy/trajectory_staleness_worst/max": 7.0,  # Conduit's own metric wins
            "actor/pg_loss": 0.0125,
        },
    }
    line = verl_demo.progress_line("conduit_k1", rec)
    assert line == (
        "[demo] conduit_k1 iter 3: wall 10.26 s, gen 4.50 s, update_actor 2.00 s, staleness max 1, loss 0.0125"
    )
    verl = {"step": 1, "data": {"training/off_policy/trajectory_staleness_worst/max": 1}}
    assert verl_demo.progress_line("v", verl) == "[demo] v iter 1 (warm-up): staleness max 1"
    assert verl_demo.progress_line("v", {"step": 2, "data": "?"}) == "[demo] v iter 2: no timings"


def test_progress_prints_each_runs_iterations_and_skips_runs_not_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_bytes(_rec(1, **{"timing_s/step": 1.0}))
    progress = verl_demo.Progress({"sys_a": tmp_path / "a", "sys_b": tmp_path / "b"})
    assert progress.flush() == ["[demo] sys_a iter 1 (warm-up): wall 1.00 s"]
    assert progress.flush() == []
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.jsonl").write_bytes(_rec(1) + _rec(2, **{"timing_s/gen": 2.0}))
    progress.stop()  # never started: stop still reads what landed
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "[demo] sys_b iter 1 (warm-up): no timings",
        "[demo] sys_b iter 2: gen 2.00 s",
    ]


# --- the staleness each system had, and the ratios the demo allows ----------------------------------------


def _summary(system: str, med: float | None, top: float | None, source: str) -> dict:
    return {
        "system": system,
        "staleness_median": med,
        "staleness_median_of_step_means": med,
        "staleness_max": top,
        "staleness_source": source,
    }


def test_staleness_text_on_policy_measured_and_over_the_bound() -> None:
    assert verl_demo.staleness_text("verl_sync_tuned", None) == "0 (on-policy)"
    conduit = _summary("conduit", 0.0, 0.0, "conduit_metrics")
    assert verl_demo.staleness_text("conduit", conduit) == "0 (on-policy; measured max 0, conduit_metrics)"
    k1 = _summary("conduit_k1", 1.0, 1.0, "group_log (every trained group)")
    assert verl_demo.staleness_text("conduit_k1", k1) == (
        "median 1, max 1 (bound 1; group_log (every trained group))"
    )
    verl = _summary("verl_separate_async_k1", 0.5, 2.0, "verl_step_mean")
    assert verl_demo.staleness_text("verl_separate_async_k1", verl).endswith("OVER ITS BOUND")
    assert verl_demo.staleness_text("verl_separate_async_k1", None) == "not measured (bound 1)"
    stale_sync = _summary("verl_sync_tuned", 1.0, 1.0, "verl_step_mean")  # a sync run that lagged is shown
    assert verl_demo.staleness_text("verl_sync_tuned", stale_sync).startswith("median 1, max 1 (bound 0")


def _iter(system: str, it: int, wall: float, responses: int, tokens: int) -> dict:
    return {
        "system": system,
        "iteration": it,
        "wall_s": wall,
        "exposed_s": wall / 10,
        "work": {"responses": responses, "response_tokens": tokens},
    }


def _pair_rows(a: str, b: str, tokens_a: list[int], tokens_b: list[int]) -> list[dict]:
    rows = [_iter(a, 2 + i, 8.0, 16, t) for i, t in enumerate(tokens_a)]
    return rows + [_iter(b, 2 + i, 10.0, 16, t) for i, t in enumerate(tokens_b)]


def _all_summaries(k1_max: float = 1.0) -> list[dict]:
    return [
        _summary("conduit", 0.0, 0.0, "conduit_metrics"),
        _summary("verl_sync_tuned", 0.0, 0.0, "verl_step_mean"),
        _summary("conduit_k1", 1.0, k1_max, "group_log (every trained group)"),
        _summary("verl_separate_async_k1", 1.0, 1.0, "verl_step_mean"),
    ]


def test_demo_ratios_shown_where_the_work_agrees_within_5_percent() -> None:
    rows = _pair_rows("conduit", "verl_sync_tuned", [1000, 1000, 1000], [1000, 1000, 1040])  # 1.3% apart
    rows += _pair_rows("conduit_k1", "verl_separate_async_k1", [900, 900, 50], [900, 900, 2000])
    found = verl_demo.demo_ratios(rows, _all_summaries())
    assert found["wall/conduit_over_verl_sync_tuned"] == 0.8
    assert found["exposed/conduit_over_verl_sync_tuned"] == 0.8
    # the k = 1 pair generates ahead: its last iteration's count is open, so not compared
    assert found["work/conduit_k1_vs_verl_separate_async_k1"]["iterations"] == [2, 3]
    assert found["wall/conduit_k1_over_verl_separate_async_k1"] == 0.8
    line = verl_demo.ratio_line(rows, found, "conduit", "verl_sync_tuned")
    assert line.startswith("conduit ÷ verl_sync_tuned: wall 0.800 (iteration by iteration 0.800-0.800)")
    assert "response_tokens 3000 vs 3040" in line


def test_demo_ratios_refused_where_the_work_differs_by_more_than_5_percent() -> None:
    rows = _pair_rows("conduit", "verl_sync_tuned", [1000, 1000, 1000], [1000, 1000, 1200])  # 6.25% apart
    rows += _pair_rows("conduit_k1", "verl_separate_async_k1", [900, 900, 900], [900, 900, 900])
    found = verl_demo.demo_ratios(rows, _all_summaries())
    assert "wall/conduit_over_verl_sync_tuned" not in found
    assert found["refused/conduit_over_verl_sync_tuned"].startswith("work differs: response_tokens")
    line = verl_demo.ratio_line(rows, found, "conduit", "verl_sync_tuned")
    assert "no ratio (work differs" in line and "wall" not in line
    # what can be compared instead: the medians of wall per trained token, 8 s / 1000 over 10 s / 1000
    assert found["s_per_token/conduit_over_verl_sync_tuned"] == 0.8
    assert "seconds per trained response token 0.800" in line
    assert found["wall/conduit_k1_over_verl_separate_async_k1"] == 0.8  # the other pair is unaffected


def test_demo_ratios_refused_where_conduit_trained_staler_data() -> None:
    rows = _pair_rows("conduit_k1", "verl_separate_async_k1", [900, 900, 900], [900, 900, 900])
    found = verl_demo.demo_ratios(rows, _all_summaries(k1_max=2.0))
    assert "staleness differs" in found["refused/conduit_k1_over_verl_separate_async_k1"]
    assert "no measured iteration" in found["refused/conduit_over_verl_sync_tuned"]
    assert "wall" not in verl_demo.ratio_line(rows, found, "conduit_k1", "verl_separate_async_k1")


# --- what the demo runs, and how its figure names the rollout ---------------------------------------------


def test_demo_runs_four_systems_with_verls_and_conduits_bound_of_one(tmp_path: Path) -> None:
    args = verl_demo.demo_args("vllm", 3, 0.02, tmp_path)
    assert args.systems.split(",") == list(verl_demo.SYSTEMS)
    assert (args.rollout, args.batch_size, args.n, args.steps, args.poll) == ("vllm", 4, 4, 3, 0.02)
    assert verl_demo.BOUND == {
        "verl_sync_tuned": 0,
        "conduit": 0,
        "verl_separate_async_k1": 1,
        "conduit_k1": 1,
    }
    modes = verl_staleness.conduit_modes(list(verl_demo.SYSTEMS), "auto")
    assert modes["verl_separate_async_k1"][0] == "separate_async"
    assert "trainer.v1.sampler.max_off_policy_threshold=2" in modes["verl_separate_async_k1"][1]
    assert modes["conduit_k1"][0] == "conduit"
    assert "+trainer.v1.conduit.max_staleness=1" in modes["conduit_k1"][1]
    assert round_order(list(verl_demo.SYSTEMS), 0) == list(
        verl_demo.SYSTEMS
    )  # verl's and Conduit's alternate


def test_figure_title_names_the_rollout_the_rows_ran_on() -> None:
    assert "vLLM" in rollout_title("vllm") and "hf" not in rollout_title("vllm")
    assert rollout_title("paced", 4.0, 2.0) == "PACED rollout (modelled generation), tail 4, R 2"
    assert rollout_title("hf") == "hf rollout"


def test_work_check_with_nothing_left_to_compare_says_so_not_that_the_work_differs() -> None:
    rows = _pair_rows("conduit_k1", "verl_separate_async_k1", [900], [900])  # one iteration: open, dropped
    work = verl_demo.work_check(rows, "conduit_k1", "verl_separate_async_k1", open_last=True)
    assert work["iterations"] == [] and work["differs"] == "no iteration whose work both runs counted"
    assert (
        verl_demo.work_check(rows, "conduit_k1", "verl_separate_async_k1", open_last=False)["differs"] is None
    )
