"""BENCHMARKS.md is generated from benchmarks/results/*.json and stays current; the renderers show
what the JSON holds: a refused ratio as refused (with its reason), a missing field as —, the run's
provenance (a dirty tree says so), and the issue-27 fields of the reruns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from blank_values import blank

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import report  # noqa: E402
import report_tables  # noqa: E402
import report_verl  # noqa: E402
from report_fmt import provenance  # noqa: E402


def test_the_benchmarks_page_matches_the_results_files() -> None:
    assert report.main(["--check"]) == 0


def test_a_stale_page_fails_the_check(tmp_path, capsys) -> None:
    stale = tmp_path / "BENCHMARKS.md"
    stale.write_text(
        report.render().replace("| dqn CartPole-v1 b32 |", "| dqn CartPole-v1 b32 (edited) |", 1)
    )
    assert report.main(["--check", "--out", str(stale)]) == 1
    out = capsys.readouterr().out
    assert "differs from what benchmarks/results gives" in out
    assert "+| dqn CartPole-v1 b32 |" in out


def test_a_missing_results_file_renders_without_crashing(tmp_path) -> None:
    page = report.render(results=tmp_path, notes=tmp_path)
    assert "`buffer_throughput.json`: no results file." in page
    assert "`verl_crash_resume.json`: no results file." in page


def test_every_section_renders_results_whose_values_are_all_missing(tmp_path) -> None:
    for path in report.RESULTS.glob("*.json"):
        (tmp_path / path.name).write_text(json.dumps(blank(json.loads(path.read_text()))))
    page = report.render(results=tmp_path, notes=tmp_path)
    assert (
        "- Run `rllib_iteration.json`: commit —, dirty=—, load — → —, date —; command not recorded." in page
    )
    assert "no results file" not in page


def test_provenance_shows_a_dirty_tree_and_missing_facts() -> None:
    doc = {
        "machine": {"git_commit": "4e63c9aaa471cc11", "git_dirty": True, "load_average_start": [0.5, 1, 1]}
    }
    line = provenance("x.json", doc)
    assert "commit 4e63c9a" in line
    assert "dirty=true" in line
    assert "load 0.50 → —" in line
    assert "date —" in line
    clean = provenance("y.json", {"git_commit": "abc", "git_dirty": False, "created_utc": "2026-12-02"})
    assert "dirty=false" in clean and "2026-12-02" in clean


def test_a_refused_ratio_renders_as_refused_and_a_missing_field_as_dash() -> None:
    work = {"env_steps_sampled": 10, "gradient_updates": 5, "module_steps_trained": 50}
    doc = {
        "ratios": {
            "ppo tiny": {
                "native_wall_s": 2.0,
                "conduit_wall_s": 1.0,
                "native_exposed_s": 0.5,  # conduit_exposed_s missing
                "native_work": work,
                "conduit_work": {**work, "gradient_updates": 6},
                "ratio_wall": None,
                "ratio_exposed": None,
                "ratio_refused": "gradient_updates differ: native 5, conduit 6",
            }
        }
    }
    text = "\n".join(report_tables.rllib_iteration(doc))
    row = next(line for line in text.splitlines() if line.startswith("| ppo tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "refused [1]" and cells[6] == "refused [1]"
    assert cells[5] == "0.500 → —"
    assert "- [1] refused: gradient_updates differ: native 5, conduit 6" in text


def test_the_verl_table_renders_the_control_the_update_time_and_the_targets() -> None:
    rows = [
        {"system": s, "round": 0, "tq_backend": b, "work": {"response_tokens": 7}, "tq_put_s_per_iter": 0.1}
        for s, b in (
            ("verl_sync_tuned", "SimpleStorage"),
            ("verl_sync_tuned+tq_conduit", "Conduit"),
            ("conduit", "Conduit"),
        )
    ]
    doc = {
        "rows": rows,
        "ratios": {
            "wall/conduit_over_verl_sync_tuned": 0.9,
            "exposed/conduit_over_verl_sync_tuned": 0.3,
            "losses_equal/conduit_vs_verl_sync_tuned": True,
            "refused/conduit_over_verl_separate_async": "iteration 2: different tokens",
            "backend/wall/verl_sync_tuned+tq_conduit_over_verl_sync_tuned": 1.01,
            "backend/exposed/verl_sync_tuned+tq_conduit_over_verl_sync_tuned": 0.95,
            "median_wall_s/conduit": 10.0,
            "median_update_actor_s/conduit": 2.5,
        },
        "sweep": {"chosen": 0.05, "resolved": False},
        "targets": {
            "exposed<=0.3x": False,
            "wall<=0.85x": True,
            "vs_control": {"wall": 0.95, "exposed": 0.4},
        },
    }
    text = "\n".join(report_verl.iteration([("GRPO", doc)]))
    control = next(line for line in text.splitlines() if "| verl_sync_tuned+tq_conduit |" in line)
    assert "1.010 / 0.950" in control
    conduit = next(line for line in text.splitlines() if "| conduit |" in line)
    assert "10.000" in conduit and "2.500" in conduit and "0.900 / 0.300, losses equal" in conduit
    assert "refused [1]" in conduit and "- [1] refused: iteration 2: different tokens" in text
    assert "resolved the order: no" in text
    assert "exposed<=0.3x **missed**; wall<=0.85x met; vs_control wall 0.95, exposed 0.40" in text


def test_the_crash_resume_and_autotune_verl_reruns_render_their_new_fields() -> None:
    summary = {"trials": 20, "clean": 16, "degenerate": 4, "median_work_lost_s": 5.0}
    crash = {
        "systems": {
            "conduit_journal_off": {"label": "journal off", "summary": summary},
            "conduit_journal_on": {
                "label": "journal on",
                "summary": {**summary, "degenerate": 3, "clean": 17},
            },
        },
        "kill_schedule": {"seconds_after_step_start": [1.5, 2.25], "shared": True},
        "lost_work_ratio_journal_off_over_on": 3.4,
        "ratios": {"work_lost_s": {"pairs": 12}},
        "ratio_refused": None,
    }
    text = "\n".join(report_verl.crash_resume(crash))
    assert "| conduit_journal_off: journal off | 20 / 16 / 4 |" in text
    assert "| conduit_journal_on: journal on | 20 / 17 / 3 |" in text
    assert "median of 12 per-trial ratios): 3.40×" in text
    assert "1.50, 2.25; shared by both systems: yes" in text
    evaluation = {
        "auto_gap_tuned": 0.6,
        "auto_gap_iteration": 0.03,
        "auto_rank": 4,
        "auto_rank_among": 8,
        "auto_steps_compared": [5, 6, 7],
        "targets": {"auto_within_10%_of_tuned": False},
    }
    point = {"median": 64, "evaluation": {"recorded": evaluation}}
    text = "\n".join(report_verl.autotune_verl({"points": [point]}))
    assert "+60.0% / +3.0%, rank 4 of 8 on 3 steps" in text
    assert "median 64: auto_within_10%_of_tuned **missed**" in text


def test_every_section_names_an_existing_note() -> None:
    keys = ["intro"]
    stack = list(report.SECTIONS)
    while stack:
        s = stack.pop()
        keys.append(s.key)
        stack += s.subsections
    missing = [k for k in keys if not (report.NOTES / f"{k}.md").exists()]
    assert not missing, missing
