"""How many groups a streamed piece waits for: a fixed ``g_ing``, or ``auto`` from measurements.

``auto`` has two parts.

The core's cost model (``conduit.costmodel``) picks how to stream. It keeps ``seconds = a + b *
groups + c * tokens`` for one piece's ingestion (an ``OperatorCost`` fitted by least squares over
recent pieces, the tokens in its third term: ``a`` is the per-call cost of the worker calls and TQ
round trips, ``b`` the cost per group — each group is one inference micro-batch, a forward call per
stage —, ``c`` the compute per token, ``seq_len`` summed over the piece's samples, because the groups
that finish last hold the longest responses and cost the most to ingest; with short responses the
per-group term dominates: a fit on tokens alone underrated a whole-batch piece by a third) and the
finish times and work of the last step's groups (from the completion channel; all groups are
submitted at once, so they finish in clusters, not at a rate; groups are matched to finish times in
the order they were taken, the lighter first within a piece). For each candidate ``g`` it replays
the streaming schedule on those finish times (the model's streaming composition, ``stream_end``,
with each piece costing its groups' work, ``contention`` times that while generation still runs:
wait for ``g`` groups, take every finished one, ingest, repeat) and keeps the ``g`` with the
shortest exposed tail (from the last group's finish to the end of the last piece), averaged over the
last ``PROBES`` steps' finish times. Tails within ``TIE`` of the shortest go to the larger ``g``
(fewer pieces, less work); the current ``g`` is kept unless another's tail is predicted
``HYSTERESIS`` shorter (timings are noisy). Hysteresis and ties are shares of the tail, not of the
step's end: a 0.15 s shorter tail is 40% of the tail but 2% of a 7 s step. Until a step has been
measured: four pieces (a quarter of the groups each), so the first fit sees pieces of different
work. The warm-up step's pieces are not recorded (first calls are slow for reasons of their own).

Where generation shares the cores or device, pieces ingested while it still runs
(``overlapped``) run slower than pieces ingested after it ended (each step's last piece). The fit
takes that into account: ``seconds = k^o * (a + b * groups + c * tokens)`` with ``o`` = 1 for
overlapped pieces (the core's ``fit_slowed``), so ``a``, ``b``, ``c`` are the pieces' own cost and
``contention = k`` (1 = separate hardware, ~2 = two equal jobs on the same cores). One line through both kinds would
read the slowdown as cost (light early pieces, slowed, as slow as the heavy last one: ``b`` fitted
to 0, ``a`` inflated, and the model then picks too few pieces). What the model leaves out is what
overlap costs generation: where the rollout shares the hardware (``rollout_hardware=shared``, verl's
hybrid engine) the policy takes it as the share ``1 - 1 / contention`` of the overlapped ingestion
time (two jobs slowing each other alike); where it has hardware of its own (``separate``) as nothing
— the slowdown ``contention`` measures is then the ingestion's alone (in the CPU mode's paced
rollout, the tiny model's real tokens; a GPU server does not wait for the trainer). A streamed step's
predicted gain over one whole-batch piece is then ``cost(all groups) - exposed tail - lost``, the
exposed tail being what streaming left after generation: from the last group's finish to the end of
the last piece (that piece's ingestion, plus any wait for an overlapped piece still running when
generation ended — where generation is short, pieces queue behind each other). While the median
gain of the last ``PROBES`` streamed steps, each re-predicted by the current fit, is over ``PAYS``
of the whole-batch cost, ``auto`` keeps streaming and measures nothing else (no whole-batch
probes); after the first streamed step alone it streams on (``MIN_STREAMED``: a fit from one step's
few pieces cannot tell yet). (A predicted loss is not acted on directly: the model leaves out how
generation itself is slowed and the fit may still be off; the measured periods below decide instead.)

Otherwise the step time decides whether to stream at all: the policy measures whole iterations
(start of one step to the start of the next) under the model's ``g`` ("stream") and under one
whole-batch piece ("whole", verl's schedule), ``PROBES`` of each, then runs the arm the model
favours on what it measured (stream while streaming hid ingestion — the whole batch's predicted
ingestion less the exposed tail, before any charge for generation — in the median of the last
streamed steps, or before there is one; the loss to generation is what the probes measure) unless
the other arm's median step is shorter by more than the noise (``NOISE`` of the favoured arm's median,
or the steps' own spread — the larger median absolute deviation of the two arms — if that is
larger: steps differ by their responses, and three steps of each arm cannot tell a difference
smaller than that), and re-measures the other every ``REPROBE_EVERY`` steps (medians over the last
``PROBES`` steps of each arm, so a drifting step time, e.g. longer responses, moves the choice
within a few steps). Any ``g`` gives the same samples and losses; only time differs.

Between runs (``piece_tuning.py``): a settled decision (the measured medians, or a predicted gain that
streams without probes) is kept per workload signature in the core's tuner cache; a later run of the
same workload starts from it after its warm-up step instead of probing, and re-measures the other arm
only every ``REPROBE_EVERY`` steps. When the mean tokens per sample drifts, the measurements are
dropped and the new workload's decision is recalled or probed afresh.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Sequence

from conduit.costmodel import CostWindow, OperatorCost, stream_end
from conduit_verl.piece_tuning import PieceChoice, PieceTuning

log = logging.getLogger(__name__)

#: pieces remembered for the cost fit
WINDOW = 32
#: relative predicted gain (of the exposed tail) needed to change ``g``
HYSTERESIS = 0.1
#: exposed tails within this share of the shortest are a tie (the larger ``g`` wins: fewer pieces)
TIE = 0.01
#: measured iterations per arm before choosing, and how often the other arm is re-measured
PROBES = 3
REPROBE_EVERY = 10
#: streamed steps measured before their predicted gains may stop streaming
MIN_STREAMED = 2
#: streaming is kept without whole-batch probes while its predicted gain exceeds this share of the
#: whole-batch ingestion cost
PAYS = 0.2
#: the least share of the favoured arm's median step the other arm must be shorter by to be run
NOISE = 0.02


def simulate(
    finish: list[float],
    g: int,
    a: float,
    b: float,
    unit: int,
    work: Sequence[float] | None = None,
    slowdown: float = 1.0,
    per_token: float = 0.0,
) -> float:
    """When the last piece's ingestion ends, for groups finishing at ``finish`` (sorted, seconds).

    Pieces are whole multiples of ``unit`` groups, at least ``g`` (never over what is left). A piece
    costs ``a + b * groups + per_token * (its groups' work)``, ``slowdown`` times that while
    generation still runs; ``work[i]`` is the work of the group finishing ``i``-th (the core's
    ``stream_end``).
    """
    return stream_end(finish, g, OperatorCost(a, b, per_token), unit, work, slowdown)


class PiecePolicy:
    """The next piece's ``g_ing``: fixed, or chosen by the cost model (``auto``); ``tuning`` keeps
    ``auto``'s decision between runs (None: every run decides afresh); ``separate_rollout``: the
    rollout has hardware of its own (``rollout_hardware=separate``)."""

    def __init__(
        self,
        g_ing: int | str,
        groups: int,
        unit: int,
        tuning: PieceTuning | None = None,
        separate_rollout: bool = False,
    ) -> None:
        self.setting = g_ing
        self.tuning = tuning
        #: generation runs on hardware of its own: overlapped ingestion costs it nothing
        self.separate_rollout = separate_rollout
        #: the arm came from the cache and both arms are not yet measured in this run
        self.recalled = False
        #: steps run in an arm only to measure it (the tuning cost)
        self.probe_steps = 0
        self._step_tokens = 0.0
        self.groups = groups
        self.unit = unit
        #: the pieces after the warm-up step; those ingested beside generation flagged ``slowed``
        self.pieces = CostWindow(WINDOW)
        self._fit: tuple[OperatorCost, float] | None = None
        #: (overlapped seconds, exposed tail seconds, work) of the last streamed steps
        self.streamed: deque[tuple[float, float, float]] = deque(maxlen=PROBES)
        self._overlapped_s = 0.0
        self._tail_s = 0.0
        self._step_pieces = 0
        self._step_work: list[float] = []
        self.finish: list[float] | None = None
        #: work of the last step's groups, in finish order (None: 1 per group), and its sum
        self.work: list[float] | None = None
        self.step_work = float(groups)
        #: (finish times, work) of the last complete steps: the candidates are replayed on each
        self.recent: deque[tuple[list[float], list[float]]] = deque(maxlen=PROBES)
        self.chosen = self._round(math.ceil(groups / 4))
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
            arm, reason, kind = self._pick_arm()
            if arm != self.arm:
                log.info("conduit g_ing=auto, step %d: %s -> %s (%s)", self.steps, self.arm, arm, reason)
            self.arm = arm
            self.probe_steps += kind == "probe"
            if kind == "settled" and self.tuning is not None:
                g = self.chosen if arm == "stream" else self.groups
                medians = {k: statistics.median(v) for k, v in self.periods.items() if v}
                self.tuning.keep(PieceChoice(arm, g), reason, medians)
        return self.g_ing()

    def _pick_arm(self) -> tuple[str, str, str]:
        """This step's arm, why, and what kind of choice it is: ``settled`` (a decision), ``probe``
        (measuring an arm), ``recalled`` (the cached decision, not yet re-measured) or ``open`` (the
        first streamed step: nothing to decide yet)."""
        pays = self.streaming_pays()
        if pays and len(self.streamed) >= MIN_STREAMED:
            gain = statistics.median(self.gains)
            return "stream", f"predicted gain {gain:.3f}s > {PAYS:g} x whole batch", "settled"
        stream, whole = self.periods["stream"], self.periods["whole"]
        measured = len(stream) >= PROBES and len(whole) >= PROBES
        if self.recalled and not measured and self.tuning is not None and self.tuning.kept is not None:
            kept = self.tuning.kept.arm
            if self.steps % REPROBE_EVERY == 0:
                other = "whole" if kept == "stream" else "stream"
                return other, f"re-measuring the other arm every {REPROBE_EVERY} steps", "probe"
            return kept, "the cached decision for this workload", "recalled"
        if pays:
            return "stream", "first streamed step", "open"
        if not measured:  # probe both, alternating
            arm = "whole" if len(whole) < len(stream) else "stream"
            return (
                arm,
                f"predicted gain small: measuring both ({len(stream)} stream, {len(whole)} whole of {PROBES})",
                "probe",
            )
        best, medians = self._measured_best()
        other = "whole" if best == "stream" else "stream"
        if self.steps % REPROBE_EVERY == 0:
            return other, f"re-measuring the other arm every {REPROBE_EVERY} steps; {medians}", "probe"
        return best, medians, "settled"

    def _measured_best(self) -> tuple[str, str]:
        """The arm to run once both were measured, and why: the model's favoured arm unless the
        other's median step is shorter by more than the noise (module docstring)."""
        med = {arm: statistics.median(v) for arm, v in self.periods.items()}
        hidden = [self.hidden_s(t, w or None) for _, t, w in self.streamed] if len(self.pieces) else []
        favoured = "stream" if not hidden or statistics.median(hidden) > 0 else "whole"
        other = "whole" if favoured == "stream" else "stream"
        spread = max(_mad(self.periods["stream"]), _mad(self.periods["whole"]))
        margin = max(NOISE * med[favoured], spread)
        best = other if med[other] < med[favoured] - margin else favoured
        why = (
            f"median step stream {med['stream']:.3f}s, whole {med['whole']:.3f}s; the model favours "
            f"{favoured}, {other} must be {margin:.3f}s shorter (the larger of {NOISE:.0%} and the steps' spread)"
        )
        return best, why

    def record_piece(
        self, groups: int, seconds: float, overlapped: bool = False, work: Sequence[float] | None = None
    ) -> None:
        """One piece of ``groups`` took ``seconds`` of ingestion; ``overlapped``: generation was
        still running (groups of the step were left to generate when it started); ``work``: each
        group's work (tokens; None: 1 per group)."""
        self._step_tokens += float(sum(work)) if work is not None else 0.0
        if self.steps == 1:  # the warm-up step: its first calls are slow for reasons of their own
            return
        per_group = sorted(work) if work is not None else [1.0] * groups
        items = float(sum(per_group))
        self.pieces.record(1, float(len(per_group)), seconds, nbytes=items, slowed=overlapped)
        self._fit = None
        self._step_pieces += 1
        self._step_work += per_group
        if overlapped:
            self._overlapped_s += seconds
        else:
            self._tail_s = seconds

    def record_step(self, finish: list[float], ended: float | None = None) -> None:
        """The step's group finish times (seconds from its start) and when its last piece's ingestion
        ended (same origin; None: unknown); re-choose ``g`` for ``auto``."""
        self.finish = sorted(finish)
        if len(self._step_work) == len(self.finish):
            self.work = self._step_work
        if self._step_work:
            self.step_work = float(sum(self._step_work))
        if len(self.finish) == self.groups:
            self.recent.append((self.finish, self._spread(self.finish, self.work)))
            if self.setting == "auto" and len(self.pieces):
                before, self.chosen = self.chosen, self.best()
                if self.chosen != before:
                    log.info(
                        "conduit g_ing=auto: %d -> %d groups per piece (%s)", before, self.chosen, self._why()
                    )
        if self._step_pieces > 1 and len(self.pieces):
            tail = self._tail_s
            if ended is not None and finish:  # the exposed tail, waits for earlier pieces included
                tail = max(tail, ended - max(finish))
            self.streamed.append((self._overlapped_s, tail, float(sum(self._step_work))))
        if self.tuning is not None and self.setting == "auto" and len(self.finish) == self.groups:
            self._follow_workload(self._step_tokens / self.tuning.samples)
        self._overlapped_s, self._tail_s, self._step_pieces, self._step_work = 0.0, 0.0, 0, []
        self._step_tokens = 0.0

    def _follow_workload(self, tokens_per_sample: float) -> None:
        """After the warm-up step, start from the cached decision; once the workload drifted, drop
        the measurements and recall (or probe) the new workload's decision."""
        assert self.tuning is not None
        if self.tuning.signature is not None:  # recalled once already: only a drift re-opens it
            if not self.tuning.drifted(tokens_per_sample):
                return
            for periods in self.periods.values():
                periods.clear()
            self.streamed.clear()
        hit = self.tuning.recall(tokens_per_sample)
        self.recalled = hit is not None
        if hit is not None:
            choice = hit[0]
            self.arm = choice.arm
            if choice.arm == "stream":
                self.chosen = self._round(choice.g_ing)

    def fitted(self) -> tuple[OperatorCost, float]:
        """The pieces' own cost (as if run alone) and how much slower pieces ran beside generation
        (the core's :func:`~conduit.costmodel.fit_slowed` over the window; cached until the next piece)."""
        if self._fit is None:
            self._fit = self.pieces.fit_slowed()
        return self._fit

    def contention(self) -> float:
        """How much slower pieces ingested beside generation ran than pieces after it (1.0 until both
        kinds were measured)."""
        return self.fitted()[1] if len(self.pieces) else 1.0

    def predicted_gain(self, overlapped_s: float, tail_s: float, work: float | None = None) -> float:
        """Seconds a streamed step saved against one whole-batch piece: the whole batch's predicted
        ingestion (of ``work``; None: the last step's), less the exposed tail, less what overlapped
        pieces cost generation (nothing where the rollout has hardware of its own)."""
        lost = 0.0 if self.separate_rollout else overlapped_s * (1.0 - 1.0 / self.contention())
        return self.hidden_s(tail_s, work) - lost

    def hidden_s(self, tail_s: float, work: float | None = None) -> float:
        """Ingestion a streamed step hid: the whole batch's predicted ingestion (of ``work``; None:
        the last step's) less the exposed tail it left."""
        return self.whole_s(work) - tail_s

    @property
    def gains(self) -> list[float]:
        """Predicted gains of the last streamed steps, by the current fit (a fit from one step's few
        pieces can be far off; each new piece refines the gains of earlier steps too)."""
        if not len(self.pieces):
            return []
        return [self.predicted_gain(o, t, w or None) for o, t, w in self.streamed]

    def whole_s(self, work: float | None = None) -> float:
        """Predicted ingestion of the whole batch in one piece (``work``; None: the last step's)."""
        return self.fitted()[0].seconds(self.groups, self.step_work if work is None else work)

    def streaming_pays(self) -> bool:
        """The median predicted gain of the last streamed steps is over ``PAYS`` of the whole batch's
        ingestion: keep streaming, with no whole-batch probes. After one streamed step only, streaming
        goes on (its fit, from that step's few pieces, cannot yet tell)."""
        if not self.streamed or not len(self.pieces) or self.chosen >= self.groups:
            return False
        if len(self.streamed) < MIN_STREAMED:
            return True
        return statistics.median(self.gains) > PAYS * self.whole_s()

    def report(self) -> dict[str, float]:
        """The policy's view for the step's metrics (``conduit/...``)."""
        a, b = self.cost() if len(self.pieces) else (0.0, 0.0)
        return {
            "a_s": a,
            "b_s": b,
            "per_token_s": self.per_token(),
            "chosen": float(self.chosen),
            "contention": self.contention(),
            "predicted_gain_s": self.gains[-1] if self.gains else 0.0,
            "probing": float(self.setting == "auto" and not self.streaming_pays()),
            "probe_steps": float(self.probe_steps),
            "recalled": float(self.recalled),
        }

    def cost(self) -> tuple[float, float]:
        """``(a, b)`` of ``seconds = a + b * groups + c * tokens`` (the core's least-squares fit over
        the window; ``c``: :meth:`per_token`)."""
        fit = self.fitted()[0]
        return fit.a, fit.b

    def _why(self) -> str:
        """The fit and the predicted tail of the chosen ``g``, for the log."""
        cost, k = self.fitted()
        fit = f"a {cost.a:.3f}s, {cost.b:.4f}s/group, {cost.per_byte * 1e3:.4f}ms/token, contention {k:.2f}"
        tail = self._tails()[self.chosen]
        steps = len(self.recent)
        return (
            f"predicted exposed tail {tail:.3f}s, the shortest within {TIE:.0%}, over {steps} step(s); {fit}"
        )

    def per_token(self) -> float:
        """``c`` of ``seconds = a + b * groups + c * tokens`` (0 until measured, or where tokens
        moved with groups in every piece)."""
        return self.fitted()[0].per_byte if len(self.pieces) else 0.0

    def _spread(self, finish: list[float], work: list[float] | None) -> list[float]:
        """Each group's work in finish order; unknown: the step's work spread evenly."""
        if work is None or len(work) != len(finish):  # the fit is per unit of work: spread it
            return [self.step_work / max(len(finish), 1)] * len(finish)
        return work

    def best(self) -> int:
        """The candidate ``g`` with the shortest mean predicted exposed tail (end of the last piece
        after the last group finished) over the last steps' finish times (one step's clusters of
        finishing groups would over-fit the choice), by the current fit."""
        tails = self._tails()
        first = min(tails.values())
        if tails.get(self.chosen, math.inf) <= first * (1 + HYSTERESIS):
            return self.chosen
        return max(g for g, tail in tails.items() if tail <= first * (1 + TIE))

    def _tails(self) -> dict[int, float]:
        """Each candidate ``g``'s predicted exposed tail, averaged over the last steps, by the current fit."""
        cost, k = self.fitted()
        return {
            g: statistics.fmean(
                stream_end(f, g, cost, self.unit, w, k) - (f[-1] if f else 0.0) for f, w in self.recent
            )
            for g in range(self.unit, self.groups + 1, self.unit)
        }


def _mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values)
