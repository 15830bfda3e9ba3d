"""Issue 47, figures no file holds: ``report.py --check`` fails when a note quotes a measured figure its
section does not render from a results file, and names the note and the figure."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import report  # noqa: E402
from report_notes_check import figures, page_numbers, unheld  # noqa: E402


def test_figures_are_decimals_and_numbers_with_units() -> None:
    note = "exposed 0.715 and wall 0.938 (5d7c8e4); TorchRL p50 124 ms, 30.5 GiB on disk, 1.22× and 56%."
    assert figures(note) == ["0.715", "0.938", "124 ms", "30.5 GiB", "1.22×", "56%"]


def test_versions_code_dates_targets_commits_and_counts_are_not_figures() -> None:
    note = (
        "verl 0.9.1 on RLlib 2.60 and mujoco 3.3.0 (`--poll 0.02`, `alpha=0.5`), 2026-12-04 08:36–09:00 UTC, "
        "issue 47, 16 iterations a side, 640/640 identical, targets ≤ 0.85× and ≥ 1.1×, ±25%, p99, H100, "
        "fp32, 64×64 frames, 8×H200, clean worktree at 925af6a, 4 seeds"
    )
    assert figures(note) == []


def test_a_figure_is_held_by_a_number_of_the_rendered_text_grouped_or_not() -> None:
    assert {7578, 0.5} <= page_numbers("| 7 578 | 0.50 |")
    notes = {"a.md": "insert 7,578 steps/s, p50 0.5 ms, and 0.715 that no file holds"}
    assert [str(u.figure) for u in unheld(notes, {}, "| 7 578 | 0.50 |")] == ["0.715"]


def test_a_figure_must_be_held_by_its_own_section_not_elsewhere_on_the_page() -> None:
    notes = {"a.md": "wall 0.938", "b.md": "wall 0.938"}
    got = unheld(notes, {"a.md": "| 0.938 |", "b.md": "| 1.014 |"}, page="| 0.938 | 1.014 |")
    assert [u.note for u in got] == ["b.md"]


def test_every_note_of_the_page_quotes_only_figures_its_section_renders() -> None:
    notes = {p.name: p.read_text() for p in report.NOTES.glob("*.md")}
    assert unheld(notes, report.note_scopes(), report.render(notes=None)) == []


def test_the_check_fails_naming_the_note_and_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes"
    shutil.copytree(report.NOTES, notes)
    mujoco = notes / "rllib_mujoco.md"
    mujoco.write_text(mujoco.read_text() + " HalfCheetah: exposed 0.338×, wall 0.87×.")
    monkeypatch.setattr(report, "NOTES", notes)
    assert report.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "benchmarks/notes/rllib_mujoco.md: '0.338×'" in out
    assert "'0.87×'" in out
