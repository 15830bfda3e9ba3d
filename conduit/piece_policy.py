"""How many groups a streamed ingestion piece waits for: fixed, or ``auto`` (the tuner's streaming strategy).

Groups of samples finish one after another while a producer still runs (verl's GRPO groups while
the rollout generates); a streamed step ingests them in pieces of at least ``g`` groups as they
finish, a whole-batch step in one piece after the last. ``auto`` picks the arm and ``g``. Its model
is the core's cost model: it fits a piece's ingestion ``k^o * (a + b * groups + c * tokens)`` over
recent pieces (``CostWindow.fit_slowed``; ``o`` = 1 for pieces ingested while the producer still
ran, ``k`` the contention; ``tokens``: the work the piece's per-sample stages ran on; per-sample
calls made before their groups finished count as pieces of no group, :meth:`PiecePolicy.record_rows`),
replays the streaming schedule (``stream_end``) on the last steps' group finish times for every
candidate ``g``, and keeps the ``g`` with the shortest predicted exposed tail (ties within ``TIE`` go
to the larger ``g``; the current ``g`` stays unless another is clearly shorter, by the core's noise
rule). Whether to stream at all: while streaming's predicted gain over one whole-batch piece exceeds
``PAYS`` of that piece's cost (after ``MIN_STREAMED`` streamed steps), it streams without measuring
anything else; otherwise the core's :class:`~conduit.tuner_loop.LoopTuner` measures whole steps of
both arms (``stream`` at the model's ``g``, ``whole``: one piece) and runs the arm the model favours
unless the other is clearly faster, keeping the decision per workload in the tuner cache and
re-opening it when tokens per sample drift. Any ``g`` gives the same samples; only time differs.
The verl trainer mode's knob is ``piece_groups``; the reasoning and measurements behind each rule:
``integrations/verl/NOTES.md``.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from conduit.costmodel import CostWindow, OperatorCost, stream_end
from conduit.tuner import ChoiceCache, Signature, clearly_faster
from conduit.tuner_loop import LoopTuner, Turn

log = logging.getLogger(__name__)

#: pieces remembered for the cost fit
WINDOW = 32
#: exposed tails within this share of the shortest are a tie (the larger ``g`` wins: fewer pieces)
TIE = 0.01
#: measured steps per arm (and steps replayed for the model) before choosing; every how many steps
#: the other arm is re-measured
PROBES = 3
REPROBE_EVERY = 10
#: streamed steps measured before their predicted gains may stop streaming
MIN_STREAMED = 2
#: streaming goes on without whole-batch probes while its predicted gain exceeds this share of the
#: whole-batch ingestion cost
PAYS = 0.2
ARMS = ("stream", "whole")


@dataclass(frozen=True)
class PieceChoice:
    """``auto``'s decision: ``arm`` ``"stream"`` (pieces of ``piece_groups`` groups) or ``"whole"``."""

    arm: str
    piece_groups: int


def piece_tuner(
    cache_dir: str | os.PathLike[str] | None, algorithm: str, samples: int, hardware: str
) -> LoopTuner[PieceChoice]:
    """``auto``'s tuner with a memory between runs: decisions kept in the core's tuner cache under
    ``algorithm`` (e.g. ``verl/grpo/n8``), ``samples`` per step, tokens per sample and ``hardware``."""
    return LoopTuner(
        ARMS,
        ChoiceCache(PieceChoice, cache_dir),
        Signature(algorithm, samples, 0.0, hardware),
        repeats=PROBES,
        reprobe_every=REPROBE_EVERY,
    )


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
    """When the last piece's ingestion ends, for groups finishing at ``finish`` (sorted, seconds):
    pieces of at least ``g`` groups (whole ``unit`` multiples), each ``a + b * groups + per_token *
    work``, ``slowdown`` times that while generation runs (the core's ``stream_end``)."""
    return stream_end(finish, g, OperatorCost(a, b, per_token), unit, work, slowdown)


class PiecePolicy:
    """The next piece's ``piece_groups``: fixed, or chosen by the cost model and ``tuner`` (``auto``;
    None: a tuner without memory between runs); ``separate_rollout``: the rollout has hardware of its
    own (verl's ``rollout_hardware=separate``), so overlapped ingestion costs it nothing."""

    def __init__(
        self,
        setting: int | Literal["auto"],
        groups: int,
        unit: int,
        tuner: LoopTuner[PieceChoice] | None = None,
        separate_rollout: bool = False,
    ) -> None:
        self.setting, self.groups, self.unit = setting, groups, unit
        if tuner is None:
            tuner = LoopTuner(ARMS, repeats=PROBES, reprobe_every=REPROBE_EVERY)
        self.tuner = tuner
        self.separate_rollout = separate_rollout
        #: steps run in an arm only to measure it (the tuning cost)
        self.probe_steps = 0
        #: the pieces after the warm-up step; those ingested beside generation flagged ``slowed``
        self.pieces = CostWindow(WINDOW)
        self._fit: tuple[OperatorCost, float] | None = None
        #: (overlapped seconds, exposed tail seconds, work) of the last streamed steps
        self.streamed: deque[tuple[float, float, float]] = deque(maxlen=PROBES)
        self._overlapped_s = self._tail_s = self._step_tokens = 0.0
        self._step_pieces = 0
        self._step_work: list[float] = []
        self.finish: list[float] | None = None
        #: work of the last step's groups, in finish order (None: 1 per group), and its sum
        self.work: list[float] | None = None
        self.step_work = float(groups)
        #: (finish times, work) of the last complete steps: the candidates are replayed on each
        self.recent: deque[tuple[list[float], list[float]]] = deque(maxlen=PROBES)
        self.chosen = self._round(math.ceil(groups / 4))  # until measured: four pieces
        self.arm = "stream"
        self.steps = 0
        self._t_step: float | None = None

    @property
    def recalled(self) -> bool:
        """This workload's arm came from the tuner cache (the decision of an earlier run)."""
        return self.tuner.recalled is not None

    def _round(self, g: int) -> int:
        """Up to a whole number of units, within [unit, groups]."""
        return min(self.groups, max(self.unit, math.ceil(g / self.unit) * self.unit))

    def piece_groups(self) -> int:
        """Groups the next piece waits for (0 in the settings means the whole step, one piece)."""
        if self.setting == "auto":
            return self.chosen if self.arm == "stream" else self.groups
        return int(self.setting) or self.groups

    def begin_step(self, now: float) -> int:
        """A step starts at ``now`` (seconds, monotonic): the last step's time goes to its arm; pick
        this step's arm; return its ``piece_groups``. The first step is warm-up, never measured."""
        if self._t_step is not None and self.steps > 1:
            self.tuner.record(self.arm, now - self._t_step)
        self._t_step = now
        self.steps += 1
        if self.setting == "auto" and self.steps > 1:
            turn = self._turn()
            if turn.arm != self.arm:
                log.info(
                    "conduit piece_groups=auto, step %d: %s -> %s (%s)",
                    self.steps,
                    self.arm,
                    turn.arm,
                    turn.reason,
                )
            self.arm = turn.arm
            self.probe_steps += turn.kind == "probe"
            if turn.kind == "settled":
                g = self.chosen if turn.arm == "stream" else self.groups
                self.tuner.keep(PieceChoice(turn.arm, g), turn.reason)
        return self.piece_groups()

    def _turn(self) -> Turn:
        """The model decides while streaming clearly pays (or has run one step only); the tuner's
        measurements otherwise, with the arm the model favours as the incumbent."""
        pays = self.streaming_pays()
        if pays and len(self.streamed) >= MIN_STREAMED:
            gain = statistics.median(self.gains)
            return Turn("stream", f"predicted gain {gain:.3f}s > {PAYS:g} x whole batch", "settled")
        if pays and (self.tuner.recalled is None or self.tuner.measured()):
            return Turn("stream", "first streamed step", "open")
        hidden = [self.hidden_s(t, w or None) for _, t, w in self.streamed] if len(self.pieces) else []
        favoured = "stream" if not hidden or statistics.median(hidden) > 0 else "whole"
        return self.tuner.turn(self.steps, favoured)

    def record_piece(
        self,
        groups: int,
        seconds: float,
        overlapped: bool = False,
        work: Sequence[float] | None = None,
        tokens: float | None = None,
    ) -> None:
        """One piece of ``groups`` took ``seconds`` of ingestion; ``overlapped``: generation still ran;
        ``work``: each group's work (tokens; None: 1 per group); ``tokens``: the tokens its per-sample
        stages ran on (None: all of ``work``; fewer where early rows had run on some responses)."""
        self._step_tokens += float(sum(work)) if work is not None else 0.0
        if self.steps == 1:  # the warm-up step: its first calls are slow for reasons of their own
            return
        per_group = sorted(work) if work is not None else [1.0] * groups
        ran = float(sum(per_group)) if tokens is None else float(tokens)
        self.pieces.record(1, float(len(per_group)), seconds, nbytes=ran, slowed=overlapped)
        self._fit = None
        self._step_pieces += 1
        self._step_work += per_group
        if overlapped:
            self._overlapped_s += seconds
        else:
            self._tail_s = seconds

    def record_rows(self, seconds: float, tokens: float) -> None:
        """A per-sample call (verl's early rows: responses whose groups have not finished) took ``seconds``
        on responses of ``tokens`` tokens while generation ran: the same stages a whole-batch piece runs,
        so the fit must see them (without them it prices the whole batch at its pieces' leftover
        work, and the whole-batch arm looks cheap enough to probe)."""
        if self.steps == 1:
            return
        self.pieces.record(1, 0.0, seconds, nbytes=float(tokens), slowed=True)
        self._fit = None
        self._overlapped_s += seconds

    def record_step(self, finish: list[float], ended: float | None = None) -> None:
        """The step's group finish times (seconds from its start) and when its last piece's ingestion
        ended (same origin; None: unknown); re-choose ``g`` for ``auto``."""
        self.finish = sorted(finish)
        if len(self._step_work) == len(self.finish):
            self.work = self._step_work
        if self._step_work:
            self.step_work = float(sum(self._step_work))
        complete = len(self.finish) == self.groups
        if complete:
            self.recent.append((self.finish, self._spread(self.finish, self.work)))
            if self.setting == "auto" and len(self.pieces):
                before, self.chosen = self.chosen, self.best()
                if self.chosen != before:
                    log.info(
                        "conduit piece_groups=auto: %d -> %d groups per piece (%s)",
                        before,
                        self.chosen,
                        self._why(),
                    )
        if self._step_pieces > 1 and len(self.pieces):
            tail = self._tail_s
            if ended is not None and finish:  # the exposed tail, waits for earlier pieces included
                tail = max(tail, ended - max(finish))
            self.streamed.append((self._overlapped_s, tail, float(sum(self._step_work))))
        workload = self.tuner.workload
        if workload is not None and self.setting == "auto" and complete:
            self._follow_workload(self._step_tokens / workload.batch_size)
        self._overlapped_s, self._tail_s, self._step_pieces, self._step_work = 0.0, 0.0, 0, []
        self._step_tokens = 0.0

    def _follow_workload(self, tokens_per_sample: float) -> None:
        """After the warm-up step, start from the cached decision; once the workload drifted, drop
        the tuner's measurements of the arms and recall (or probe) the new workload's decision. The
        model's streamed steps stay: the drift watch needs several steps of the new workload before it
        fires, so they are its own, and each step's gain is re-predicted from its own work."""
        if self.tuner.signature is not None:  # recalled once already: only a drift re-opens it
            if not self.tuner.drifted(tokens_per_sample):
                return
            self.tuner.forget()
        hit = self.tuner.recall(tokens_per_sample)
        self.tuner.follow(hit[0].arm if hit else None)
        if hit is not None:
            self.arm = hit[0].arm
            if self.arm == "stream":
                self.chosen = self._round(hit[0].piece_groups)

    def fitted(self) -> tuple[OperatorCost, float]:
        """The pieces' own cost (as if run alone) and how much slower pieces ran beside generation
        (the core's :func:`~conduit.costmodel.fit_slowed` over the window; cached until the next piece)."""
        if self._fit is None:
            self._fit = self.pieces.fit_slowed()
        return self._fit

    def contention(self) -> float:
        """How much slower pieces ran beside generation than after it (1.0 until both were measured)."""
        return self.fitted()[1] if len(self.pieces) else 1.0

    def predicted_gain(self, overlapped_s: float, tail_s: float, work: float | None = None) -> float:
        """Seconds a streamed step saved against one whole-batch piece: :meth:`hidden_s` less what
        overlapped pieces cost generation (``1 - 1/contention`` of their time; nothing where the
        rollout has hardware of its own)."""
        lost = 0.0 if self.separate_rollout else overlapped_s * (1.0 - 1.0 / self.contention())
        return self.hidden_s(tail_s, work) - lost

    def hidden_s(self, tail_s: float, work: float | None = None) -> float:
        """Ingestion a streamed step hid: the whole batch's predicted ingestion (of ``work``; None:
        the last step's) less the exposed tail it left."""
        return self.whole_s(work) - tail_s

    @property
    def gains(self) -> list[float]:
        """Predicted gains of the last streamed steps, each re-predicted by the current fit."""
        if not len(self.pieces):
            return []
        return [self.predicted_gain(o, t, w or None) for o, t, w in self.streamed]

    def whole_s(self, work: float | None = None) -> float:
        """Predicted ingestion of the whole batch in one piece (``work``; None: the last step's)."""
        return self.fitted()[0].seconds(self.groups, self.step_work if work is None else work)

    def streaming_pays(self) -> bool:
        """The median predicted gain of the last streamed steps is over ``PAYS`` of the whole batch's
        ingestion (after one streamed step only: True, its few pieces cannot tell yet)."""
        if not self.streamed or not len(self.pieces) or self.chosen >= self.groups:
            return False
        if len(self.streamed) < MIN_STREAMED:
            return True
        return statistics.median(self.gains) > PAYS * self.whole_s()

    def report(self) -> dict[str, float]:
        """The policy's view for the step's metrics (``conduit/policy/...``)."""
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
        """``(a, b)`` of ``seconds = a + b * groups + c * tokens`` (``c``: :meth:`per_token`)."""
        fit = self.fitted()[0]
        return fit.a, fit.b

    def per_token(self) -> float:
        """``c`` of the fit (0 until measured, or where tokens moved with groups in every piece)."""
        return self.fitted()[0].per_byte if len(self.pieces) else 0.0

    def _why(self) -> str:
        """The fit and the predicted tail of the chosen ``g``, for the log."""
        cost, k = self.fitted()
        fit = f"a {cost.a:.3f}s, {cost.b:.4f}s/group, {cost.per_byte * 1e3:.4f}ms/token, contention {k:.2f}"
        tail = self._tails()[self.chosen]
        return f"predicted exposed tail {tail:.3f}s, the shortest within {TIE:.0%}, over {len(self.recent)} step(s); {fit}"

    def _spread(self, finish: list[float], work: list[float] | None) -> list[float]:
        """Each group's work in finish order; unknown: the step's work spread evenly."""
        if work is None or len(work) != len(finish):
            return [self.step_work / max(len(finish), 1)] * len(finish)
        return work

    def best(self) -> int:
        """The candidate ``g`` with the shortest mean predicted exposed tail over the last steps' finish
        times (one step's clusters would over-fit the choice); the current one unless another's is
        clearly shorter (the core's noise rule); ties within ``TIE`` to the larger ``g``."""
        tails = self._tails()
        first = min(tails.values())
        current = tails.get(self.chosen)
        if current is not None and not clearly_faster([first], [current]):
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
