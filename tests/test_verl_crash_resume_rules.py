"""Rules of the verl crash-resume benchmark (``benchmarks/verl_crash_resume.py``): one kill schedule,
in seconds after the step began, shared by both systems; degenerate trials counted and left out; the
ratio computed per trial on pairs of equal work; the baseline named as what it is (Conduit's own
trainer with the journal off). No run is started: the runs are stubbed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import verl_crash_analysis as vca
import verl_crash_resume as vcr


def _trial(t: int, lost: float, kill_s: float = 2.0, **kw: Any) -> dict[str, Any]:
    """A measured trial of step ``t + 1`` that lost ``lost`` request-seconds."""
    tr = {
        "trial": t,
        "step": t + 1,
        "kill_s": kill_s,
        "kill_at_s": kill_s,
        "trained_before_kill": False,
        "requests_before_kill": 4,
        "requests_regenerated": 4,
        "work_before_kill_s": 40.0,
        "work_lost_s": lost,
        "lost_gen_s": lost / 10,
        "elapsed_gen_s": 2.0,
        "resumed_gen_s": 5.0,
        "requests_lost": 2,
        "kept_groups": 1,
        "prompts_lost": 0,
        "prompts_duplicated": 0,
        "kept_data_equal": True,
    }
    tr.update(kw)
    tr["degenerate"] = vca.degenerate(tr)
    return tr


def _stub_runs(monkeypatch: pytest.MonkeyPatch, run_system: Any, tmp_path: Path) -> Path:
    """``vcr.main`` with ``run_system`` in place of the real runs and nothing else measured or plotted;
    returns the path for its ``--out``."""
    monkeypatch.setattr(vcr, "run_system", run_system)
    monkeypatch.setattr(vcr, "measure", lambda *a: None)
    monkeypatch.setattr(vcr, "compare", lambda *a: None)
    monkeypatch.setattr(vcr, "lag_stats", lambda work: {"groups": 0})
    monkeypatch.setattr(vcr, "plot", lambda doc, path: None)
    return tmp_path / "crash.json"


def test_the_kill_schedule_is_seconds_in_a_window_drawn_once_from_the_seed() -> None:
    schedule = vcr.kill_schedule(20, seed=0, window=(0.5, 6.5))
    assert schedule == vcr.kill_schedule(20, seed=0, window=(0.5, 6.5))
    assert schedule != vcr.kill_schedule(20, seed=1, window=(0.5, 6.5))
    assert all(0.5 <= s <= 6.5 for s in schedule)
    assert max(schedule) > 1.0  # seconds, not a fraction of a step


def test_both_systems_are_killed_on_one_shared_schedule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    given: dict[str, list[float]] = {}

    def run_system(system: str, work: Path, args: Any, schedule: list[float]) -> list[dict[str, Any]]:
        given[system] = list(schedule)
        lost = 30.0 if system == vcr.BASELINE else 10.0
        return [_trial(t, lost, kill_s=k) for t, k in enumerate(schedule, start=1)]

    out = _stub_runs(monkeypatch, run_system, tmp_path)
    assert vcr.main(["--trials", "3", "--kill-window", "1,5", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    want = vcr.kill_schedule(3, 0, (1.0, 5.0))
    assert given == {vcr.BASELINE: want, vcr.JOURNAL: want}
    assert doc["kill_schedule"]["seconds_after_step_start"] == want
    assert doc["kill_schedule"]["shared"] is True
    assert doc["degenerate"] == {vcr.BASELINE: 0, vcr.JOURNAL: 0}
    assert doc["lost_work_ratio_journal_off_over_on"] == pytest.approx(3.0)
    # the baseline is Conduit's own trainer with the journal off, and says so
    assert set(doc["systems"]) == {"conduit_journal_off", "conduit_journal_on"}
    assert vcr.SYSTEMS["conduit_journal_off"] == "off"
    assert "journal off" in doc["systems"]["conduit_journal_off"]["label"]


def test_degenerate_trials_are_counted_and_left_out_of_the_medians() -> None:
    skipped = {"trial": 7, "step": 8, "kill_s": 2.0, "skipped": vcr.SKIPPED, "events_at_kill": 0}
    skipped["degenerate"] = vca.degenerate(skipped)
    trials = [
        _trial(1, 10.0),
        _trial(2, 20.0),
        _trial(3, 30.0),
        _trial(4, 60.0, trained_before_kill=True),  # killed after the step was checkpointed
        _trial(5, 70.0, trained_before_kill=True),
        _trial(6, 0.0, requests_before_kill=0),  # killed before any request
        skipped,  # the relaunch after trial 5 began at this step
    ]
    assert [bool(tr["degenerate"]) for tr in trials] == [False] * 3 + [True] * 4
    s = vca.summary(trials)
    assert (s["trials"], s["clean"], s["degenerate"]) == (7, 3, 4)
    assert s["median_work_lost_s"] == pytest.approx(20.0)  # 25 with the degenerate ones
    assert s["trained_before_kill"] == 2
    assert s["kept_groups_total"] == 3  # totals over the clean trials too


def test_the_ratio_is_per_trial_on_pairs_of_equal_work() -> None:
    baseline = [
        _trial(1, 30.0),
        _trial(2, 10.0),
        _trial(3, 40.0),
        _trial(4, 50.0, trained_before_kill=True),
        _trial(5, 20.0),
        _trial(6, 25.0),
    ]
    journal = [
        _trial(1, 10.0),
        _trial(2, 5.0),
        _trial(3, 40.0),
        _trial(4, 1.0),
        _trial(5, 2.0, kill_at_s=2.6),  # its kill landed 0.6 s later: unequal work
        _trial(6, 0.0),  # lost nothing: ranks above every finite ratio
    ]
    r = vca.paired_ratios(baseline, journal, "work_lost_s")
    assert [p["trial"] for p in r["per_trial"]] == [1, 2, 3, 6]
    assert [p["ratio"] for p in r["per_trial"]] == [pytest.approx(3.0), pytest.approx(2.0), 1.0, None]
    assert r["per_trial"][-1]["journal_lost_nothing"] is True
    assert r["median"] == pytest.approx(2.5)  # of 1, 2, 3, inf: not the ratio of the medians
    why = {e["trial"]: e["why"] for e in r["excluded"]}
    assert set(why) == {4, 5}
    assert why[4].startswith("degenerate (conduit_journal_off)")
    assert "apart" in why[5]


def test_no_pair_of_equal_work_refuses_the_ratio(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def run_system(system: str, work: Path, args: Any, schedule: list[float]) -> list[dict[str, Any]]:
        return [_trial(t, 5.0, kill_s=k, trained_before_kill=True) for t, k in enumerate(schedule, start=1)]

    out = _stub_runs(monkeypatch, run_system, tmp_path)
    vcr.main(["--trials", "2", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["degenerate"] == {vcr.BASELINE: 2, vcr.JOURNAL: 2}
    assert doc["lost_work_ratio_journal_off_over_on"] is None
    assert doc["ratio_refused"].startswith("no pair of clean trials")
