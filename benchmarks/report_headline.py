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


#: the verdicts a stored headline can carry (``intervals.py``), and how the page shows them
SHOWN = {"met": "met", "missed": "**missed**", "no difference resolved": "no difference resolved"}


def verdict_cell(h: dict[str, Any], eligible: tuple[bool, str]) -> str:
    """A stored headline's verdict as the page shows it: its own verdict (met, **missed**, no
    difference resolved), "refused" or "not a headline" with why, or "not a headline" when the file's
    provenance does not allow one (``headline_eligible``)."""
    v = str(h.get("verdict"))
    if v in ("refused", "not a headline"):
        return f"{v}: {h.get('why')}"
    if not eligible[0]:
        return f"not a headline ({eligible[1]}); the interval reads {v}"
    return SHOWN.get(v, v)


def _n(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) and not isinstance(x, bool) else "—"


def interval_cell(h: dict[str, Any]) -> tuple[str, str]:
    """(ratio, ``[lo, hi]`` with its level and rounds) of a stored headline; dashes where missing."""
    i = _dict(h.get("interval"))
    if not isinstance(i.get("ratio"), int | float):
        return "—", "—"
    level = i.get("level")
    shown = f"{100 * level:.0f}%" if isinstance(level, int | float) else "—"
    rounds = i.get("rounds") if isinstance(i.get("rounds"), int) else "—"
    return f"{_n(i['ratio'])}×", f"[{_n(i.get('lo'))}, {_n(i.get('hi'))}] ({shown}, {rounds} rounds)"


def headline_rows(docs: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One table row per headline a results file stores (``headlines``), file by file."""
    rows = []
    for name, doc in docs.items():
        eligible = headline_eligible(doc)
        for h in doc.get("headlines") or []:
            if isinstance(h, dict):
                ratio, interval = interval_cell(h)
                target = str(h.get("target_reads") or "—")
                rows.append(
                    [str(h.get("claim")), ratio, interval, target, verdict_cell(h, eligible), f"`{name}`"]
                )
    return rows


def headline_section(docs: dict[str, dict[str, Any]]) -> list[str]:
    """The page's opening table: every stored headline claim, its ratio, interval, target, verdict and
    file; then which results files hold none (made before these rules: their targets are point
    estimates)."""
    head = ["claim", "ratio", "interval", "target", "verdict", "results file"]
    rows = headline_rows(docs)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    older = sorted(n for n, d in docs.items() if d and not d.get("headlines"))
    return [
        *(lines if rows else ["No results file holds a headline made under these rules yet."]),
        "",
        "- A headline ratio rests on at least 3 rounds of the two systems it compares, adjacent, their "
        "order reversed each round, at least 8 measured iterations a round; its 90% interval is a bootstrap "
        "of the ratio of medians, iterations resampled within rounds, rounds paired (`benchmarks/intervals.py`). "
        "It reads met only when the whole interval lies inside the target, and no difference resolved when "
        "the interval holds 1.0.",
        "- Results files with no headline made under these rules (their sections' targets read point "
        "estimates, not verdicts): " + ", ".join(f"`{n}`" for n in older) + ".",
        "",
    ]


def headline_lines(label: str, doc: dict[str, Any]) -> list[str]:
    """Under a section's table: the file's stored headlines (ratio, interval, verdict) and which
    baselines' waits sat on a >= 1 s poll (``poll_check``); nothing for a file from before the rules."""
    out = []
    eligible = headline_eligible(doc)
    for h in doc.get("headlines") or []:
        if isinstance(h, dict):
            ratio, interval = interval_cell(h)
            out.append(
                f"- {label}: headline {h.get('claim')}: {ratio} {interval}, target {h.get('target_reads')}: "
                f"{verdict_cell(h, eligible)}."
            )
    polls = doc.get("poll_check")
    if isinstance(polls, dict):
        found = "; ".join(f"{s}: {why}" for s, why in polls.items())
        out.append(f"- {label}: baselines waiting on a poll of >= 1 s: {found or 'none'}.")
    return out
