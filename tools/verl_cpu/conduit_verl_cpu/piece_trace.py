"""The piece-size policy, traced and driven per step (harness only: the verl autotune benchmark).

``CONDUIT_VERL_G_SCHEDULE="4,1,16,..."``: the ``piece_groups`` of step 1, 2, ... (the last one repeats; 0 =
the whole step in one piece), so that one run measures several piece sizes under the same load and
data, the way the poll sweep measures verl's periods. The policy still fits every piece and still
updates its choice (``chosen``) as ``auto`` would; only the pieces it runs follow the schedule.

``CONDUIT_VERL_PIECE_TRACE=<file>``: one JSON line per step (conduit mode) with the ``g`` it ran,
its groups' finish times and work (tokens), its pieces, when its last piece ended (seconds from the
step's start), the policy's fit *before* the step (``a``, ``b``, ``per_token``, ``contention``), the exposed tail the
policy's model predicts for every candidate ``g`` on this step's finish times with that fit (so the
prediction has not seen the step it predicts), and ``auto``'s choice after the step.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

SCHEDULE_ENV = "CONDUIT_VERL_G_SCHEDULE"
TRACE_ENV = "CONDUIT_VERL_PIECE_TRACE"
_MODULE = "conduit.piece_policy"


def g_schedule(raw: str) -> list[int]:
    """``"4,1,0"`` -> ``[4, 1, 0]`` (groups per piece of step 1, 2, ...; 0 = the whole step)."""
    from conduit.errors import ConfigError

    try:
        values = [int(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise ConfigError(
            f"{SCHEDULE_ENV} must be whole numbers of groups >= 0, comma-separated, got {raw!r}"
        )
    return values


def scheduled_g(schedule: list[int], step: int, groups: int, unit: int) -> int:
    """The schedule's ``piece_groups`` for ``step`` (1-based), checked against the step's groups and unit."""
    from conduit.errors import ConfigError

    g = schedule[min(max(step, 1), len(schedule)) - 1] or groups
    if g > groups or g % unit:
        raise ConfigError(
            f"{SCHEDULE_ENV}: step {step} asks for pieces of {g} groups; a step has {groups} and pieces "
            f"are whole multiples of {unit}"
        )
    return g


def predicted_tails(
    policy: Any, finish: list[float], work: list[float], fit: tuple[float, float, float, float]
) -> dict[int, float]:
    """Exposed tail (end of the last piece after the last group finished) the policy's model predicts
    for each candidate ``g`` on these finish times, with the fit ``(a, b, per_token, contention)``."""
    from conduit.piece_policy import simulate

    a, b, c, k = fit
    last = finish[-1] if finish else 0.0
    return {
        g: simulate(finish, g, a, b, policy.unit, work, k, c) - last
        for g in range(policy.unit, policy.groups + 1, policy.unit)
    }


def install() -> None:
    """Wrap ``PiecePolicy`` (no-op unless one of the two variables is set)."""
    raw, path = os.environ.get(SCHEDULE_ENV, ""), os.environ.get(TRACE_ENV, "")
    if not raw and not path:
        return
    from conduit.piece_policy import PiecePolicy

    if getattr(PiecePolicy, "_conduit_traced", False):
        return
    schedule = g_schedule(raw) if raw else None
    piece_groups, begin_step = PiecePolicy.piece_groups, PiecePolicy.begin_step
    record_piece, record_step = PiecePolicy.record_piece, PiecePolicy.record_step
    record_rows = PiecePolicy.record_rows

    @functools.wraps(piece_groups)
    def traced_piece_groups(self: Any) -> int:
        if schedule is None:
            return piece_groups(self)
        return scheduled_g(schedule, self.steps, self.groups, self.unit)

    @functools.wraps(begin_step)
    def traced_begin_step(self: Any, now: float) -> int:
        fit = None
        if len(self.pieces):
            cost, k = self.fitted()
            fit = (cost.a, cost.b, cost.per_byte, k)
        self._trace = {"fit": fit, "pieces": []}
        g = begin_step(self, now)
        self._trace["g"] = g
        return g

    @functools.wraps(record_piece)
    def traced_record_piece(
        self: Any,
        groups: int,
        seconds: float,
        overlapped: bool = False,
        work: Any = None,
        tokens: float | None = None,
    ) -> None:
        piece = {"groups": groups, "seconds": seconds, "overlapped": overlapped, "tokens": tokens}
        piece["work"] = [float(w) for w in work] if work is not None else None
        getattr(self, "_trace", {"pieces": []})["pieces"].append(piece)
        record_piece(self, groups, seconds, overlapped, work, tokens)

    @functools.wraps(record_rows)
    def traced_record_rows(self: Any, seconds: float, tokens: float) -> None:
        rows = {"rows": True, "seconds": seconds, "tokens": float(tokens), "overlapped": True}
        getattr(self, "_trace", {"pieces": []})["pieces"].append(rows)
        record_rows(self, seconds, tokens)

    @functools.wraps(record_step)
    def traced_record_step(self: Any, finish: list[float], ended: float | None = None) -> None:
        trace = getattr(self, "_trace", {"fit": None, "pieces": [], "g": None})
        done = sorted(finish)
        known = list(self._step_work) if len(self._step_work) == len(done) else None
        work = self._spread(done, known)
        record_step(self, finish, ended)
        if not path:
            return
        fit = trace["fit"]
        line = {
            "step": self.steps,
            "g": trace["g"],
            "finish": done,
            "work": work,
            "ended": ended,
            "tail": (ended - done[-1]) if ended is not None and done else None,
            "pieces": trace["pieces"],
            "fit_before": dict(zip(("a", "b", "per_token", "contention"), fit, strict=True)) if fit else None,
            "predicted_tail": (
                {str(g): t for g, t in predicted_tails(self, done, work, fit).items()}
                if fit and len(done) == self.groups
                else None
            ),
            "chosen": self.chosen,
            "arm": self.arm,
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    PiecePolicy.piece_groups = traced_piece_groups  # type: ignore[method-assign]
    PiecePolicy.begin_step = traced_begin_step  # type: ignore[method-assign]
    PiecePolicy.record_piece = traced_record_piece  # type: ignore[method-assign]
    PiecePolicy.record_step = traced_record_step  # type: ignore[method-assign]
    PiecePolicy.record_rows = traced_record_rows  # type: ignore[method-assign]
    PiecePolicy._conduit_traced = True  # type: ignore[attr-defined]


def hook() -> None:
    """Install now if the policy's module is loaded, else right after it is imported."""
    if _MODULE in sys.modules:
        install()
        return
    from conduit_verl._post_import import when_imported

    when_imported(_MODULE, install)
