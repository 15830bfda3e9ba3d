"""The page's lines on whether ``scaling.json``'s modelled scale is validated (issue 47), for
``report_ops.scaling``: the verdict, the poll, and the held-out ratio table. A file without
``validation.ratio`` was made before the rules and reads "not validated". Nothing is computed beyond
what the file records."""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, get, num, table

Doc = dict[str, Any]


def validated(d: Doc) -> bool:
    """Whether the file's modelled scale passed the ratio validation (False for a file without one)."""
    return get(d, "validation", "ratio", "validated") is True


def verdict_lines(d: Doc) -> list[str]:
    """The verdict and the poll: one line for a file from before the rules, else the verdict with its
    reason, the poll and the held-out table."""
    v = get(d, "validation", "ratio")
    if not isinstance(v, dict):
        poll = get(d, "calibration", "poll_s")
        shown = f"{poll:g} s" if isinstance(poll, int | float) else "verl's shipped"
        return [
            f"- Modelled scale: **not validated**: made before issue 47's rules ({shown} SimpleStorage poll, "
            "ratio not validated); its modelled figures are not a result.",
            "",
        ]
    word = "validated" if v.get("validated") is True else "**not validated**"
    poll = get(d, "summary", "simplestorage_poll_s")
    measured_poll = get(d, "measured", "setup", "poll_s")
    out = [
        f"- Modelled scale: {word} ({v.get('why', DASH)}). Rule: {v.get('rule', DASH)}.",
        f"- SimpleStorage's replay-buffer poll: {num(poll, 2)} s modelled, {num(measured_poll, 2)} s measured.",
        f"- Claimed effect at {num(v.get('claimed_at_gpus'))} GPUs: conduit ÷ tq_simplestorage "
        f"{num(v.get('claimed_ratio'), 3)}, |1 − ratio| {num(v.get('claimed_effect'), 3)}; tolerance "
        f"{num(v.get('tolerance'), 3)} (below the effect: {num(v.get('tolerance_below_effect'))}).",
        "",
    ]
    head = ["held-out nodes", "measured ratio", "modelled ratio", "difference", "within tolerance"]
    rows = [
        [num(r.get("nodes"), 0), num(r.get("measured_ratio"), 3), num(r.get("modelled_ratio"), 3),
         num(r.get("difference"), 3), num(r.get("within"))]
        for r in v.get("held_out") or []
    ]  # fmt: skip
    return out + table(head, rows) + [""]


def offpath_line(refit: Doc) -> list[str]:
    """The off-path diagnostic (not in the calibration), where the file has one."""
    diag = refit.get("offpath_diagnostic")
    if not isinstance(diag, dict):
        return []
    held = "; ".join(
        f"{t.get('system')} {num(t.get('nodes'), 0)} nodes {num(t.get('ratio'), 3)}"
        for t in diag.get("per_iteration_held_out") or []
    )
    return [
        f"- Diagnostic, not in the calibration: an off-path term fitted on the measuring host "
        f"({num(diag.get('offpath_s'), 2, scale=1e3)} ms a store message) would put the held-out "
        f"iterations at predicted ÷ measured {held or DASH}; {diag.get('why', DASH)}.",
        "",
    ]
