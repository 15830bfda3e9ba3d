"""Does a baseline still wait on a long replay-buffer poll? Its waits say so.

verl's replay buffer re-reads TransferQueue every ``poll_interval`` (2 s as shipped). A trainer that
waits on such a poll waits whole periods: its generation waits (``stages["gen"]``) of a second or more
all sit at one offset from multiples of the period (0.02, 2.02, 4.02 s). Waits that end when the data
arrives scatter. ``long_poll`` flags a system whose long waits (>= ``MIN_WAIT_S``, at least
``MIN_LONG_WAITS`` of them) all fall within ``WINDOW_S`` of one offset modulo 1 s, which every period
that is a whole number of seconds shares. Standard library only.
"""

from __future__ import annotations

from typing import Any

MIN_WAIT_S, MIN_LONG_WAITS, WINDOW_S = 1.0, 3, 0.1


def long_poll(waits: list[float]) -> str | None:
    """Why ``waits`` look like a poll of a whole number of seconds (>= 1 s), or None."""
    long = sorted(w for w in waits if w >= MIN_WAIT_S)
    if len(long) < MIN_LONG_WAITS:
        return None
    offsets = sorted(w % 1.0 for w in long)
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)] + [1.0 - offsets[-1] + offsets[0]]
    spread = 1.0 - max(gaps)  # the narrowest arc (mod 1 s) holding every offset
    if spread > WINDOW_S:
        return None
    shown = ", ".join(f"{w:.2f}" for w in long[:6])
    return (
        f"{len(long)} waits of >= {MIN_WAIT_S:g} s all within {spread:.3f} s of one offset modulo 1 s "
        f"({shown}{', ...' if len(long) > 6 else ''}): the baseline waited on a poll of >= 1 s"
    )


def poll_findings(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Every verl system in ``rows`` whose generation waits show a long poll -> why."""
    out: dict[str, str] = {}
    for system in sorted({str(r["system"]) for r in rows if not str(r["system"]).startswith("conduit")}):
        waits = [
            float(r["stages"]["gen"]) for r in rows if r["system"] == system and "gen" in r.get("stages", {})
        ]
        if why := long_poll(waits):
            out[system] = why
    return out
