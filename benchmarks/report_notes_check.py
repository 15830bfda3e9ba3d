"""Figures no file holds: every measured figure a note quotes must be one the page renders from JSON.

The rule. A note (``benchmarks/notes/*.md``) quotes a *measurement* when it writes a decimal
(``0.715``, ``1.22×``, ``23.8%``) or a whole number with a unit of time, size, rate or ratio
(``124 ms``, ``61 GiB``, ``56%``, ``2x``, ``300 steps/s``). Every such figure must equal, as a number
(``0.50`` is ``0.5``; no rounding: quote a figure as the page renders it), some number that the note's
own section (its top-level ``##`` section, subsections included) renders from
``benchmarks/results/*.json``, notes left out; a note of no section (the intro) is checked against the
whole page without notes. The section, not the page, so that a figure cannot pass by matching an
unrelated number elsewhere on a page of thousands.

Not measurements, and so not checked: anything inside a code span (`` `--poll 0.02` ``, settings
and commands); version numbers (``0.9.1``, or a decimal right after a package name: ``RLlib 2.60``);
dates, clock times and commits; a figure right after ``≤ ≥ < > ±`` (a target or tolerance);
a number glued to letters (``p99``, ``H100``, ``fp32``, ``64×64``); and bare whole numbers without a
unit (counts: seeds, iterations, issue numbers). Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

#: names after which a decimal is a version (``RLlib 2.60``), matched case-insensitively
PACKAGES = (
    "python|torch|torchrl|ray|rllib|verl|vllm|mujoco|meta-world|metaworld|gymnasium|transformers"
    "|numpy|ale|glibc|cuda|transferqueue|simpy"
)
#: units after a whole number that make it a measurement (time, size, rate, share, ratio)
UNITS = r"(?:ms|µs|us|ns|s|min|h|GiB|MiB|KiB|GB|MB|KB|TB|%|×|x|steps/s|tokens/s|/s)"

_REMOVE = (
    r"`[^`]*`",  # code spans
    r"\b\d{4}-\d{2}-\d{2}(?:T[\d:+]+)?",  # dates
    r"\b\d{1,2}:\d{2}(?::\d{2})?",  # clock times
    r"\b\d+(?:\.\d+){2,}\S*",  # x.y.z versions
    rf"(?i)\b(?:{PACKAGES})\s+v?\d+(?:\.\d+)*",  # a package's version
    r"\bv\d+(?:\.\d+)*",  # v1.2
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b",  # commits
    r"[≤≥<>±]=?\s*\d[\d,]*(?:\.\d+)?",  # targets and tolerances
)
_NUMBER = r"(?<![\w.,/])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.,/])\d+(?:\.\d+)?"
_FIGURE = re.compile(rf"({_NUMBER})(?:\s?({UNITS}))?(?![\w.]*\d)(?!\w)")
_PAGE_NUMBER = re.compile(r"\d{1,3}(?:[ ,]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Unheld:
    """A figure a note quotes that the page does not render from any results file."""

    note: str
    figure: str

    def __str__(self) -> str:
        return f"benchmarks/notes/{self.note}: {self.figure!r} is not a figure the page renders from JSON"


def _value(text: str) -> Decimal | None:
    try:
        return Decimal(re.sub(r"[ ,]", "", text))
    except InvalidOperation:
        return None


def figures(note: str) -> list[str]:
    """The measured figures ``note`` quotes, as written (number and unit), in order."""
    text = note
    for pattern in _REMOVE:
        text = re.sub(pattern, " ", text)
    out = []
    for m in _FIGURE.finditer(text):
        number, unit = m.group(1), m.group(2)
        if "." in number or unit:
            out.append(number + (f" {unit}" if unit and unit not in "%×x" else unit or ""))
    return out


def page_numbers(page: str) -> set[Decimal]:
    """Every number in the rendered page (thousands grouped by a space or a comma, or not at all)."""
    out = set()
    for m in _PAGE_NUMBER.finditer(page):
        for text in (m.group(0), *re.split(r"[ ,]", m.group(0))):
            v = _value(text)
            if v is not None:
                out.add(v)
    return out


def unheld(notes: dict[str, str], scopes: dict[str, str], page: str) -> list[Unheld]:
    """Each (note, figure) whose figure is not a number of the note's scope: ``scopes[note]`` (the text
    the note's section renders from JSON), or ``page`` (the whole page without notes) where none."""
    held = {text: page_numbers(text) for text in {page, *scopes.values()}}
    return [
        Unheld(name, f)
        for name, text in sorted(notes.items())
        for f in figures(text)
        if _value(f.split(" ")[0].rstrip("%×x")) not in held[scopes.get(name, page)]
    ]


def read_notes(folder: Path) -> dict[str, str]:
    """``benchmarks/notes/*.md`` by file name."""
    return {p.name: p.read_text() for p in sorted(folder.glob("*.md"))}
