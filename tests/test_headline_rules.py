"""Issue 47's rules for headline ratios, checked without timing: ABBA rounds, the stored bootstrap
interval and the verdict read from it, and the detector of a baseline that waited on a long poll."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import intervals  # noqa: E402
from poll_check import long_poll, poll_findings  # noqa: E402


def _rows(system: str, walls_by_round: list[list[float]]) -> list[dict[str, Any]]:
    return [
        {"system": system, "round": k, "wall_s": w, "stages": {"gen": w}}
        for k, walls in enumerate(walls_by_round)
        for w in walls
    ]


def test_round_plan_is_abba_with_the_pair_adjacent() -> None:
    plan = intervals.round_plan(["a", "x", "y", "b", "z"], ("a", "b"), 4)
    assert plan[0] == ["a", "b", "x", "y", "z"]  # every system in round 0, the pair together
    assert plan[1:] == [["b", "a"], ["a", "b"], ["b", "a"]]
    assert intervals.check_abba(plan, ("a", "b")) is None


def test_check_abba_refuses_one_order_separated_pairs_and_too_few_rounds() -> None:
    pair = ("a", "b")
    same = [["a", "b"], ["a", "b"], ["b", "a"]]  # the old fixed order: verl first every round
    assert "first again" in str(intervals.check_abba(same, pair))
    apart = [["a", "x", "b"], ["b", "a"], ["a", "b"]]
    assert "not adjacent" in str(intervals.check_abba(apart, pair))
    assert "fewer than 3" in str(intervals.check_abba([["a", "b"], ["b", "a"]], pair))


def test_old_round_order_breaks_the_rule_for_the_staleness_headline() -> None:
    import verl_runs

    systems = ["verl_colocate_async", "verl_sync_tuned", "conduit_k1", "conduit_k0"]
    pair = ("conduit_k1", "verl_colocate_async")
    old = [verl_runs.round_order(systems, k) for k in range(1)]  # the committed runs: one round
    assert intervals.check_abba(old, pair) is not None
    new = verl_runs.plan_rounds(systems, 3, pair)
    assert intervals.check_abba(new, pair) is None
    assert sorted(new[0]) == sorted(systems) and all(sorted(r) == sorted(pair) for r in new[1:])


def test_every_verl_trainer_but_the_shipped_one_polls_short() -> None:
    import verl_runs

    for plain in ("verl_sync_tuned", "verl_colocate_async", "verl_separate_async", "verl_colocate_async_k1"):
        assert verl_runs.polled(plain, 0.02) == ["--poll-interval", "0.02"], plain
    assert verl_runs.polled("verl_sync", 0.02) == []  # verl as shipped, labelled so
    assert verl_runs.polled("conduit_k1", 0.02) == []


def test_interval_holds_the_ratio_and_is_seeded() -> None:
    rng = random.Random(1)
    rows = _rows("a", [[rng.gauss(8, 0.3) for _ in range(8)] for _ in range(3)])
    rows += _rows("b", [[rng.gauss(10, 0.3) for _ in range(8)] for _ in range(3)])
    got = intervals.bootstrap_ratio(rows, "a", "b", "wall_s")
    assert got is not None
    assert got["lo"] <= got["ratio"] <= got["hi"] and got["hi"] < 1.0
    assert got["rounds"] == 3 and got["iterations_by_round"] == {"a": [8, 8, 8], "b": [8, 8, 8]}
    assert got == intervals.bootstrap_ratio(rows, "a", "b", "wall_s")  # recomputable from the rows


def test_interval_pairs_by_round() -> None:
    """A round only one side ran is left out of both: drift between rounds cannot favour one side."""
    rows = _rows("a", [[1.0] * 8, [1.0] * 8]) + _rows("b", [[2.0] * 8, [2.0] * 8, [0.1] * 8])
    got = intervals.bootstrap_ratio(rows, "a", "b", "wall_s")
    assert got is not None and got["rounds"] == 2 and got["ratio"] == 0.5


def test_verdict_reads_the_interval_not_the_point() -> None:
    assert intervals.verdict({"lo": 0.7, "hi": 0.85}, 0.9) == intervals.MET
    # a point estimate inside the target whose interval is not: the old rule said "met"
    assert intervals.verdict({"lo": 0.53, "hi": 1.23}, 0.9) == intervals.UNRESOLVED
    assert intervals.verdict({"lo": 0.85, "hi": 0.95}, 0.9) == intervals.MISSED
    assert intervals.verdict({"lo": 1.2, "hi": 1.3}, 1.1, at_most=False) == intervals.MET
    assert intervals.verdict(None, 0.9) is None


def test_headline_needs_three_rounds_of_eight_iterations() -> None:
    rows = _rows("a", [[1.0] * 10]) + _rows("b", [[2.0] * 10])  # one round: the old staleness runs
    one = intervals.headline("claim", rows, ("a", "b"), "wall_s", 0.9)
    assert one["verdict"] == "not a headline" and "1 round" in one["why"]
    assert one["interval"]["ratio"] == 0.5  # kept, but not read as a verdict
    short = _rows("a", [[1.0] * 4] * 3) + _rows("b", [[2.0] * 4] * 3)  # the vLLM runs: 4 a side
    assert "fewer than 8" in intervals.headline("c", short, ("a", "b"), "wall_s", 0.9)["why"]
    ok = _rows("a", [[1.0] * 8] * 3) + _rows("b", [[2.0] * 8] * 3)
    assert intervals.headline("c", ok, ("a", "b"), "wall_s", 0.9)["verdict"] == intervals.MET
    refused = intervals.headline("c", ok, ("a", "b"), "wall_s", 0.9, refused="staler data")
    assert refused["verdict"] == "refused" and refused["interval"] is None


def test_long_poll_detected_on_whole_second_waits() -> None:
    assert long_poll([0.02, 2.02, 4.02, 2.02, 0.02, 4.03]) is not None
    assert long_poll([0.02, 0.03, 0.01, 0.02]) is None  # a short poll: no long waits at all
    assert long_poll([1.37, 2.81, 1.05, 3.52, 1.66]) is None  # waits that end when data arrives
    assert long_poll([2.02, 4.02]) is None  # two waits cannot tell


@pytest.mark.parametrize("name", ["verl_staleness_grpo", "verl_staleness_ppo"])
def test_the_committed_async_baselines_waited_on_the_2s_poll(name: str) -> None:
    """The runs issue 47 read: verl's async trainers polled at 2 s. A rerun under the rule replaces
    them, so this holds only for files from before it (no ``poll_check`` stored)."""
    doc = json.loads((BENCH / "results" / f"{name}.json").read_text())
    if "poll_check" in doc:
        assert doc["poll_check"] == poll_findings(doc["rows"])
        pytest.skip("rerun under the rule: its findings are stored and recomputed above")
    assert "verl_colocate_async" in poll_findings(doc["rows"])


def test_iteration_headlines_refuse_unequal_work_unequal_losses_and_a_long_poll() -> None:
    from verl_headlines import iteration_headlines

    rows = [{**r, "algo": "grpo", "exposed_s": r["wall_s"] / 4} for r in _rows("conduit", [[8.0] * 8] * 3)]
    rows += [
        {**r, "algo": "grpo", "exposed_s": r["wall_s"]} for r in _rows("verl_sync_tuned", [[10.0] * 8] * 3)
    ]
    ok = iteration_headlines(rows, {"losses_equal/conduit_vs_verl_sync_tuned": True}, {}, "hf")
    assert [h["verdict"] for h in ok] == [intervals.MET, intervals.MET]
    assert ok[0]["interval"]["ratio"] == 0.8 and ok[0]["target"] == 1.0
    paced = iteration_headlines(rows, {}, {}, "paced")  # wall 0.8 <= 0.85, exposed 0.2 <= 0.3
    assert [h["verdict"] for h in paced] == [intervals.MET, intervals.MET]
    work = iteration_headlines(rows, {"refused/conduit_over_verl_sync_tuned": "work differs"}, {}, "hf")
    assert {h["verdict"] for h in work} == {"refused"}
    losses = iteration_headlines(rows, {"losses_equal/conduit_vs_verl_sync_tuned": False}, {}, "hf")
    assert "losses differ" in losses[0]["why"]
    polled = iteration_headlines(rows, {}, {"verl_sync_tuned": "waited on a 2 s poll"}, "hf")
    assert "2 s poll" in polled[0]["why"]


def test_vllm_iteration_headlines_ask_for_identical_responses_not_equal_losses() -> None:
    from verl_headlines import iteration_headlines

    rows = [{**r, "algo": "grpo", "exposed_s": r["wall_s"] / 4} for r in _rows("conduit", [[8.0] * 8] * 3)]
    rows += [
        {**r, "algo": "grpo", "exposed_s": r["wall_s"]} for r in _rows("verl_sync_tuned", [[10.0] * 8] * 3)
    ]
    differ = {"losses_equal/conduit_vs_verl_sync_tuned": False}  # vLLM: a near-tie may go another way
    ok = iteration_headlines(rows, differ, {}, "vllm", identical=0.97)
    assert [h["verdict"] for h in ok] == [intervals.MET, intervals.MET]  # wall 0.8, exposed 0.2 <= 0.35
    assert ok[1]["target"] == 0.35
    few = iteration_headlines(rows, {}, {}, "vllm", identical=0.9)
    assert {h["verdict"] for h in few} == {"refused"} and "0.9 of their responses" in few[0]["why"]
    unknown = iteration_headlines(rows, {}, {}, "vllm")
    assert {h["verdict"] for h in unknown} == {"refused"}


def _doc(load: float = 0.3, dirty: bool = False) -> dict[str, Any]:
    rows = _rows("a", [[1.0, 1.1] * 4] * 3) + _rows("b", [[2.0, 2.1] * 4] * 3)
    machine = {"git_commit": "x", "git_dirty": dirty, "load_average_start": [load, 0, 0], "command": "b.py"}
    return {
        "machine": machine,
        "headlines": [intervals.headline("a beats b", rows, ("a", "b"), "wall_s", 0.9)],
        "poll_check": {"verl_sync": "waited on a 2 s poll"},
    }


def test_the_page_opens_with_every_stored_headline_and_its_verdict() -> None:
    from report_headline import headline_lines, headline_section

    page = "\n".join(headline_section({"x.json": _doc(), "old.json": {"rows": []}}))
    assert "| a beats b | 0.512× | [" in page and "| <= 0.9 | met | `x.json` |" in page
    assert "`old.json`" in page  # listed among the files with no headline under the rules
    loud = "\n".join(headline_section({"x.json": _doc(load=1.7)}))
    assert "not a headline (started at load 1.70 > 1.0" in loud and "| met |" not in loud
    lines = headline_lines("GRPO", _doc())
    assert any("headline a beats b" in x and x.endswith(": met.") for x in lines)
    assert any("verl_sync: waited on a 2 s poll" in x for x in lines)


def test_the_paced_headline_shows_its_tail_1_r_1_point_beside_it() -> None:
    import report

    page = report.render()
    paced = page[page.index("## verl with a paced rollout") : page.index("### Paced sweep")]
    assert "the sweep's point tail=1,R=1" in paced and "wall 0.972, exposed 0.970" in paced


def test_pre_rule_files_get_their_poll_check_from_their_own_rows() -> None:
    import verl_vllm_floor_recheck as recheck

    doc = {"rows": [{**r, "system": "verl_colocate_async"} for r in _rows("x", [[0.02, 2.02, 4.02, 2.02]])]}
    out = recheck.recheck(doc)
    assert "verl_colocate_async" in out["poll_check"] and "reanalysis" in out
    assert recheck.recheck({"rows": _rows("verl_sync_tuned", [[0.02, 0.03]])})["poll_check"] == {}
