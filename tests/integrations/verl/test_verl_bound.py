"""Issue 48 in the verl benchmarks' analysis: the two-resource bound beside every row (which resource
bounds, rows from before the fields), the per-iteration ratio refused where two systems trained
different work, and seconds per response token beside it; the renderers show both, and a file from
before them renders as it did."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report_staleness  # noqa: E402
import report_verl  # noqa: E402
import verl_staleness_analysis as va  # noqa: E402
from verl_analysis import (  # noqa: E402
    bound_medians,
    per_token,
    ratios,
    rows_for_run,
    s_per_token,
    tokens_differ,
    two_resource_bound,
)


def _run(work: Path, steps: list[dict[str, float]], busy: list[float], tokens: int = 5) -> None:
    """A run's ``metrics.jsonl`` and generation log: step ``s`` generates for ``busy[s - 1]`` s."""
    metrics, events = [], []
    for step, (m, b) in enumerate(zip(steps, busy, strict=True), start=1):
        metrics.append(json.dumps({"step": step, "data": {"timing_s/step": 10.0, "timing_s/gen": b, **m}}))
        events.append(
            json.dumps({"version": step, "t0": 100.0 * step, "t1": 100.0 * step + b, "length": tokens})
        )
    work.mkdir()
    (work / "metrics.jsonl").write_text("\n".join(metrics))
    (work / "gen_events.jsonl").write_text("\n".join(events))


TRAIN = {
    "timing_s/reward": 0.5,  # a colocated reward: the trainer's core
    "timing_s/old_log_prob": 1.0,
    "timing_s/ref": 1.0,
    "timing_s/adv": 0.1,
    "timing_s/update_actor": 3.0,
    "timing_s/update_weights": 0.4,
}  # 6.0 s of trainer busy time


def test_each_row_carries_the_bound_and_which_resource_sets_it(tmp_path: Path) -> None:
    _run(tmp_path / "run", [TRAIN, TRAIN, TRAIN], [9.0, 8.0, 4.0])
    rows = rows_for_run(tmp_path / "run", "grpo", "verl_sync", 1, {})
    gen_bound, trainer_bound = rows
    assert gen_bound["trainer_busy_s"] == pytest.approx(6.0)  # the reward counted, gen excluded
    assert gen_bound["gen_busy_s"] == 8.0 and gen_bound["bound_s"] == 8.0
    assert gen_bound["bound_by"] == "generation" and gen_bound["wall_over_bound"] == 1.25
    assert trainer_bound["gen_busy_s"] == 4.0 and trainer_bound["bound_s"] == pytest.approx(6.0)
    assert trainer_bound["bound_by"] == "trainer"
    assert trainer_bound["wall_over_bound"] == pytest.approx(10.0 / 6.0, abs=1e-3)
    assert gen_bound["s_per_token"] == pytest.approx(10.0 / 5)


def test_a_conduit_step_counts_every_streamed_piece_in_the_trainer_busy_time(tmp_path: Path) -> None:
    """verl's timer accumulates: a conduit step's ``timing_s/old_log_prob`` holds every piece's,
    overlapped with generation or not, so the trainer's busy time is the whole step's work."""
    streamed = dict(TRAIN, **{"timing_s/old_log_prob": 4 * 0.25, "conduit/exposed_s": 0.3})
    _run(tmp_path / "run", [streamed, streamed], [3.0, 3.0])
    (row,) = rows_for_run(tmp_path / "run", "grpo", "conduit", 1, {})
    assert row["stages"]["overlapped_ingest"] > 0  # most ingestion hid behind generation ...
    assert row["trainer_busy_s"] == pytest.approx(6.0)  # ... and still counts as the trainer's work
    assert row["bound_by"] == "trainer"


def test_rows_without_stages_or_a_generation_log_have_no_bound() -> None:
    none = dict.fromkeys(("trainer_busy_s", "gen_busy_s", "bound_s", "bound_by", "wall_over_bound"))
    assert two_resource_bound({"system": "verl_sync", "wall_s": 3.0}) == none  # a row from before stages
    assert two_resource_bound({"wall_s": 3.0, "stages": {"gen_busy": 0.0, "update_actor": 1.0}}) == none
    assert s_per_token({"wall_s": 3.0}) is None and s_per_token({"wall_s": 3.0, "work": {}}) is None
    old = [
        {"system": "verl_sync", "iteration": 2, "wall_s": 3.0},
        {
            "system": "conduit",
            "iteration": 2,
            "wall_s": 2.0,
            "stages": {"gen_busy": 1.0, "update_actor": 1.5},
        },
    ]
    out = bound_medians(old, ["verl_sync", "conduit"])
    assert "median_wall_over_bound/verl_sync" not in out  # nothing made up for the old row
    assert out["median_wall_over_bound/conduit"] == pytest.approx(2.0 / 1.5, abs=1e-3)  # from its stages
    assert out["bound_by/conduit"] == {"trainer": 1, "generation": 0}


def _row(
    system: str, it: int, wall: float, tokens: int, gen: float = 2.0, train: float = 1.0
) -> dict[str, Any]:
    row = {
        "system": system,
        "iteration": it,
        "wall_s": wall,
        "exposed_s": wall / 4,
        "work": {"responses": 8, "response_tokens": tokens},
        "stages": {"gen_busy": gen, "update_actor": train},
    }
    return row | two_resource_bound(row) | {"s_per_token": s_per_token(row)}


def test_the_medians_say_which_resource_bounds_each_system() -> None:
    rows = [_row("verl_sync_tuned", i, 4.0, 100) for i in (2, 3, 4)]
    rows += [_row("conduit", i, 3.0, 100, gen=2.0, train=2.5 if i < 4 else 1.0) for i in (2, 3, 4)]
    r = ratios(rows, ["verl_sync_tuned"])
    assert r["median_wall_over_bound/verl_sync_tuned"] == 2.0  # 4 s over generation's 2 s
    assert r["bound_by/verl_sync_tuned"] == {"trainer": 0, "generation": 3}
    assert r["median_wall_over_bound/conduit"] == pytest.approx(1.2)
    assert r["bound_by/conduit"] == {"trainer": 2, "generation": 1}
    assert r["median_s_per_token/conduit"] == pytest.approx(0.03)


def test_unequal_trained_work_refuses_the_iteration_ratio_and_reports_seconds_per_token() -> None:
    rows = [_row("a", i, 10.0, 1000) for i in (2, 3, 4)] + [_row("b", i, 9.0, 800) for i in (2, 3, 4)]
    why = tokens_differ(rows, "a", "b")
    assert why is not None and "trained work differs" in why and "a 1000, b 800" in why and "20.0%" in why
    assert per_token(rows, "a", "b") == {
        "s_per_token/a_over_b": pytest.approx((10 / 1000) / (9 / 800), abs=1e-3)
    }
    near = [_row("a", i, 10.0, 1000) for i in (2, 3, 4)] + [_row("b", i, 9.0, 985) for i in (2, 3, 4)]
    assert tokens_differ(near, "a", "b") is None  # 1.5% apart: the same work
    assert tokens_differ(near, "a", "b", rel=0.01) is not None
    assert tokens_differ([*near, {"system": "c", "iteration": 2, "wall_s": 1.0}], "a", "c") is None


def _staleness_rows(tokens: dict[str, int]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    rows = [
        _row(s, i, w, tokens[s])
        for s, w in (("conduit_k1", 8.0), ("verl_colocate_async", 10.0))
        for i in (2, 3)
    ]
    same = {"staleness_median_of_step_means": 1.0, "staleness_max": 1.0, "staleness_source": "verl_step_mean"}
    return rows, {"conduit_k1": same, "verl_colocate_async": same}


def test_the_staleness_ratio_is_refused_when_the_async_systems_trained_different_work() -> None:
    pair = [("conduit_k1", "verl_colocate_async")]
    rows, summary = _staleness_rows({"conduit_k1": 900, "verl_colocate_async": 1000})
    out = va.staleness_ratios(rows, summary, pair)
    assert "trained work differs" in out["refused/conduit_k1_over_verl_colocate_async"]
    assert "wall/conduit_k1_over_verl_colocate_async" not in out
    assert "exposed/conduit_k1_over_verl_colocate_async" not in out
    assert out["s_per_token/conduit_k1_over_verl_colocate_async"] == pytest.approx(
        (8 / 900) / (10 / 1000), abs=1e-3
    )
    rows, summary = _staleness_rows({"conduit_k1": 995, "verl_colocate_async": 1000})
    out = va.staleness_ratios(rows, summary, pair)
    assert "refused/conduit_k1_over_verl_colocate_async" not in out
    assert out["wall/conduit_k1_over_verl_colocate_async"] == 0.8
    assert "s_per_token/conduit_k1_over_verl_colocate_async" in out  # beside the ratio too


def _doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"algo": "grpo", "rows": rows, "ratios": ratios(rows, ["verl_sync_tuned"])}


def test_the_iteration_table_shows_the_bound_and_an_old_file_renders_as_before() -> None:
    rows = [_row("verl_sync_tuned", i, 4.0, 100) for i in (2, 3)] + [
        _row("conduit", i, 3.0, 90) for i in (2, 3)
    ]
    page = "\n".join(report_verl.iteration([("GRPO", _doc(rows))]))
    head = page.splitlines()[0]
    assert "| wall ÷ bound | bound by |" in head
    assert "| 1.50 | generation |" in page and "| 2.00 | generation |" in page  # conduit, verl_sync_tuned
    assert "per token 0.833" in page  # (3/90) / (4/100), beside the refusal for unequal work
    strip = ("bound_s", "bound_by", "wall_over_bound", "trainer_busy_s", "gen_busy_s")
    old = {"algo": "grpo", "rows": [{k: v for k, v in r.items() if k not in strip} for r in rows]}
    old["ratios"] = {
        k: v for k, v in _doc(rows)["ratios"].items() if "bound" not in k and not k.startswith("s_per_token")
    }
    old_page = report_verl.iteration([("GRPO", old)])
    assert "wall ÷ bound" not in old_page[0] and "per token" not in "\n".join(old_page)
    both = report_verl.iteration([("GRPO", _doc(rows)), ("PPO", old)])
    assert "wall ÷ bound" in both[0]
    ppo = [line for line in both if line.startswith("| PPO | conduit |")]
    assert ppo and "| — | — |" in ppo[0]  # the old file's cells: missing, not made up


def test_the_staleness_table_shows_the_bound_and_seconds_per_token() -> None:
    rows, _ = _staleness_rows({"conduit_k1": 900, "verl_colocate_async": 1000})
    for r in rows:
        r |= {"round": 0, "algo": "grpo"}
    summary = va.summarize(rows, ["verl_colocate_async", "conduit_k1"])
    k1 = next(s for s in summary if s["system"] == "conduit_k1")
    assert k1["wall_over_bound"] == 4.0 and k1["bound_by"] == {"trainer": 0, "generation": 2}
    assert k1["s_per_token"] == pytest.approx(8 / 900, abs=1e-6)
    page = "\n".join(report_staleness.staleness({"grpo": {"algo": "grpo", "summary": summary}}))
    assert "| wall ÷ bound | bound by | ms per response token |" in page
    assert "| 4.00 | generation | 8.889 |" in page
    old = [
        {k: v for k, v in s.items() if k not in ("wall_over_bound", "bound_by", "s_per_token")}
        for s in summary
    ]
    assert "wall ÷ bound" not in "\n".join(
        report_staleness.staleness({"grpo": {"algo": "grpo", "summary": old}})
    )


def test_an_async_runs_last_iteration_does_not_decide_the_work() -> None:
    """The last weight version's count stops where the run ended (``work_differs``' ``open_last``)."""
    rows = [_row("a", i, 10.0, 1000 if i < 4 else 300) for i in (2, 3, 4)]
    rows += [_row("b", i, 10.0, 1000) for i in (2, 3, 4)]
    rows += [_row("a", 4, 10.0, 300), _row("b", 4, 10.0, 1000)]  # a second round, same cut
    assert tokens_differ(rows, "a", "b") is not None  # the cut iteration counted: 300 is the median
    assert tokens_differ(rows, "a", "b", open_last=True) is None
    assert per_token(rows, "a", "b", open_last=True) == {"s_per_token/a_over_b": 1.0}
