"""May a results file carry a headline? What its provenance records, read for ``report.py``.

A run may be quoted as a headline only when its provenance says it was made cleanly: the command that
made it is recorded, the tree was not dirty, and the 1-minute load average at its start was at most
:data:`LOAD_LIMIT` (this is a 2-core machine: above 1.0 something else held a core when it began).
Standard library only.
"""

from __future__ import annotations

from typing import Any

#: the highest 1-minute load average at a run's start that still allows a headline
LOAD_LIMIT = 1.0


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def record(doc: dict[str, Any]) -> dict[str, Any]:
    """Where the file keeps its provenance: ``machine`` when it holds the commit, else the top level."""
    m = _dict(doc.get("machine"))
    return m if "git_commit" in m else doc


def command(doc: dict[str, Any]) -> str | None:
    """The recorded command line (``machine``, the top level or ``method``), or None."""
    m, method = _dict(doc.get("machine")), _dict(doc.get("method"))
    cmd = m.get("command") or doc.get("command") or method.get("command")
    return cmd if isinstance(cmd, str) and cmd else None


def load_at_start(doc: dict[str, Any]) -> float | None:
    """The 1-minute load average when the run began, or None where it is not recorded."""
    load = record(doc).get("load_average_start")
    first = load[0] if isinstance(load, list) and load else None
    return float(first) if isinstance(first, int | float) and not isinstance(first, bool) else None


def cores(doc: dict[str, Any]) -> int | None:
    """The machine's CPU count where recorded (``machine.cpus``)."""
    n = _dict(doc.get("machine")).get("cpus")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def load_mark(doc: dict[str, Any]) -> str | None:
    """``started at load X > 1.0 on N cores: not a headline`` where the start load exceeds the limit."""
    load = load_at_start(doc)
    if load is None or load <= LOAD_LIMIT:
        return None
    on = f" on {cores(doc)} cores" if cores(doc) else ""
    return f"started at load {load:.2f} > {LOAD_LIMIT:.1f}{on}: not a headline"


def headline_eligible(doc: dict[str, Any]) -> tuple[bool, str]:
    """(True, "") when ``doc`` may carry a headline; else (False, the reasons joined by "; ")."""
    reasons = []
    if command(doc) is None:
        reasons.append("command not recorded")
    if record(doc).get("git_dirty") is True:
        reasons.append("made from a dirty tree")
    mark = load_mark(doc)
    if mark is not None:
        reasons.append(mark.removesuffix(": not a headline"))
    return (not reasons, "; ".join(reasons))
