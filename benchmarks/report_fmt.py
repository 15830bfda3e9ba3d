"""Formatting for ``report.py``: numbers, tables, provenance, targets and refusals, from results JSON.

Every helper renders what it is given and nothing else: a missing value (``None``, an absent key)
renders as ``—``; no helper computes a figure beyond unit conversion and rounding.
"""

from __future__ import annotations

from typing import Any

from report_headline import command, load_mark, record

DASH = "—"


def get(d: Any, *path: Any) -> Any:
    """``d[p0][p1]...``, or None where any step is missing."""
    for p in path:
        if isinstance(d, dict):
            d = d.get(p)
        elif isinstance(d, list) and isinstance(p, int) and -len(d) <= p < len(d):
            d = d[p]
        else:
            return None
    return d


def rows_of(d: dict[str, Any], key: str = "rows") -> list[dict[str, Any]]:
    """``d[key]``'s dict items (a list of rows), or [] where it is missing."""
    rows = d.get(key)
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def num(x: Any, nd: int = 2, suffix: str = "", scale: float = 1.0) -> str:
    """A number (``scale`` converts units), an integer with grouped thousands, yes/no, or ``—``."""
    if x is None or isinstance(x, dict | list):
        return DASH
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):
        return x
    if isinstance(x, int) and scale == 1.0 or nd == 0:
        return f"{x * scale:,.0f}".replace(",", " ") + suffix
    return f"{x * scale:.{nd}f}{suffix}"


def ms(x: Any, nd: int = 2) -> str:
    """Seconds as milliseconds."""
    return num(x, nd, scale=1e3)


def pct(x: Any, nd: int = 1, sign: bool = False) -> str:
    """A share as a percentage."""
    if x is None or isinstance(x, bool | str):
        return DASH
    return f"{100 * x:{'+' if sign else ''}.{nd}f}%"


def times(x: Any, nd: int = 2) -> str:
    """A ratio, ``2.16×``."""
    return num(x, nd, "×")


def both(a: str, b: str, sep: str = " / ") -> str:
    return DASH if a == DASH and b == DASH else f"{a}{sep}{b}"


def verdict(passed: Any) -> str:
    """A target as the JSON records it: met, **missed**, or ``—``."""
    return DASH if passed is None else ("met" if passed else "**missed**")


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return out


class Refusals:
    """Refused ratios as ``refused [n]`` in a cell and ``[n] refused: <reason>`` under the table."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def cell(self, reason: Any) -> str:
        text = str(reason)
        if text not in self.reasons:
            self.reasons.append(text)
        return f"refused [{self.reasons.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"- [{i}] refused: {r}" for i, r in enumerate(self.reasons, start=1)]


def _load(x: Any) -> str:
    return num(x[0]) if isinstance(x, list) and x else DASH


def provenance(name: str, doc: dict[str, Any]) -> str:
    """One line from a results file: commit, dirty flag, 1-minute load average at start and end,
    date, run length and command where recorded (``machine``, the top level or ``method``); a file
    without a command says "command not recorded", and a run that began at a load over 1.0 says it
    is not a headline (``report_headline``)."""
    src = record(doc)
    commit = src.get("git_commit")
    dirty = src.get("git_dirty")
    parts = [
        f"commit {commit[:7] if isinstance(commit, str) else DASH}",
        f"dirty={DASH if dirty is None else str(bool(dirty)).lower()}",
        f"load {_load(src.get('load_average_start'))} → {_load(src.get('load_average_end'))}",
    ]
    date = src.get("created_utc") or doc.get("created_utc") or doc.get("created")
    parts.append(str(date) if date else f"date {DASH}")
    wall = next(
        (doc[k] for k in ("wall_s", "wall_seconds", "seconds") if isinstance(doc.get(k), float)), None
    )
    if wall is not None:
        parts.append(f"{wall:.0f} s")
    cmd = command(doc)
    line = f"- Run `{name}`: " + ", ".join(parts)
    line += f"; command `{cmd}`" if cmd else "; command not recorded"
    mark = load_mark(doc)
    if mark:
        line += f"; {mark}"
    if doc.get("reanalysis"):
        line += "; re-analysed after the run (`reanalysis`)"
    for w in doc.get("warnings") or []:
        line += f"; warning: {w}"
    return line + "."


#: keys that name a target's cell, and the keys of its measured value
CELL_KEYS = ("nodes", "system", "sampler", "batch", "dim", "samples", "tokens_per_sample")
VALUE_KEYS = ("ratio", "fraction", "loaded_over_idle")


def cell_label(c: dict[str, Any]) -> str:
    name = " ".join(f"{k.replace('_', ' ')} {c[k]}" for k in CELL_KEYS if k in c)
    value = next((c[k] for k in VALUE_KEYS if c.get(k) is not None), None)
    text = f"{name}: {num(value)}"
    return text + (f" (bound {num(c['bound'])})" if c.get("bound") is not None else "")


def target_line(name: str, t: dict[str, Any]) -> str:
    """``- rule: met`` or ``**missed**`` with the cells that missed; a target's scalar figures beside."""
    passed = t.get("passed", t.get("pass"))
    line = f"- Target {t.get('rule') or t.get('target') or name}: {verdict(passed)}"
    missed = [c for c in t.get("cells") or [] if c.get("passed", c.get("pass")) is False]
    if missed:
        line += " (missed at " + "; ".join(cell_label(c) for c in missed) + ")"
    scalars = {k: v for k, v in t.items() if k not in ("rule", "target", "passed", "pass", "cells")}
    if scalars:
        line += "; " + kv(scalars)
    return line


def targets(t: Any) -> list[str]:
    """Targets as the JSON records them: a list of ``{target, passed, cells}``, or a dict of name ->
    bool (met / missed), name -> ``{rule, pass, cells}``, or name -> a recorded value."""
    if isinstance(t, list):
        return [target_line(str(i), x) for i, x in enumerate(t)]
    if not isinstance(t, dict) or not t:
        return []
    rules = [target_line(k, v) for k, v in t.items() if isinstance(v, dict) and ("cells" in v or "rule" in v)]
    flat = [
        f"{k} {verdict(v) if isinstance(v, bool) else (kv(v) if isinstance(v, dict) else num(v, 3))}"
        for k, v in t.items()
        if not (isinstance(v, dict) and ("cells" in v or "rule" in v))
    ]
    return (["- Targets: " + "; ".join(flat) + "."] if flat else []) + rules


def kv(d: dict[str, Any], labels: dict[str, str] | None = None, skip: tuple[str, ...] = ()) -> str:
    """``label value, ...`` for a flat dict (keys ending in ``_s``: seconds, three decimals)."""
    parts = []
    for k, v in d.items():
        if k in skip or isinstance(v, dict | list):
            continue
        seconds = k.endswith("_s") or "_s_" in k
        whole = isinstance(v, float) and v.is_integer() and not seconds
        nd = 3 if seconds else (0 if whole else 2)
        unit = " s" if seconds and isinstance(v, float) else ""
        parts.append(f"{(labels or {}).get(k, k.replace('_', ' '))} {num(v, nd, unit)}")
    return ", ".join(parts)
