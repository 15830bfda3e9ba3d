"""docs/KNOBS.md is generated from the configuration classes and stays current; every knob is documented."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import knob_reference  # noqa: E402


def test_the_knob_reference_is_current() -> None:
    assert knob_reference.main(["--check"]) == 0


def test_args_sections_are_parsed_with_continuation_lines() -> None:
    doc = """Title.

    Args:
        a: first line
            continued.
        b: second.

    Returns nothing.
    """
    assert knob_reference.parse_args_section(doc) == {"a": "first line continued.", "b": "second."}


def test_an_undocumented_knob_is_refused(monkeypatch) -> None:
    @dataclasses.dataclass
    class Knobs:
        """Knobs.

        Args:
            documented: yes.
        """

        documented: str = "x"
        secret: int = 3

    monkeypatch.setattr(knob_reference, "_classes", lambda: [("t", "w", Knobs)])
    with pytest.raises(SystemExit, match="Knobs.secret: no Args entry"):
        knob_reference.render()


def test_a_stale_reference_fails_the_check(monkeypatch, tmp_path) -> None:
    stale = tmp_path / "KNOBS.md"
    stale.write_text(knob_reference.render().replace("items the ring holds", "items the ring once held"))
    monkeypatch.setattr(knob_reference, "OUT", stale)
    assert knob_reference.main(["--check"]) == 1
