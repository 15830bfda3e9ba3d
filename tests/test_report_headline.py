"""Issue 47: every results file records its command; the page marks a file without one and a run that
began at a load over 1.0; ``headline_eligible`` says whether a file may carry a headline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import provenance  # noqa: E402
from report_fmt import provenance as line  # noqa: E402
from report_headline import headline_eligible  # noqa: E402


def _doc(load: float = 0.4, dirty: bool = False, command: str | None = "bench.py --quick") -> dict[str, Any]:
    m: dict[str, Any] = {"cpus": 2, "git_commit": "abcdef1234", "git_dirty": dirty}
    m |= {"load_average_start": [load, 1.0, 1.0], "load_average_end": [0.5, 1.0, 1.0]}
    return {"machine": m | ({"command": command} if command else {})}


def test_finish_records_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/work/main/benchmarks/bench.py", "--quick", "--out", "/tmp/x.json"])
    assert provenance.finish(provenance.start())["command"] == "bench.py --quick --out /tmp/x.json"


def test_the_provenance_line_shows_the_command_from_machine_or_says_it_is_missing() -> None:
    assert "command `bench.py --quick`" in line("x.json", _doc())
    assert "; command not recorded" in line("x.json", _doc(command=None))


def test_a_run_started_at_a_load_over_one_is_marked_not_a_headline() -> None:
    assert "started at load 2.47 > 1.0 on 2 cores: not a headline" in line("x.json", _doc(load=2.47))
    assert "not a headline" not in line("x.json", _doc(load=1.0))


def test_headline_eligible_needs_a_command_a_clean_tree_and_a_quiet_start() -> None:
    assert headline_eligible(_doc()) == (True, "")
    assert headline_eligible(_doc(load=1.0)) == (True, "")
    ok, why = headline_eligible(_doc(load=1.5))
    assert not ok and "load 1.50 > 1.0" in why
    assert headline_eligible(_doc(dirty=True)) == (False, "made from a dirty tree")
    assert headline_eligible(_doc(command=None)) == (False, "command not recorded")
    ok, why = headline_eligible({"git_commit": "a", "git_dirty": True, "load_average_start": [3.0]})
    assert not ok and why.count(";") == 2


def test_a_command_recorded_at_the_top_level_or_in_method_counts() -> None:
    assert headline_eligible({"command": "a.py", "git_dirty": False})[0]
    assert headline_eligible({"method": {"command": "a.py"}, "git_dirty": False})[0]


def test_a_run_s_own_records_do_not_make_the_tree_dirty(monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-part run (scaling --measure) writes its records into the repository as it goes: the
    records written before a part must not mark that part's tree dirty; anything else still does."""
    import provenance

    out = provenance.REPO / "benchmarks" / "results" / "scaling_measured"
    status = "?? benchmarks/results/scaling_measured/Conduit_1.json"
    monkeypatch.setattr(provenance, "git", lambda *a: status if a[0] == "status" else "abc")
    assert provenance.start((out,)).git_dirty is False
    assert provenance.start().git_dirty is True
    status += "\n M conduit/api.py"
    assert provenance.start((out,)).git_dirty is True
