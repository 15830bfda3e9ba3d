"""Does the cost model rank configurations the way they measure, and does the auto-tuner pick the best?

    python benchmarks/autotune.py [--quick] [--device cpu|cuda] [--out FILE]

The workload is a real loop on the core (:class:`autotune_loop.SyntheticLoop`). Calibration
(``autotune_calibration.py``, never evaluated): the ten :data:`CALIB_CONFIGS` at each of ``CALIB_DIMS``,
each run ``CALIB_ROUNDS`` times, give the ingestion and delivery costs (``OperatorCost.fit``; delivery's
per-byte term from the measured host link), the fixed cost per put and the overlap costs
(``calibrate_overlap``); the model's median relative error on them is the tuner's ``margin``. At each
evaluated size all 32 configurations of :data:`SPACE` are measured (rounds in fresh random orders)
and predicted, and an :class:`~conduit.tuner.AutoTuner` with a fresh cache probes its top candidates
and picks. Reported per size: the best measured and predicted, the top-8
order, Kendall's tau (also between rounds and half against half: what noise allows), the pick's gap to
the best (in the grid and re-measured, :func:`confirm`) and the tuning overhead as a share of a
100-iteration run. Method: ``benchmarks/notes/autotune.md``. JSON and PNG under ``benchmarks/results/``.
"""

from __future__ import annotations

import dataclasses
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
import report_ops  # noqa: E402
import script  # noqa: E402
from autotune_calibration import CALIB_CONFIGS, CALIB_DIMS, Calibration, calibrate, describe_overlap  # noqa: E402
from autotune_loop import EVAL_DIMS, FRAG, GETS, PROBE_ITERS, PROBE_WARMUP, PUTS, Probes, SyntheticLoop  # noqa: E402
from autotune_rank import kendall, prediction_panel, ranking  # noqa: E402

from conduit.costmodel import Knobs, link_bandwidth  # noqa: E402
from conduit.discovery import fingerprint, local_topology  # noqa: E402
from conduit.tuner import AutoTuner, Signature, describe  # noqa: E402

TUNING_SHARE = 0.02  # tuning overhead allowed, as a share of a 100-iteration run
TOP_K = 3  # candidates the tuner measures at most (those within the model's error of the best)
REPEATS = 3  # probes of each candidate, in alternating rounds (the tuner keeps the median)
CONFIRM_ROUNDS = 6  # fresh alternating runs of the pick and the grid's best (the gap without selection bias)
SPACE: list[Knobs] = (
    [Knobs("sync", g_del=g) for g in (1, 2, 4, 8)]
    + [Knobs("async", 2 * d, i, d) for i in (1, 2, 4, 8) for d in (1, 2, 4, 8)]
    + [Knobs("async", d, i, d) for i in (1, 4, 8) for d in (1, 2, 4, 8)]
)
assert len(SPACE) == 32


def measure_grid(loop: SyntheticLoop, iters: int, warmup: int, rounds: int) -> list[list[float]]:
    """Seconds per iteration of every configuration in each of ``rounds`` rounds (``[round][config]``),
    each round in a fresh random order (so a change of machine load spreads over all configurations)."""
    steps = {i: (lambda k=k: loop.run(k, iters, warmup)[0]) for i, k in enumerate(SPACE)}
    runs = script.interleaved(steps, rounds, random.Random(loop.dim))
    return [[runs[i][r] for i in range(len(SPACE))] for r in range(rounds)]


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
    tuner = AutoTuner(SPACE, model.predict, probes, cache_dir=cache, top_k=TOP_K, budget_s=budget, margin=margin,
                      repeats=REPEATS)  # fmt: skip
    try:
        choice = tuner.tune(Signature("synthetic", batch, float(loop.item_bytes), fingerprint()))
    finally:
        probes.close()
    pick = SPACE.index(choice.config)
    best = min(range(len(SPACE)), key=measured.__getitem__)
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
        **ranking([describe(k) for k in SPACE], measured, predicted, per_round),
        "kendall_tau_unseen_configs": kendall([predicted[n] for n in unseen], [measured[n] for n in unseen]),
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


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = script.pyplot()
    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 4), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        pick = [describe(Knobs(**c)) for c in row["configs"]].index(row["auto"]["config"])
        gap, again = row["auto"]["gap_to_best_grid"], row["auto"].get("gap_to_best_confirmed")
        redo = "" if again is None else f" (re-measured {again:+.1%})"
        title = f"{row['item_bytes']} B/item: tau={row['kendall_tau']:.2f}, auto {gap:+.1%}{redo}"
        prediction_panel(ax, row, pick, "manual (32)", title, "iter")
    script.save_figure(fig, path)


def main() -> None:
    parser = script.parser(__doc__.split("\n\n")[0], quick="few iterations per configuration (a check)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    token = provenance.start()
    torch.set_num_threads(1)
    iters, warmup, rounds = (4, 1, 2) if args.quick else (12, 2, 6)
    consumer_tier = "node0/host" if args.device == "cpu" else f"node0/{args.device}"
    bandwidth = link_bandwidth(local_topology(), "node0/host", consumer_tier)
    t0 = time.perf_counter()
    cal = calibrate(args.batch, args.device, iters, warmup, bandwidth)
    error = cal.relative_error(args.batch, args.device)
    print(
        f"calibration ({cal.seconds:.1f} s, {len(cal.runs)} runs): ingest {cal.ingest}, deliver {cal.deliver}, "
        f"call {cal.call_s * 1e6:.1f} us, {describe_overlap(cal.overlap)}; "
        f"median model error on the calibration runs {error:.1%} (the tuner's margin)"
    )
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for dim in EVAL_DIMS:
            row = evaluate(dim, args.batch, args.device, cal, iters, warmup, rounds, Path(cache))
            rows.append(row)
            a = row["auto"]
            print(
                f"{row['item_bytes']:>6} B/item: tau {row['kendall_tau']:.2f}, auto {a['config']}", flush=True
            )
    summary = {
        "min_kendall_tau": min(r["kendall_tau"] for r in rows),
        **{
            f"min_{k}": min((r[k] for r in rows if r[k] is not None), default=None)
            for k in ("kendall_tau_between_rounds", "kendall_tau_split_halves")
        },  # fmt: skip
        "max_gap_to_best": max(r["auto"]["gap_to_best_grid"] for r in rows),
        "max_gap_to_best_confirmed": max(r["auto"]["gap_to_best_confirmed"] for r in rows),
        "max_tuning_share_of_100_iterations": max(r["auto"]["tuning_share_of_100_iterations"] for r in rows),
        "calibration_share_of_100_iterations_at_each_size": [
            cal.seconds / (100 * r["best_measured"]["seconds"]) for r in rows
        ],
    }
    machine = script.machine(token, device=args.device, torch_threads=1, bandwidth_host_to_consumer=bandwidth)
    calibration = {"dims": CALIB_DIMS, "ingest": dataclasses.asdict(cal.ingest),
                   "deliver": dataclasses.asdict(cal.deliver), "call_s": cal.call_s,
                   "overlap": dataclasses.asdict(cal.overlap), "configs": [dataclasses.asdict(k) for k in CALIB_CONFIGS],
                   "runs": cal.runs, "seconds": cal.seconds, "median_relative_error": error}  # fmt: skip
    record = {"iterations_per_config": iters, "rounds": rounds, "warmup": warmup, "calibration": calibration,
              "rows": rows, "summary": summary, "machine": machine}  # fmt: skip
    # targets (issue 14): tau >= 0.8, auto within 5%, tuning <= 2%
    script.write_result("autotune", args, record, lambda png: plot(rows, png), report_ops.autotune)
    print(f"{time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
