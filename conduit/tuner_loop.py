"""The auto-tuner for a caller that measures inside its own loop: told each iteration, not calling one.

:class:`~conduit.tuner.AutoTuner` measures a configuration by calling ``measure(config)``. A trainer
that can only time whole iterations of its own loop (verl's streamed steps) cannot be called that way;
:class:`LoopTuner` is told what each iteration ran and how long it took, and says what the next one
runs. It is the same tuner told one iteration at a time: measurements repeated (``repeats`` per arm,
alternating, medians), decided by the one noise rule (:func:`~conduit.tuner.clearly_faster`), the
decision kept per workload :class:`~conduit.tuner.Signature` in the :class:`~conduit.tuner.ChoiceCache`
and re-opened by a :class:`~conduit.tuner.DriftWatch`.

Arms are the schedules the caller can run (verl: ``stream``, ``whole``); its model says which one it
favours. Until every arm has ``repeats`` measurements the least measured runs (probes); then the
favoured arm runs unless another is clearly faster, and every ``reprobe_every``-th step runs another,
so each arm's median (over its last ``repeats`` steps) follows a drifting step time. A decision
recalled from the cache runs from the first step, the others re-measured only every
``reprobe_every``-th step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from conduit.errors import ConfigError
from conduit.tuner import ChoiceCache, DriftWatch, Signature, clearly_faster, noise

log = logging.getLogger("conduit.tuner")

C = TypeVar("C")


@dataclass(frozen=True)
class Turn:
    """What the next iteration runs: ``arm``, why, and ``kind``: ``probe`` (measuring an arm),
    ``settled`` (a decision on measurements) or ``recalled`` (the cached decision, not re-measured);
    a caller whose model decides without measuring names its own kinds (verl's ``open``)."""

    arm: str
    reason: str
    kind: str


def size_bucket(size: float) -> float:
    """``size`` rounded to the nearest power of sqrt(2): a signature's item size that a rerun of the
    same workload finds again despite sampling noise (0 for a size that is not > 0)."""
    if not size > 0:
        return 0.0
    return round(2.0 ** (round(2.0 * math.log2(size)) / 2.0), 1)


class LoopTuner(Generic[C]):
    """Chooses among ``arms`` from iterations the caller measures (see the module docstring).

    Args:
        arms: the schedules, in the order probes take them.
        cache: where decisions (instances of one dataclass) are kept; None: every run decides afresh.
        workload: the signature decisions are kept under; its ``item_size`` is replaced at
            :meth:`recall` by the measured size, in buckets of sqrt(2).
        repeats: measured iterations per arm before deciding, and the window of each arm's median.
        reprobe_every: another arm is re-measured on every step that is a multiple of this.
        drift, patience: the :class:`~conduit.tuner.DriftWatch` on the item size.
    """

    def __init__(
        self,
        arms: Sequence[str],
        cache: ChoiceCache[C] | None = None,
        workload: Signature | None = None,
        repeats: int = 3,
        reprobe_every: int = 10,
        drift: float = 0.25,
        patience: int = 3,
    ) -> None:
        if len(arms) < 2 or len(set(arms)) != len(arms):
            raise ConfigError(f"a loop tuner needs two or more distinct arms, got {list(arms)!r}")
        for name, value, least in (("repeats", repeats, 1), ("reprobe_every", reprobe_every, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{name} must be an int >= {least}, got {value!r}")
        if (cache is None) != (workload is None):
            raise ConfigError("a loop tuner keeps decisions with both a cache and a workload signature")
        self.arms, self.cache, self.workload = list(arms), cache, workload
        self.repeats, self.reprobe_every = repeats, reprobe_every
        self.drift, self.patience = drift, patience
        #: the last ``repeats`` measured seconds of each arm
        self.periods: dict[str, deque[float]] = {a: deque(maxlen=repeats) for a in self.arms}
        #: the signature looked up last (None: not yet), the decision cached for it, and its arm
        self.signature: Signature | None = None
        self.kept: C | None = None
        self.recalled: str | None = None
        self._drift: DriftWatch | None = None

    def record(self, arm: str, seconds: float) -> None:
        """One iteration of ``arm`` took ``seconds``."""
        self._check(arm)
        self.periods[arm].append(float(seconds))

    def _check(self, arm: str) -> None:
        if arm not in self.periods:
            raise ConfigError(f"unknown arm {arm!r}; this tuner's arms: {self.arms}")

    def measured(self) -> bool:
        """Every arm has ``repeats`` measurements."""
        return all(len(p) >= self.repeats for p in self.periods.values())

    def medians(self) -> dict[str, float]:
        """Each measured arm's median seconds."""
        return {a: statistics.median(p) for a, p in self.periods.items() if p}

    def forget(self) -> None:
        """Drop the measurements (the workload changed)."""
        for p in self.periods.values():
            p.clear()

    def turn(self, step: int, favoured: str) -> Turn:
        """What step ``step`` (counted by the caller) runs, ``favoured`` being the arm its model prefers."""
        self._check(favoured)
        others = [a for a in self.arms if a != favoured]
        if not self.measured():
            if self.recalled is not None:
                if step % self.reprobe_every == 0:
                    other = next(a for a in self.arms if a != self.recalled)
                    return Turn(other, f"re-measuring another arm every {self.reprobe_every} steps", "probe")
                return Turn(self.recalled, "the cached decision for this workload", "recalled")
            arm = min(self.arms, key=lambda a: len(self.periods[a]))
            counts = ", ".join(f"{len(self.periods[a])} {a}" for a in self.arms)
            return Turn(arm, f"measuring every arm ({counts} of {self.repeats})", "probe")
        med = self.medians()
        challenger = min(others, key=med.__getitem__)
        fav, ch = self.periods[favoured], self.periods[challenger]
        best = challenger if clearly_faster(ch, fav) else favoured
        why = (
            "median step "
            + ", ".join(f"{a} {med[a]:.3f}s" for a in self.arms)
            + f"; {favoured} is favoured, {challenger} must be {noise(ch, fav):.3f}s shorter "
            "(the larger of the noise rule's share and the steps' spread)"
        )
        if step % self.reprobe_every == 0:
            other = challenger if best == favoured else favoured
            return Turn(other, f"re-measuring the other arm every {self.reprobe_every} steps; {why}", "probe")
        return Turn(best, why, "settled")

    def recall(self, item_size: float) -> tuple[C, str] | None:
        """The decision cached for the workload at ``item_size`` (None: none, or no cache); the size
        becomes the drift reference."""
        if self.cache is None or self.workload is None:
            return None
        self.signature = dataclasses.replace(self.workload, item_size=size_bucket(item_size))
        self._drift = DriftWatch(max(item_size, 1e-9), self.drift, self.patience)
        hit = self.cache.load(self.signature)
        self.kept = hit[0] if hit else None
        self.recalled = None
        if hit:
            log.info("conduit loop tuner: starting from %s: %s", hit[0], hit[1])
        return hit

    def follow(self, arm: str | None) -> None:
        """Run ``arm`` (the recalled decision's) until every arm is measured; None: probe as usual."""
        self.recalled = arm

    def drifted(self, item_size: float) -> bool:
        """Record an iteration's item size; True once the workload drifted (see DriftWatch)."""
        return self._drift is not None and item_size > 0 and self._drift.observe(item_size)

    def keep(self, config: C, reason: str, measured_s: Mapping[str, float] | None = None) -> None:
        """Cache a settled decision (written only when it differs from the cached one) with the arms'
        medians (``measured_s``: others)."""
        if self.cache is None or self.signature is None or config == self.kept:
            return
        self.cache.save(self.signature, config, reason, self.medians() if measured_s is None else measured_s)
        self.kept = config
        log.info("conduit loop tuner: kept %s for this workload (%s)", config, reason)
