"""Does the cost model rank configurations the way they measure, and does the auto-tuner pick the best?

    python benchmarks/autotune.py [--quick] [--device cpu|cuda] [--out FILE] [--refit FILE]

The workload is a real loop on the core (:class:`SyntheticLoop`): per iteration a producer does torch
work (an MLP layer) and puts ``PUTS`` fragments of ``FRAG`` items, each item ``dim`` float32 features
and a reward; an ingestion operator normalises the features and discounts the rewards (vectorised);
the consumer gets ``GETS`` batches of ``batch`` items and does torch work on each (a layer over the
delivered features, then an MLP layer). Nothing is a stub: every configuration runs a real
``Conduit``.

Calibration (sizes ``CALIB_DIMS``, never evaluated): ten configurations per size (:data:`CALIB_CONFIGS`:
sync ``g_del`` 1 and 8; async ones with ``g_ing``, ``g_del`` and depth varied apart), each run
``CALIB_ROUNDS`` times in fresh random orders, give the ingestion
and delivery costs (``OperatorCost.fit`` over per-iteration totals; delivery's per-byte term from the
measured host link of ``conduit.discovery.local_topology()``), the fixed cost per put, and the overlap
costs (``calibrate_overlap``: interference ``sigma``, hand-off per get, wake-up per ingestion and per
delivery call). The model's median relative error on the calibration runs is the tuner's ``margin``.
At each evaluated size the workload's own compute (producer, consumer) is timed alone, without
Conduit: that is the workload, not the data path.

For each of 5 evaluated sizes, all 32 configurations of :data:`SPACE` are measured (median seconds
per iteration over 6 rounds, each in a fresh random order), the model predicts each, and an
:class:`~conduit.tuner.AutoTuner` (fresh cache) measures, with short probes (``PROBE_ITERS``), those of
its top 3 predicted within ``margin`` of the best, and the best predicted of the other overlap mode
(no more once its time passes their iterations at the predicted best plus 2% of a 100-iteration run;
the first is always measured), ``REPEATS`` times each in alternating rounds (:class:`Probes` keeps
each candidate's ``Conduit`` open between its probes), and picks. Printed and written per size: best
measured, predicted best, the top-8 order (same set? same order?), Kendall's tau over all 32 (and over
the 22 configurations not used in calibration; between two measured rounds; and between the medians
of the even and of the odd rounds, "half vs half": about the most any model can reach against this
machine's noise), the auto pick's gap to the best measured configuration — in the grid, and
re-measured (:func:`confirm`: the pick and the grid's best in ``CONFIRM_ROUNDS`` fresh alternating
runs each, since the best of 32 noisy medians is low partly by luck) — and the tuning overhead
(tuning time beyond running the same iterations at the best configuration: set-up and worse
candidates) as a share of a 100-iteration run. JSON and a
PNG (measured against predicted, manual configurations grey, the pick highlighted) under
``benchmarks/results/``.

``--refit FILE`` re-predicts a recorded results file with the current equations (no measurement):
the overlap costs come from the file's calibration runs, or, for a file without them, per size from
the other sizes' async grid rows (a hold-out by size).
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import script  # noqa: E402

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Operator, SchedulerConfig, Schema  # noqa: E402
from conduit.costmodel import (  # noqa: E402
    IterationModel,
    Knobs,
    OperatorCost,
    OverlapCosts,
    Sample,
    Workload,
    calibrate_overlap,
    link_bandwidth,
)
from conduit.discovery import fingerprint, local_topology  # noqa: E402
from conduit.tuner import AutoTuner, Signature, describe  # noqa: E402

PUTS, GETS, FRAG, CAPACITY, HIDDEN = 8, 16, 32, 2048, 256
PREFILL = 256  # items put before a run is timed (sampling needs data; the ring fills as it runs)
EVAL_DIMS = (8, 64, 512, 2048, 8192)
CALIB_DIMS = (32, 1024)
CALIB_CONFIGS = (  # two sync, then async ones: g_ing, g_del and depth (g_del or twice it) varied apart
    Knobs("sync", g_del=1),
    Knobs("sync", g_del=8),
    *(Knobs("async", m * g_del, g_ing, g_del) for g_ing in (1, 8) for g_del in (1, 8) for m in (1, 2)),
)
CALIB_ROUNDS = 3  # each calibration configuration is run this many times, in a fresh random order
TUNING_SHARE = 0.02  # tuning overhead allowed, as a share of a 100-iteration run
TOP_K = 3  # candidates the tuner measures at most (those within the model's error of the best)
PROBE_ITERS, PROBE_WARMUP = 3, 1  # iterations per probe of a candidate (warm-up: its first probe only)
REPEATS = 3  # probes of each candidate, in alternating rounds (the tuner keeps the median)
CONFIRM_ROUNDS = 6  # fresh alternating runs of the pick and the grid's best (the gap without selection bias)
SPACE: list[Knobs] = (
    [Knobs("sync", g_del=g) for g in (1, 2, 4, 8)]
    + [Knobs("async", 2 * d, i, d) for i in (1, 2, 4, 8) for d in (1, 2, 4, 8)]
    + [Knobs("async", d, i, d) for i in (1, 4, 8) for d in (1, 2, 4, 8)]
)
assert len(SPACE) == 32


def normalise(batch: ColumnBatch) -> ColumnBatch:
    """The ingestion operator: per-fragment feature normalisation and discounted rewards."""
    obs = batch["obs"]
    obs = (obs - obs.mean(0)) / (obs.std(0) + 1e-6)
    rew = batch["reward"]
    disc = torch.cumsum(rew.flip(0), 0).flip(0) * 0.99
    return ColumnBatch({"obs": obs, "reward": disc})


class SyntheticLoop:
    """One workload size: ``dim`` features per item, ``batch`` items per get, on ``device``."""

    def __init__(self, dim: int, batch: int, device: str, frag: int = FRAG) -> None:
        self.dim, self.batch, self.frag, self.device = dim, batch, frag, torch.device(device)
        g = torch.Generator().manual_seed(dim)
        self.x_prod = torch.randn(frag, HIDDEN, generator=g)
        self.w_prod = torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5
        self.w_in = (torch.randn(dim, HIDDEN, generator=g) / dim**0.5).to(self.device)
        self.w_out = (torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(self.device)
        self.fragment = ColumnBatch(
            {"obs": torch.randn(frag, dim, generator=g), "reward": torch.randn(frag, generator=g)}
        )
        self.schema = Schema([Column("obs", torch.float32, (dim,)), Column("reward", torch.float32)])

    @property
    def item_bytes(self) -> int:
        return 4 * self.dim + 4

    def produce(self) -> ColumnBatch:
        """The producer's compute for one fragment (a real layer), then the fragment."""
        torch.tanh(self.x_prod @ self.w_prod)
        return ColumnBatch({"obs": self.fragment["obs"] * 1.0, "reward": self.fragment["reward"] * 1.0})

    def consume(self, obs: torch.Tensor) -> None:
        """The consumer's compute on one delivered batch."""
        h = torch.relu(obs @ self.w_in)
        torch.relu(h @ self.w_out).sum().item()

    def compute_only(self, iters: int) -> tuple[float, float]:
        """Median producer and consumer seconds per iteration, without Conduit."""
        fake = torch.randn(self.batch, self.dim).to(self.device)
        prod, cons = [], []
        for _ in range(iters + 1):
            t0 = time.perf_counter()
            for _ in range(PUTS):
                self.produce()
            t1 = time.perf_counter()
            for _ in range(GETS):
                self.consume(fake)
            t2 = time.perf_counter()
            prod.append(t1 - t0)
            cons.append(t2 - t1)
        return statistics.median(prod[1:]), statistics.median(cons[1:])

    def open(self, knobs: Knobs) -> Conduit:
        """A ``Conduit`` under ``knobs`` holding ``PREFILL`` items (sampling needs data)."""
        sched = SchedulerConfig(knobs.overlap, knobs.depth, knobs.g_ing, knobs.g_del)
        buf = BufferConfig.uniform_replay(CAPACITY, timeout_s=60.0, tier=knobs.placement)
        conduit = Conduit(
            self.schema, buf, sched, ingest=[Operator("normalise", normalise)], device=self.device
        )
        conduit.put(ColumnBatch({"obs": torch.randn(PREFILL, self.dim), "reward": torch.randn(PREFILL)}))
        conduit.flush()
        return conduit

    def iterate(self, conduit: Conduit, iters: int, warmup: int) -> tuple[float, list[dict[str, float]]]:
        """Median seconds per iteration of ``iters`` iterations after ``warmup``, and their metrics."""
        walls, metrics = [], []
        for i in range(warmup + iters):
            conduit.end_iteration()
            t0 = time.perf_counter()
            for _ in range(PUTS):
                conduit.put(self.produce(), version=0)
            for _ in range(GETS):
                self.consume(conduit.get(self.batch).batch["obs"])
            wall = time.perf_counter() - t0
            if i >= warmup:
                walls.append(wall)
                metrics.append(conduit.end_iteration())
        return statistics.median(walls), metrics

    def run(self, knobs: Knobs, iters: int, warmup: int) -> tuple[float, list[dict[str, float]]]:
        """Median seconds per iteration under ``knobs`` (a fresh ``Conduit``) and the iterations' metrics."""
        conduit = self.open(knobs)
        try:
            return self.iterate(conduit, iters, warmup)
        finally:
            conduit.close(drain=False)


class Probes:
    """The tuner's measurements at one size: each candidate's ``Conduit`` is built once (with
    ``PROBE_WARMUP`` iterations) and kept open, so a repeated probe runs only ``PROBE_ITERS`` more;
    ``iterations`` counts every iteration run."""

    def __init__(self, loop: SyntheticLoop) -> None:
        self.loop = loop
        self.open: dict[Knobs, Conduit] = {}
        self.iterations = 0

    def __call__(self, knobs: Knobs) -> float:
        warmup = 0
        if knobs not in self.open:
            self.open[knobs], warmup = self.loop.open(knobs), PROBE_WARMUP
        self.iterations += PROBE_ITERS + warmup
        return self.loop.iterate(self.open[knobs], PROBE_ITERS, warmup)[0]

    def close(self) -> None:
        for conduit in self.open.values():
            conduit.close(drain=False)
        self.open.clear()


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
    """Operator costs, call cost and overlap costs from runs at ``CALIB_DIMS`` (module docstring).

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
        walls: dict[Knobs, list[float]] = {k: [] for k in CALIB_CONFIGS}
        metrics: dict[Knobs, list[dict[str, float]]] = {k: [] for k in CALIB_CONFIGS}
        order = list(CALIB_CONFIGS)
        for _ in range(CALIB_ROUNDS):
            rng.shuffle(order)
            for knobs in order:
                wall, m = loop.run(knobs, iters, warmup)
                walls[knobs].append(wall)
                metrics[knobs].extend(m)
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
            runs.append(
                {
                    "dim": dim,
                    "knobs": dataclasses.asdict(knobs),
                    "wall_s": statistics.median(walls[knobs]),
                    "wall_s_per_round": walls[knobs],
                    "producer_s": producer_s,
                    "consumer_s": consumer_s,
                }
            )
    cal = Calibration(
        OperatorCost.fit(ingest),
        OperatorCost.fit(deliver, bandwidth),
        statistics.median(calls),
        OverlapCosts(),
        bandwidth,
        runs,
    )
    fit_overlap(cal, batch, device)
    cal.seconds = time.perf_counter() - t0
    return cal


def fit_overlap(cal: Calibration, batch: int, device: str) -> None:
    """The overlap costs of ``cal`` from its async calibration runs (``calibrate_overlap``)."""
    async_runs = [r for r in cal.runs if r["knobs"]["overlap"] == "async"]
    cal.overlap = calibrate_overlap(
        [
            (
                cal.model(SyntheticLoop(r["dim"], batch, device), r["producer_s"], r["consumer_s"]),
                Knobs(**r["knobs"]),
                r["wall_s"],
            )
            for r in async_runs
        ]
    )


def kendall(xs: list[float], ys: list[float]) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(xs, ys).statistic)


def measure_grid(loop: SyntheticLoop, iters: int, warmup: int, rounds: int) -> list[list[float]]:
    """Seconds per iteration of every configuration in each of ``rounds`` rounds (``[round][config]``),
    each round in a fresh random order (so a change of machine load spreads over all configurations)."""
    runs: list[list[float]] = [[0.0] * len(SPACE) for _ in range(rounds)]
    order = list(range(len(SPACE)))
    rng = random.Random(loop.dim)
    for r in range(rounds):
        rng.shuffle(order)
        for i in order:
            runs[r][i] = loop.run(SPACE[i], iters, warmup)[0]
    return runs


def repeatability(rounds: list[list[float]]) -> float | None:
    """Median Kendall tau between two rounds of the same grid: the best tau any model can reach when
    ranked against one round (``None`` with one round)."""
    taus = [kendall(a, b) for n, a in enumerate(rounds) for b in rounds[n + 1 :]]
    return statistics.median(taus) if taus else None


def split_halves(rounds: list[list[float]]) -> float | None:
    """Kendall tau between the medians of the even and of the odd rounds: how far two measurements of
    the grid, each of half the rounds, agree (``None`` with fewer than two rounds)."""
    if len(rounds) < 2:
        return None
    halves = [[statistics.median(r[i] for r in rounds[h::2]) for i in range(len(rounds[0]))] for h in (0, 1)]
    return kendall(*halves)


def confirm(loop: SyntheticLoop, a: Knobs, b: Knobs, iters: int, warmup: int) -> tuple[float, float]:
    """Median seconds per iteration of ``a`` and ``b`` over ``CONFIRM_ROUNDS`` fresh runs each, run
    alternately: a gap between a configuration and the grid's best without the grid's selection bias
    (the best of 32 noisy medians is low by luck as well as by speed)."""
    runs: dict[Knobs, list[float]] = {a: [], b: []}
    for r in range(CONFIRM_ROUNDS):
        for knobs in (a, b) if r % 2 == 0 else (b, a):
            runs[knobs].append(loop.run(knobs, iters, warmup)[0])
    return statistics.median(runs[a]), statistics.median(runs[b])


def evaluate(
    dim: int, batch: int, device: str, cal: Calibration, iters: int, warmup: int, rounds: int, cache: Path
) -> dict[str, Any]:
    """All of ``SPACE`` measured and predicted at one size, and the tuner's pick."""
    loop = SyntheticLoop(dim, batch, device)
    producer_s, consumer_s = loop.compute_only(iters)
    model = cal.model(loop, producer_s, consumer_s)
    per_round = measure_grid(loop, iters, warmup, rounds)
    measured = [statistics.median(r[i] for r in per_round) for i in range(len(SPACE))]
    predicted = [model.predict(k).wall_s for k in SPACE]
    margin = cal.relative_error(batch, device)
    # the candidates' own iterations at the predicted best, plus 2% of a 100-iteration run of overhead
    budget = (TUNING_SHARE * 100 + TOP_K * (PROBE_ITERS + PROBE_WARMUP)) * min(predicted)
    probes = Probes(loop)
    tuner = AutoTuner(
        SPACE,
        model.predict,
        probes,
        cache_dir=cache,
        top_k=TOP_K,
        budget_s=budget,
        margin=margin,
        repeats=REPEATS,
    )
    try:
        choice = tuner.tune(Signature("synthetic", batch, float(loop.item_bytes), fingerprint()))
    finally:
        probes.close()
    pick = SPACE.index(choice.config)
    best = min(range(len(SPACE)), key=measured.__getitem__)
    order_m = sorted(range(len(SPACE)), key=measured.__getitem__)[:8]
    order_p = sorted(range(len(SPACE)), key=predicted.__getitem__)[:8]
    auto_s = choice.measured_s[describe(choice.config)]
    probe_iterations = probes.iterations
    overhead = choice.tuning_s - probe_iterations * measured[best]
    if pick == best:
        confirmed = (measured[best], measured[best])
    else:
        confirmed = confirm(loop, SPACE[pick], SPACE[best], iters, warmup)
    unseen = [n for n, k in enumerate(SPACE) if k not in CALIB_CONFIGS]
    return {
        "dim": dim,
        "item_bytes": loop.item_bytes,
        "batch": batch,
        "producer_s": producer_s,
        "consumer_s": consumer_s,
        "configs": [dataclasses.asdict(k) for k in SPACE],
        "measured_s": measured,
        "measured_s_per_round": per_round,
        "predicted_s": predicted,
        "predicted_terms": [model.predict(k).terms for k in SPACE],
        "best_measured": {"config": describe(SPACE[best]), "seconds": measured[best]},
        "predicted_best": {"config": describe(SPACE[order_p[0]]), "measured_seconds": measured[order_p[0]]},
        "top8_same_set": set(order_m) == set(order_p),
        "top8_same_order": order_m == order_p,
        "top8_overlap": len(set(order_m) & set(order_p)),
        "kendall_tau": kendall(predicted, measured),
        "kendall_tau_unseen_configs": kendall([predicted[n] for n in unseen], [measured[n] for n in unseen]),
        "kendall_tau_between_rounds": repeatability(per_round),
        "kendall_tau_split_halves": split_halves(per_round),
        "auto": {
            "config": describe(choice.config),
            "reason": choice.reason,
            "staleness": choice.prediction.staleness.describe(),
            "seconds_in_tuning": auto_s,
            "seconds_in_grid": measured[pick],
            "gap_to_best_grid": measured[pick] / measured[best] - 1,
            # the pick and the grid's best re-measured in fresh alternating runs (0 if they are one)
            "confirm_rounds": 0 if pick == best else CONFIRM_ROUNDS,
            "confirmed_seconds_pick_best": list(confirmed),
            "gap_to_best_confirmed": confirmed[0] / confirmed[1] - 1,
            "tuning_s": choice.tuning_s,
            "tuning_budget_s": budget,
            "margin": margin,
            "measured_by_tuner": len(choice.measured_s),
            "tuner_measured_s": choice.measured_s,  # each candidate's median probe
            # the tuner's candidates ran real iterations; what tuning cost the run is the time beyond
            # running as many iterations at the best configuration (set-up, worse candidates)
            "tuning_iterations": probe_iterations,
            "repeats": REPEATS,
            "tuning_overhead_s": overhead,
            "tuning_share_of_100_iterations": overhead / (100 * measured[best]),
            # the work counters of the pick's measurement (same loop, same items, every config)
            "work": {"puts": PUTS, "gets": GETS, "items_in": PUTS * FRAG, "items_out": GETS * batch},
        },
    }


def _overlap(c: OverlapCosts) -> str:
    return (
        f"sigma {c.interference:.2f}, hand-off per get {c.handoff_s * 1e6:.0f} us, wake-up per ingestion "
        f"call {c.wake_ingest_s * 1e6:.0f} us, per delivery call {c.wake_deliver_s * 1e6:.0f} us"
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = script.pyplot()
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 4), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        pred = [p * 1e3 for p in row["predicted_s"]]
        meas = [m * 1e3 for m in row["measured_s"]]
        ax.scatter(pred, meas, c="0.6", s=18, label="manual (32)")
        pick = [describe(Knobs(**c)) for c in row["configs"]].index(row["auto"]["config"])
        ax.scatter([pred[pick]], [meas[pick]], c="tab:red", marker="*", s=160, label="auto")
        lo, hi = min(pred + meas), max(pred + meas)
        ax.plot([lo, hi], [lo, hi], "k:", lw=0.8)
        gap, again = row["auto"]["gap_to_best_grid"], row["auto"].get("gap_to_best_confirmed")
        redo = "" if again is None else f" (re-measured {again:+.1%})"
        ax.set_title(
            f"{row['item_bytes']} B/item: tau={row['kendall_tau']:.2f}, auto {gap:+.1%}{redo}", fontsize=8
        )
        ax.set_xlabel("predicted ms/iter")
        ax.set_ylabel("measured ms/iter")
        ax.legend(fontsize=7)
    script.save_figure(fig, path)


def refit(path: Path, device: str) -> list[dict[str, Any]]:
    """Re-predict a recorded run (``path``) with the current equations, no new measurement.

    The operator costs are the recorded calibration's. The overlap costs are refitted on the recorded
    calibration runs where the file has them; an older file without them gets, per size, overlap costs
    fitted on the async grid rows of the *other* sizes (a hold-out by size)."""
    record = json.loads(path.read_text())
    c = record["calibration"]
    rows = record["rows"]
    base = Calibration(
        OperatorCost(**c["ingest"]),
        OperatorCost(**c["deliver"]),
        c["call_s"],
        OverlapCosts(),
        record["machine"]["bandwidth_host_to_consumer"],
        c.get("runs", []),
    )
    batch = rows[0]["batch"]
    if base.runs:
        fit_overlap(base, batch, device)
    out = []
    for row in rows:
        cal = base
        if not base.runs:  # hold-out by size: the other sizes' async grid rows calibrate
            cal = dataclasses.replace(
                base,
                runs=[
                    {
                        "dim": o["dim"],
                        "knobs": k,
                        "wall_s": m,
                        "producer_s": o["producer_s"],
                        "consumer_s": o["consumer_s"],
                    }
                    for o in rows
                    if o is not row
                    for k, m in zip(o["configs"], o["measured_s"], strict=True)
                    if k["overlap"] == "async"
                ],
            )
            fit_overlap(cal, batch, device)
        model = cal.model(SyntheticLoop(row["dim"], batch, device), row["producer_s"], row["consumer_s"])
        predicted = [model.predict(Knobs(**k)).wall_s for k in row["configs"]]
        measured = row["measured_s"]
        best_p = min(range(len(predicted)), key=predicted.__getitem__)
        out.append(
            {
                "item_bytes": row["item_bytes"],
                "overlap_costs": dataclasses.asdict(cal.overlap),
                "overlap_costs_fitted_on": "calibration runs"
                if base.runs
                else "other sizes' async grid rows",
                "kendall_tau_recorded_model": kendall(row["predicted_s"], measured),
                "kendall_tau_current_model": kendall(predicted, measured),
                "kendall_tau_between_rounds": row.get("kendall_tau_between_rounds"),
                "predicted_best_gap_to_best": measured[best_p] / min(measured) - 1,
            }
        )
        r = out[-1]
        print(
            f"{r['item_bytes']:>6} B/item  tau recorded model {r['kendall_tau_recorded_model']:.2f}  "
            f"current model {r['kendall_tau_current_model']:.2f}  predicted best is "
            f"{r['predicted_best_gap_to_best']:+.1%} off the best measured  ({_overlap(cal.overlap)})"
        )
    return out


def main() -> None:
    parser = script.parser(__doc__.split("\n\n")[0], quick="few iterations per configuration (a check)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--refit", type=Path, default=None, help="re-predict a recorded results file (no measurement)"
    )
    args = parser.parse_args()
    token = provenance.start()
    torch.set_num_threads(1)
    if args.refit is not None:
        refitted = refit(args.refit, args.device)
        out = args.out or args.refit.with_name(args.refit.stem + "_refit.json")
        machine = {"device": args.device, **provenance.finish(token)}
        record = {
            "benchmark": "autotune_refit",
            "source": str(args.refit),
            "rows": refitted,
            "machine": machine,
        }
        out.write_text(json.dumps(record, indent=1))
        print(f"wrote {out}")
        return
    iters, warmup, rounds = (4, 1, 2) if args.quick else (12, 2, 6)
    topo = local_topology()
    consumer_tier = "node0/host" if args.device == "cpu" else f"node0/{args.device}"
    bandwidth = link_bandwidth(topo, "node0/host", consumer_tier)
    t0 = time.perf_counter()
    cal = calibrate(args.batch, args.device, iters, warmup, bandwidth)
    error = cal.relative_error(args.batch, args.device)
    print(
        f"calibration ({cal.seconds:.1f} s, {len(cal.runs)} runs): ingest {cal.ingest}, deliver {cal.deliver}, "
        f"call {cal.call_s * 1e6:.1f} us, {_overlap(cal.overlap)}; "
        f"median model error on the calibration runs {error:.1%} (the tuner's margin)"
    )
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for dim in EVAL_DIMS:
            row = evaluate(dim, args.batch, args.device, cal, iters, warmup, rounds, Path(cache))
            rows.append(row)
            a = row["auto"]
            print(
                f"{row['item_bytes']:>6} B/item  best {row['best_measured']['seconds'] * 1e3:6.2f} ms "
                f"({row['best_measured']['config']})  predicted best {row['predicted_best']['config']}  "
                f"tau {row['kendall_tau']:.2f} (unseen configs {row['kendall_tau_unseen_configs']:.2f}, "
                f"round vs round {_fmt(row['kendall_tau_between_rounds'])}, half vs half "
                f"{_fmt(row['kendall_tau_split_halves'])})  top8 overlap {row['top8_overlap']}/8 "
                f"order {'same' if row['top8_same_order'] else 'differs'}  auto {a['config']}: "
                f"gap {a['gap_to_best_grid']:+.1%} in the grid, {a['gap_to_best_confirmed']:+.1%} re-measured "
                f"(ratio auto/best {1 + a['gap_to_best_confirmed']:.3f}), "
                f"tuning {a['tuning_share_of_100_iterations']:.1%} of 100 iterations"
            )
    summary = {
        "min_kendall_tau": min(r["kendall_tau"] for r in rows),
        "min_kendall_tau_between_rounds": min(
            (r["kendall_tau_between_rounds"] for r in rows if r["kendall_tau_between_rounds"] is not None),
            default=None,
        ),
        "min_kendall_tau_split_halves": min(
            (r["kendall_tau_split_halves"] for r in rows if r["kendall_tau_split_halves"] is not None),
            default=None,
        ),
        "max_gap_to_best": max(r["auto"]["gap_to_best_grid"] for r in rows),
        "max_gap_to_best_confirmed": max(r["auto"]["gap_to_best_confirmed"] for r in rows),
        "max_tuning_share_of_100_iterations": max(r["auto"]["tuning_share_of_100_iterations"] for r in rows),
        "calibration_share_of_100_iterations_at_each_size": [
            cal.seconds / (100 * r["best_measured"]["seconds"]) for r in rows
        ],
    }
    print(
        f"targets (issue 14): tau >= 0.8 at every size: min {summary['min_kendall_tau']:.2f} (half vs half "
        f"{_fmt(summary['min_kendall_tau_split_halves'])}); auto within 5% of best: worst "
        f"{summary['max_gap_to_best']:+.1%} in the grid, {summary['max_gap_to_best_confirmed']:+.1%} re-measured; "
        f"tuning <= 2% of 100 iterations: worst "
        f"{summary['max_tuning_share_of_100_iterations']:.1%} (calibration, once per machine: {cal.seconds:.1f} s)"
    )
    machine = {"device": args.device, "torch_threads": 1, "bandwidth_host_to_consumer": bandwidth}
    machine.update(provenance.finish(token))
    record = {
        "iterations_per_config": iters,
        "rounds": rounds,
        "warmup": warmup,
        "calibration": {
            "dims": CALIB_DIMS,
            "ingest": dataclasses.asdict(cal.ingest),
            "deliver": dataclasses.asdict(cal.deliver),
            "call_s": cal.call_s,
            "overlap": dataclasses.asdict(cal.overlap),
            "configs": [dataclasses.asdict(k) for k in CALIB_CONFIGS],
            "runs": cal.runs,
            "seconds": cal.seconds,
            "median_relative_error": error,
        },
        "rows": rows,
        "summary": summary,
        "machine": machine,
    }
    out = script.write_result("autotune", args, record, lambda png: plot(rows, png))
    print(f"wrote {out} and {out.with_suffix('.png')} ({time.perf_counter() - t0:.0f} s in all)")


if __name__ == "__main__":
    main()
