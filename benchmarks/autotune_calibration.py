"""The calibration of ``autotune.py``'s cost model: operator, call and overlap costs fitted on runs of the
loop at ``CALIB_DIMS`` (sizes never evaluated), and the model's error on those runs (the tuner's margin)."""

from __future__ import annotations

import dataclasses
import functools
import random
import statistics
import time
from typing import Any

import script
from autotune_loop import FRAG, GETS, PUTS, SyntheticLoop

from conduit.costmodel import (
    IterationModel,
    Knobs,
    OperatorCost,
    OverlapCosts,
    Sample,
    Workload,
    calibrate_overlap,
)

CALIB_DIMS = (32, 1024)
CALIB_CONFIGS = (  # two sync, then async ones: g_ing, g_del and depth (g_del or twice it) varied apart
    Knobs("sync", g_del=1),
    Knobs("sync", g_del=8),
    *(Knobs("async", m * g_del, g_ing, g_del) for g_ing in (1, 8) for g_del in (1, 8) for m in (1, 2)),
)
CALIB_ROUNDS = 3  # each calibration configuration is run this many times, in a fresh random order


def _op(metrics: list[dict[str, float]], name: str) -> tuple[float, float]:
    """Median seconds and calls per iteration of span ``name``."""
    return (
        statistics.median(m.get(f"op/{name}_s", 0.0) for m in metrics),
        statistics.median(m.get(f"op/{name}_calls", 0.0) for m in metrics),
    )


@dataclasses.dataclass
class Calibration:
    """The fitted costs, the calibration runs they came from and the model's error on those runs."""

    ingest: OperatorCost
    deliver: OperatorCost
    call_s: float
    overlap: OverlapCosts
    bandwidth: float
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def model(self, loop: SyntheticLoop, producer_s: float, consumer_s: float) -> IterationModel:
        work = Workload(producer_s, consumer_s, PUTS, loop.frag, GETS, loop.batch, loop.item_bytes)
        model = IterationModel(
            work, self.ingest, self.deliver, self.call_s, bandwidths={"host": self.bandwidth}
        )
        return model.with_overlap(self.overlap)

    def relative_error(self, batch: int, device: str) -> float:
        """Median ``|predicted - measured| / measured`` over the calibration runs: the model's
        uncertainty, the tuner's ``margin``."""
        errors = []
        for run in self.runs:
            model = self.model(SyntheticLoop(run["dim"], batch, device), run["producer_s"], run["consumer_s"])
            errors.append(abs(model.predict(Knobs(**run["knobs"])).wall_s / run["wall_s"] - 1))
        return statistics.median(errors)


def calibrate(batch: int, device: str, iters: int, warmup: int, bandwidth: float) -> Calibration:
    """Operator costs, call cost and overlap costs from runs at ``CALIB_DIMS`` (``autotune.py``'s docstring).

    Each configuration runs ``CALIB_ROUNDS`` times, the rounds in fresh random orders (so a change of
    machine speed spreads over all of them); its iterations' metrics are pooled and its wall is the
    median of the rounds' medians."""
    t0 = time.perf_counter()
    ingest, deliver, calls, runs = [], [], [], []
    items_in, items_out = PUTS * FRAG, GETS * batch
    rng = random.Random(0)
    for dim in CALIB_DIMS:
        loop = SyntheticLoop(dim, batch, device)
        producer_s, consumer_s = loop.compute_only(iters)
        steps = {k: functools.partial(loop.run, k, iters, warmup) for k in CALIB_CONFIGS}
        got = script.interleaved(steps, CALIB_ROUNDS, rng)
        walls = {k: [wall for wall, _ in got[k]] for k in CALIB_CONFIGS}
        metrics = {k: [m for _, ms in got[k] for m in ms] for k in CALIB_CONFIGS}
        asyncs = [k for k in CALIB_CONFIGS if k.overlap == "async"]
        for knobs in asyncs:  # async: ingestion calls of g_ing fragments, the put's own cost
            put_s, put_calls = _op(metrics[knobs], "put")
            calls.append(put_s / max(put_calls, 1))
            s, c = _op(metrics[knobs], "ingest/batch")
            ingest.append(Sample(max(c, 1), items_in, items_in * loop.item_bytes, s))
        for knobs in CALIB_CONFIGS:
            if knobs.overlap == "sync":  # delivery calls of g_del batches; ingestion inside put
                s, c = _op(metrics[knobs], "deliver/batch")
                deliver.append(Sample(max(c, 1), items_out, items_out * loop.item_bytes, s))
                put_s, put_calls = _op(metrics[knobs], "put")
                inline = max(0.0, put_s - statistics.median(calls) * put_calls)
                ingest.append(Sample(put_calls, items_in, items_in * loop.item_bytes, inline))
            runs.append({"dim": dim, "knobs": dataclasses.asdict(knobs), "wall_s": statistics.median(walls[knobs]),
                         "wall_s_per_round": walls[knobs], "producer_s": producer_s,
                         "consumer_s": consumer_s})  # fmt: skip
    cal = Calibration(OperatorCost.fit(ingest), OperatorCost.fit(deliver, bandwidth), statistics.median(calls),
                      OverlapCosts(), bandwidth, runs)  # fmt: skip
    fit_overlap(cal, batch, device)
    cal.seconds = time.perf_counter() - t0
    return cal


def fit_overlap(cal: Calibration, batch: int, device: str) -> None:
    """The overlap costs of ``cal`` from its async calibration runs (``calibrate_overlap``)."""
    runs = [r for r in cal.runs if r["knobs"]["overlap"] == "async"]
    models = [
        cal.model(SyntheticLoop(r["dim"], batch, device), r["producer_s"], r["consumer_s"]) for r in runs
    ]
    cal.overlap = calibrate_overlap([(m, Knobs(**r["knobs"]), r["wall_s"]) for m, r in zip(models, runs)])


def describe_overlap(c: OverlapCosts) -> str:
    """The overlap costs in words (sigma and the per-call costs in microseconds)."""
    return (
        f"sigma {c.interference:.2f}, hand-off per get {c.handoff_s * 1e6:.0f} us, wake-up per ingestion "
        f"call {c.wake_ingest_s * 1e6:.0f} us, per delivery call {c.wake_deliver_s * 1e6:.0f} us"
    )
