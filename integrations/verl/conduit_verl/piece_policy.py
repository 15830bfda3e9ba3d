"""How many groups a streamed piece waits for: a fixed ``g_ing``, or ``auto`` from measurements.

``auto`` has two parts.

The core's cost model (``conduit.costmodel``) picks how to stream. It keeps
``seconds = a + b * groups`` for one piece's ingestion (an ``OperatorCost`` fitted by least squares
over recent pieces: ``a`` is the per-call cost of the worker calls and TQ round trips, ``b`` the
per-group compute) and the finish times of the last step's groups (from the completion channel; all
groups are submitted at once, so they finish in clusters, not at a rate). For each candidate ``g`` it
replays the streaming schedule on those finish times (the model's streaming composition,
``stream_end``: wait for ``g`` groups, take every finished one, ingest, repeat) and keeps the ``g``
whose last piece is ingested first — the exposed tail. Ties go to the larger ``g`` (fewer pieces,
less work); the current ``g`` is kept unless another is predicted ``HYSTERESIS`` faster (timings
are noisy). Until a step has been measured: two pieces (half the groups each).

The model cannot see what overlap costs generation when both share the same cores or device
(ingestion during generation slows it). So the step time decides whether to stream at all: the
policy measures whole iterations (start of one step to the start of the next) under the model's
``g`` ("stream") and under one whole-batch piece ("whole", verl's schedule), ``PROBES`` of each
after the warm-up step, then runs the arm with the lower median and re-measures the other every
``REPROBE_EVERY`` steps (medians over the last ``PROBES`` steps of each arm, so a drifting step time,
e.g. longer responses, moves the choice within a few steps). Any ``g`` gives the same samples and
losses; only time differs.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from conduit.costmodel import CostWindow, OperatorCost, stream_end

#: pieces remembered for the cost fit
WINDOW = 32
#: relative predicted gain needed to change ``g``
HYSTERESIS = 0.05
#: measured iterations per arm before choosing, and how often the other arm is re-measured
PROBES = 3
REPROBE_EVERY = 10


def simulate(finish: list[float], g: int, a: float, b: float, unit: int) -> float:
    """When the last piece's ingestion ends, for groups finishing at ``finish`` (sorted, seconds).

    Pieces are whole multiples of ``unit`` groups, at least ``g`` (never over what is left).
    """
    return stream_end(finish, g, OperatorCost(a, b), unit)


class PiecePolicy:
    """The next piece's ``g_ing``: fixed, or chosen by the cost model (``auto``)."""

    def __init__(self, g_ing: int | str, groups: int, unit: int) -> None:
        self.setting = g_ing
        self.groups = groups
        self.unit = unit
        self.pieces = CostWindow(WINDOW)
        self.finish: list[float] | None = None
        self.chosen = self._round(math.ceil(groups / 2))
        self.periods: dict[str, deque[float]] = {
            "stream": deque(maxlen=PROBES),
            "whole": deque(maxlen=PROBES),
        }
        self.arm = "stream"
        self.steps = 0
        self._t_step: float | None = None

    def _round(self, g: int) -> int:
        """Up to a whole number of units, within [unit, groups]."""
        return min(self.groups, max(self.unit, math.ceil(g / self.unit) * self.unit))

    def g_ing(self) -> int:
        """Groups the next piece waits for (0 in the settings means the whole step, one piece)."""
        if self.setting == "auto":
            return self.chosen if self.arm == "stream" else self.groups
        return int(self.setting) or self.groups

    def begin_step(self, now: float) -> int:
        """A step starts at ``now`` (seconds, monotonic): close the last iteration's measurement,
        pick this step's arm; return its ``g_ing``."""
        if self._t_step is not None and self.steps > 1:  # the first iteration is warm-up
            self.periods[self.arm].append(now - self._t_step)
        self._t_step = now
        self.steps += 1
        if self.setting == "auto" and self.steps > 1:
            self.arm = self._pick_arm()
        return self.g_ing()

    def _pick_arm(self) -> str:
        stream, whole = self.periods["stream"], self.periods["whole"]
        if len(stream) < PROBES or len(whole) < PROBES:  # probe both, alternating
            return "whole" if len(whole) < len(stream) else "stream"
        best = "stream" if statistics.median(stream) <= statistics.median(whole) else "whole"
        other = "whole" if best == "stream" else "stream"
        return other if self.steps % REPROBE_EVERY == 0 else best

    def record_piece(self, groups: int, seconds: float) -> None:
        """One piece of ``groups`` took ``seconds`` of ingestion."""
        self.pieces.record(1, groups, seconds)

    def record_step(self, finish: list[float]) -> None:
        """The step's group finish times (seconds from its start); re-choose ``g`` for ``auto``."""
        self.finish = sorted(finish)
        if self.setting == "auto" and len(self.finish) == self.groups and len(self.pieces):
            a, b = self.cost()
            self.chosen = self.best(a, b)

    def cost(self) -> tuple[float, float]:
        """``(a, b)`` of ``seconds = a + b * groups`` (the core's least-squares fit over the window)."""
        fit = self.pieces.fit()
        return fit.a, fit.b

    def best(self, a: float, b: float) -> int:
        """The candidate ``g`` with the earliest predicted end of the last piece."""
        assert self.finish is not None
        candidates = range(self.unit, self.groups + 1, self.unit)
        ends = {g: simulate(self.finish, g, a, b, self.unit) for g in candidates}
        first = min(ends.values())
        if ends.get(self.chosen, math.inf) <= first * (1 + HYSTERESIS):
            return self.chosen
        return max(g for g, end in ends.items() if end <= first * 1.001)
