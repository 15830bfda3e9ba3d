"""``overlap="auto"`` for DQN: the core's cost model and tuner choose overlap, stage_steps, g_del, depth.

1. **Warm-up**: the first ``WARMUP`` learning iterations run the probe configuration (``sync``,
   ``stage_steps`` 1: RLlib's semantics) and time the env-runner sampling (the producer), the learner
   updates (the consumer) and each whole training step.
2. **Calibration**: a scratch ``Conduit`` with the same schemas and n-step operator ingests the last
   real put's rows at two fragment sizes and serves train batches at ``g_del`` 1 and 8; least squares
   give the ingestion and delivery :class:`~conduit.costmodel.OperatorCost`.
3. **Rank**: an :class:`~conduit.tuner.AutoTuner` ranks :data:`SPACE` with the
   :class:`~conduit.costmodel.IterationModel` of one DQN iteration (model only: the candidates are
   measured in RLlib's own loop, below). The interference prior is ``min(1, 2 / cores)``: two
   background threads on this machine's cores.
4. **Trial**: the model's pick runs ``max(TRIAL, stage_steps)`` iterations (one whole staging cycle:
   a staged put is paid once per ``stage_steps`` steps) after ``SETTLE`` unmeasured ones (its
   threads start, its deliveries fill); then the probe configuration runs as many again (the
   *recheck*, also after ``SETTLE``), and the pick is kept only if its *mean* step is
   :func:`~conduit.tuner.clearly_faster` than the recheck's mean (the core's noise rule, told one mean
   of each: ``HYSTERESIS`` of the recheck's; not the steps, whose median would drop a staged put and
   whose spread is then the staging cycle's, not noise; else the plugin stays on the probe). The two are
   measured back to back with one statistic: the warm-up ran earlier in training, when steps can be
   cheaper (measured: sync's warm-up median 14.2 ms against 18.6 ms for sync over 256 later steps),
   so a pick compared with it was sent back where it was faster. A switch moves the buffer through
   ``state_dict``; its seconds count as tuning cost.

The choice, its reason and the staleness it implies are logged (logger ``conduit.tuner``) and cached
per signature (DQN, train batch size, bytes per step row, machine fingerprint): a later run with the
same signature starts from the cached choice after the warm-up, without a trial.

5. **Drift**: the chosen configuration's step time is watched (:class:`~conduit.tuner.DriftWatch`:
   more than ``DRIFT`` away from its first ``TRIAL`` steps' median for ``PATIENCE`` steps in a row);
   on drift the plugin goes back to the probe and tunes afresh (warm-up, calibration, trial), and the
   new choice replaces the cached one. Knobs set in
``enable`` (``depth``, ``g_del``, ``stage_steps``, ``g_ing``) are pinned in every candidate.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from conduit import ColumnBatch, Conduit
from conduit.costmodel import IterationModel, Knobs, OperatorCost, Prediction, Sample, Staleness, Workload
from conduit.discovery import fingerprint
from conduit.tuner import AutoTuner, Choice, DriftWatch, Signature, clearly_faster, describe, noise
from conduit_rllib.settings import ConduitSettings

log = logging.getLogger("conduit.tuner")

WARMUP = 3  # learning iterations measured under the probe configuration
TRIAL = 3  # learning iterations measured under the model's pick (at least one staging cycle)
SETTLE = 2  # learning iterations after a switch that are not measured (threads start, deliveries fill)
DRIFT, PATIENCE = 0.25, 5  # a re-tune needs the step time this far off, this many steps in a row
clock = time.perf_counter  # the steps' clock (tests drive it)
CACHE_DIR: Path | None = None  # None: the tuner's default (~/.cache/conduit/tuner)
KNOBS = ("overlap", "depth", "g_del", "stage_steps")
SPACE: tuple[ConduitSettings, ...] = (
    ConduitSettings("sync", depth=2, g_del=1, stage_steps=1),
    ConduitSettings("sync", depth=4, g_del=4, stage_steps=1),
    *(
        ConduitSettings("async", depth=d, g_del=g, stage_steps=s)
        for s in (8, 32)
        for g in (1, 4, 8)
        for d in sorted({g, 2 * g, 2})
    ),
)


@dataclasses.dataclass(frozen=True)
class Observed:
    """Medians of measured training steps: seconds (producer, consumer, whole), env steps, updates."""

    producer_s: float
    consumer_s: float
    wall_s: float
    env_steps: int
    updates: int


def _median(steps: list[tuple[float, float, float, int, int]]) -> Observed:
    cols = list(zip(*steps, strict=True))
    return Observed(
        *(statistics.median(c) for c in cols[:3]),  # type: ignore[arg-type]
        max(1, round(statistics.median(cols[3]))),
        max(1, round(statistics.median(cols[4]))),
    )


def _mean(steps: list[tuple[float, float, float, int, int]]) -> Observed:
    """Mean step (a staged put, paid once per cycle, counts in full), counts as medians."""
    cols = list(zip(*steps, strict=True))
    median = _median(steps)
    return dataclasses.replace(
        median,
        **{
            k: statistics.fmean(c) for k, c in zip(("producer_s", "consumer_s", "wall_s"), cols, strict=False)
        },
    )


def probe_costs(
    make: Callable[[int], Conduit], rows: ColumnBatch, batch_size: int
) -> tuple[OperatorCost, OperatorCost]:
    """Ingestion and delivery costs measured on scratch Conduits (``make(g_del)``, sync) with real rows."""
    ingest: list[Sample] = []
    deliver: list[Sample] = []
    nbytes = rows.nbytes / rows.size
    conduit = make(1)
    try:
        for n in sorted({rows.size, max(1, rows.size // 4)}):
            part = rows.slice(0, n)
            part = part.with_columns(seg_end=torch.clamp(part["seg_end"], max=n))
            for _ in range(2):
                t0 = time.perf_counter()
                conduit.put(part)
                ingest.append(Sample(1, n, n * nbytes, time.perf_counter() - t0))
    finally:
        conduit.close(drain=False)
    for g_del in (1, 8):
        conduit = make(g_del)
        try:
            emitted = max(1, int(rows["emit"].sum()))  # rows that become transitions (callers pass > 0)
            for _ in range(-(-batch_size // emitted)):
                conduit.put(rows)
            t0 = time.perf_counter()
            for _ in range(8):
                conduit.get(batch_size)
            deliver.append(
                Sample(8 / g_del, 8 * batch_size, 8 * batch_size * nbytes, time.perf_counter() - t0)
            )
        finally:
            conduit.close(drain=False)
    return OperatorCost.fit(ingest), OperatorCost.fit(deliver)


def dqn_model(
    obs: Observed, ingest: OperatorCost, deliver: OperatorCost, batch_size: int, item_bytes: int, sigma: float
) -> Callable[[ConduitSettings], Prediction]:
    """One training step's prediction under DQN settings (a put per ``stage_steps`` env steps)."""

    def predict(s: ConduitSettings) -> Prediction:
        stage = s.stage_steps_for("dqn")
        span = max(1, math.ceil(stage / obs.env_steps))  # training steps per put
        work = Workload(
            obs.producer_s * span,
            obs.consumer_s * span,
            1,
            span * obs.env_steps,
            span * obs.updates,
            batch_size,
            item_bytes,
        )
        sched = s.scheduler("dqn")
        knobs = Knobs(sched.overlap, sched.depth, sched.g_ing, sched.g_del)
        p = IterationModel(
            work, ingest, deliver, interference=sigma if sched.overlap == "async" else 0.0
        ).predict(knobs)
        staleness = Staleness(
            p.staleness.data_lag_puts, p.staleness.sample_ahead_batches, stage - 1, stage - 1
        )
        return Prediction(p.exposed_s / span, p.wall_s / span, staleness, p.terms)

    return predict


def interference_prior() -> float:
    """``sigma`` before any async step is measured: two background threads on this machine's cores."""
    return min(1.0, 2 / (os.cpu_count() or 1))


class DQNTuning:
    """The ``auto`` state machine driven by ``ConduitReplay.end_step`` (see the module docstring)."""

    def __init__(self, settings: ConduitSettings) -> None:
        self.pins: dict[str, Any] = {
            k: getattr(settings, k)
            for k in ("depth", "g_del", "stage_steps")
            if getattr(settings, k) is not None
        }
        self.pins.update(g_ing=settings.g_ing, seed=settings.seed)
        self.probe = dataclasses.replace(
            ConduitSettings("sync", depth=2, g_del=1, stage_steps=1), **self.pins
        )
        self.phase = "warmup"
        self.steps: list[tuple[float, float, float, int, int]] = []
        self.tuning_s = 0.0
        self.choice: Choice[ConduitSettings] | None = None
        self._tuner: AutoTuner[ConduitSettings] | None = None
        self._signature: Signature | None = None
        self._baseline: Observed | None = None
        self._trial: Observed | None = None  # the pick's mean step in its trial
        self._t_last: float | None = None
        self._drift: DriftWatch | None = None
        self._walls: list[float] = []  # the chosen configuration's first steps: the drift reference
        self._settle = 0  # steps still to skip after a switch
        self._trial_steps = TRIAL
        self.retunes = 0

    def end_step(
        self,
        producer_s: float,
        consumer_s: float,
        env_steps: int,
        updates: int,
        calibrate: Callable[[], tuple[OperatorCost, OperatorCost, int, int]],
    ) -> ConduitSettings | None:
        """Record one learning step; the settings to switch to now, or None. ``calibrate`` returns
        ``(ingest, deliver, batch_size, item_bytes)`` from the calibration probe."""
        now = clock()
        last, self._t_last = self._t_last, now
        if last is None:  # the first step's wall has no start: not measured
            return None
        if self._settle > 0:
            self._settle -= 1
            return None
        if self.phase == "done":
            return self._watch(now - last)
        self.steps.append((producer_s, consumer_s, now - last, env_steps, updates))
        if self.phase == "warmup" and len(self.steps) >= WARMUP:
            return self._rank(calibrate)
        if self.phase == "trial" and len(self.steps) >= self._trial_steps:
            self._trial, self.steps, self.phase = _mean(self.steps), [], "recheck"
            return self.probe
        if self.phase == "recheck" and len(self.steps) >= self._trial_steps:
            return self._decide()
        return None

    def switched(self, seconds: float) -> None:
        """A switch of configuration took ``seconds`` (buffer moved): tuning cost; restarts the clock
        and skips the next ``SETTLE`` steps."""
        self.tuning_s += seconds
        self._t_last = None
        self._settle = SETTLE

    def _rank(
        self, calibrate: Callable[[], tuple[OperatorCost, OperatorCost, int, int]]
    ) -> ConduitSettings | None:
        t0 = time.perf_counter()
        self._baseline = _median(self.steps)
        ingest, deliver, batch_size, item_bytes = calibrate()
        sigma = interference_prior()
        model = dqn_model(self._baseline, ingest, deliver, batch_size, item_bytes, sigma)
        # what the warm-up step spent outside sampling, learning and the data path (RLlib's own
        # bookkeeping, weight sync) counts as producer time, so predictions read as measured steps
        other = max(0.0, self._baseline.wall_s - model(self.probe).wall_s)
        obs = dataclasses.replace(self._baseline, producer_s=self._baseline.producer_s + other)
        model = dqn_model(obs, ingest, deliver, batch_size, item_bytes, sigma)
        self._tuner = AutoTuner(SPACE, model, None, cache_dir=CACHE_DIR, pins=self.pins)
        self._signature = Signature("dqn", batch_size, float(item_bytes), fingerprint())
        choice = self._tuner.tune(self._signature, fresh=self.retunes > 0)
        self.tuning_s += time.perf_counter() - t0
        log.info(
            "conduit DQN auto: warm-up %s: %.3g ms/step (sampling %.3g ms, learning %.3g ms); calibrated "
            "ingest %s, deliver %s; interference prior %.2f",
            describe(self.probe),
            self._baseline.wall_s * 1e3,
            self._baseline.producer_s * 1e3,
            self._baseline.consumer_s * 1e3,
            ingest,
            deliver,
            sigma,
        )
        self.steps = []
        if choice.source == "cache" or choice.config == self.probe:
            return self._finish(choice)
        self.choice, self.phase = choice, "trial"
        self._trial_steps = max(TRIAL, choice.config.stage_steps_for("dqn"))
        return choice.config

    def _decide(self) -> ConduitSettings:
        assert self.choice is not None and self._trial is not None and self._tuner is not None
        assert self._signature is not None
        trial = self._trial.wall_s
        base = _mean(self.steps).wall_s  # the probe's recheck, right after the trial
        keep, need_ms = clearly_faster([trial], [base]), noise([trial], [base]) * 1e3  # one mean per arm
        config = self.choice.config if keep else self.probe
        reason = (
            f"measured in RLlib's loop: {describe(self.choice.config)} {trial * 1e3:.3g} ms/step "
            f"(mean of {len(self.steps)}) vs {describe(self.probe)} {base * 1e3:.3g} ms/step "
            f"(mean of {len(self.steps)}, right after); "
            + ("kept the pick" if keep else f"stayed on the probe (the pick was not {need_ms:.3g} ms faster)")
            + f"; model: {self.choice.reason}"
        )
        measured = {describe(self.choice.config): trial, describe(self.probe): base}
        choice = Choice(config, self._tuner.model(config), "measured", reason, measured, self.tuning_s)
        self._tuner.save(self._signature, choice)
        return self._finish(choice)

    def _watch(self, wall_s: float) -> ConduitSettings | None:
        """Watch the chosen configuration's step time; the probe (a fresh tune) once it drifts."""
        if self._drift is None:
            self._walls.append(wall_s)
            if len(self._walls) >= TRIAL:
                self._drift = DriftWatch(statistics.median(self._walls), DRIFT, PATIENCE)
            return None
        if not self._drift.observe(wall_s):
            return None
        self.phase, self.steps, self._walls, self._drift = "warmup", [], [], None
        self.retunes += 1
        return self.probe

    def _finish(self, choice: Choice[ConduitSettings]) -> ConduitSettings:
        self.choice, self.phase, self.steps = choice, "done", []
        run = self._baseline.wall_s * 100 if self._baseline is not None else math.nan
        log.info(
            "conduit DQN auto chose %s (%s); staleness: %s; tuning cost %.3g s (%.1f%% of 100 warm-up steps)",
            describe(choice.config),
            choice.reason,
            choice.prediction.staleness.describe(),
            self.tuning_s,
            100 * self.tuning_s / run,
        )
        return choice.config
