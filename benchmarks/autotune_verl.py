"""verl CPU mode, paced rollout: the piece-size model against measured steps, ``auto`` against fixed ``g``.

    python benchmarks/autotune_verl.py [--quick] [--medians 32,64,128] [--grid 1,2,3,4,6,8,12,16]

For each workload (median response length; tail and R as the paced defaults, calibrated per workload
like ``verl_iteration.py``'s paced points):

1. **Grid**: one conduit run whose ``piece_groups`` follows a schedule (``--g-schedule``, harness only): three
   settling steps (warm-up, 4, 2), then every ``g`` of the grid ``--reps`` times, each repetition in
   a new random order (seeded), so drift in the machine's load does not favour one ``g``. The policy
   fits every piece as ``auto`` does; before each step, its model predicts the exposed tail of every
   candidate ``g`` on that step's finish times from the fit of the *earlier* steps (the trace,
   ``pieces.jsonl``: the prediction has not seen the step it predicts).
2. **Auto**: a conduit run with ``piece_groups=auto`` (the default) on the same workload, with a fresh tuner
   cache, as many steps as the grid run; then a second ``auto`` run sharing that cache, which starts
   from the first run's decision (``cached``: what a later run of the same workload pays for tuning).

Per workload: Kendall's τ between the predicted and the measured exposed tail over the grid (and
against the measured iteration less its modelled generation and updates, ``rest``: steps draw
different responses, so whole iterations of different steps would rank the data, not ``g``), the
same τ between two measured repetitions (the ceiling noise puts on any model), the best 3 by prediction against the best 3
measured, the model's pick in the grid and ``auto``'s own run against the best fixed ``g``, and how
many of ``auto``'s steps were whole-batch probes. ``auto`` is compared with the fixed ``g`` on the
same steps (the grid's measured steps; an ``auto`` run has as many steps as the grid run, and the
step number draws the data), its ``rest`` gap twice: as a share of the tuned part (the best fixed
``g``'s ``rest``: what the tuner controls; target within 10 %) and as a share of the iteration
(the grid's median iteration: end to end; target within 5 %). Predictions come twice: ``recorded`` (the run's own
policy) and ``replayed`` (this checkout's policy code fed the run's recorded pieces, so a changed model
is judged on the same steps; ``--reuse`` re-analyses a run). A paced row is a model of separate
rollout hardware (see ``verl_iteration.py``), not a GPU measurement.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_verl  # noqa: E402
import script  # noqa: E402
from autotune_verl_analysis import (  # noqa: E402
    auto_summary,
    evaluate,
    grid_view,
    read_trace,
    recorded,
    replay,
)
from verl_analysis import calibration, rows_for_run  # noqa: E402
from verl_runs import add_run_flags, calibrate, harness_args, machine, run  # noqa: E402

#: the grid run's first steps: warm-up, then two streamed steps so the first fit sees varied pieces
SETTLE = (4, 4, 2)


def schedule(grid: list[int], reps: int, seed: int) -> list[int]:
    """``SETTLE`` then each ``g`` of ``grid`` ``reps`` times, every repetition in a new random order."""
    rng = random.Random(seed)
    return [*SETTLE, *(g for _ in range(reps) for g in rng.sample(grid, len(grid)))]


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """Per workload: measured and predicted exposed tail against ``g`` (top), iteration less modelled
    generation against ``g`` with ``auto``'s run (bottom)."""
    fig, axes = script.pyplot().subplots(2, len(points), figsize=(4.2 * len(points), 6.5), squeeze=False)
    for col, point in enumerate(points):
        view = point["views"]["recorded"]
        gs = sorted(int(g) for g in view["per_g"])
        top, bottom = axes[0][col], axes[1][col]
        for g in gs:
            d = view["per_g"][str(g)]
            top.scatter([g] * len(d["tail"]), d["tail"], s=10, color="grey", alpha=0.6)
            bottom.scatter([g] * len(d["rest"]), d["rest"], s=10, color="grey", alpha=0.6)
        med = view["medians"]
        top.plot(gs, [med[str(g)]["tail"] for g in gs], "o-", color="black", label="measured (median)")
        for name, style in (("recorded", "s--"), ("replayed", "^:")):
            ev = point["evaluation"][name]
            m = point["views"][name]["medians"]
            label = f"predicted, {name} (tau {_fmt(ev['tau_tail'])})"
            top.plot(gs, [m[str(g)]["pred"] for g in gs], style, label=label)
        bottom.plot(gs, [med[str(g)]["rest"] for g in gs], "o-", color="black", label="fixed g (median)")
        ev = point["evaluation"]["recorded"]
        if ev["auto_rest_s"] is not None:
            label = f"auto run (median, {ev['auto_probes']}/{ev['auto_steps']} probes)"
            bottom.axhline(ev["auto_rest_s"], color="tab:red", label=label)
        cached = (point.get("cached") or {}).get("recorded")
        if cached and cached["auto_rest_s"] is not None:
            label = f"auto, 2nd run from the cache ({cached['auto_probes']}/{cached['auto_steps']} probes)"
            bottom.axhline(cached["auto_rest_s"], color="tab:blue", linestyle="--", label=label)
        top.set_title(f"median response {point['median']} tokens")
        top.set_ylabel("exposed tail (s)")
        bottom.set_ylabel("iteration less modelled generation (s)")
        bottom.set_xlabel("piece_groups (groups per piece; 16 = whole batch)")
        top.legend(fontsize=7)
        bottom.legend(fontsize=7)
    fig.suptitle(
        "verl CPU GRPO, PACED rollout (modelled separate rollout hardware): piece-size model vs measured"
    )
    script.save_figure(fig, path)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def run_point(root: Path, args: argparse.Namespace, median: int) -> dict[str, Any]:
    """Calibrate, run the grid schedule and the auto run for one median response length."""
    a = copy.copy(args)
    a.pace_median = median
    here = root / f"median{median}"
    cal = calibration(calibrate(here, a, args.tail))
    scale = args.R * cal["time_scale_per_R"]
    harness = harness_args(a, args.tail, scale)
    plan = schedule(args.grid, args.reps, args.seed + median)
    extra = ["--g-schedule", ",".join(map(str, plan)), "+trainer.v1.conduit.piece_groups=auto", *harness]
    point: dict[str, Any] = {"median": median, "calibration": cal, "time_scale": scale, "schedule": plan}
    point["errors"] = {}
    rc, log = run(here / "grid", "conduit", len(plan), a, extra)
    if rc:
        point["errors"]["grid"] = log
        return point
    rows = rows_for_run(here / "grid", "grpo", "conduit", len(SETTLE), {})
    trace = read_trace(here / "grid")
    # the auto run keeps its decision in a fresh tuner cache; a second auto run starts from it
    auto_extra = [
        "+trainer.v1.conduit.piece_groups=auto",
        "--tuner-cache",
        str(here / "tuner_cache"),
        *harness,
    ]
    rc, log = run(here / "auto", "conduit", args.auto_steps + 1, a, auto_extra)
    auto_rows = [] if rc else rows_for_run(here / "auto", "grpo", "conduit", 1, {})
    if rc:
        point["errors"]["auto"] = log
    rc, log = run(here / "auto_cached", "conduit", args.auto_steps + 1, a, auto_extra)
    cached_rows = [] if rc else rows_for_run(here / "auto_cached", "grpo", "conduit", 1, {})
    if rc:
        point["errors"]["auto_cached"] = log
    keep = ("iteration", "wall_s", "exposed_s", "g_ing", "model_gen_s", "stages")
    point["auto_rows"] = [{k: r.get(k) for k in keep} for r in auto_rows]
    sources = {"recorded": recorded(trace), "replayed": replay(trace, args.batch_size)}
    point["views"] = {
        name: grid_view(rows, trace, args.grid, preds, scale) for name, preds in sources.items()
    }
    auto_trace = read_trace(here / "auto")
    point["evaluation"] = {
        name: evaluate(view, auto_rows, auto_trace, scale) for name, view in point["views"].items()
    }
    cached_trace = read_trace(here / "auto_cached")
    point["cached"] = {
        name: auto_summary(cached_rows, cached_trace, scale, view) for name, view in point["views"].items()
    }
    return point


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = script.parser(__doc__, quick="one workload, one repetition (a smoke test: --grid 1,16 for less)")
    p.add_argument("--medians", default=None, help="median response lengths (default 32,64,128; quick 64)")
    p.add_argument(
        "--grid", default="1,2,3,4,6,8,12,16", help="fixed piece_groups values (16 = the whole batch)"
    )
    p.add_argument("--reps", type=int, default=None, help="repetitions of the grid (default 3; quick 1)")
    p.add_argument(
        "--auto-steps",
        type=int,
        default=None,
        help="measured steps of each auto run (default: the grid run's steps less its warm-up, so auto "
        "runs the grid's steps; it is compared with the fixed g on the steps both measured)",
    )
    add_run_flags(p, timeout=1200)
    args = p.parse_args(argv)
    args.medians = [int(m) for m in (args.medians or ("64" if args.quick else "32,64,128")).split(",")]
    args.grid = sorted({int(g) for g in args.grid.split(",")})
    args.reps = args.reps or (1 if args.quick else 3)
    args.auto_steps = args.auto_steps or len(SETTLE) + len(args.grid) * args.reps - 1
    # the shape verl_iteration.py's paced points use (verl_runs' run / calibrate / harness_args read these)
    args.rollout, args.algo, args.batch_size, args.n, args.response_length = "paced", "grpo", 16, 8, 256
    if max(args.grid) > args.batch_size or min(args.grid) < 1:
        p.error(f"--grid values must lie in 1..{args.batch_size} (prompt groups per step)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    prov = provenance.start()
    root = Path(args.work or tempfile.mkdtemp(prefix="autotune_verl_"))
    out = args.out or script.RESULTS / f"autotune_verl{'_quick' * args.quick}.json"
    earlier = json.loads(out.read_text()) if args.reuse and out.exists() else None
    points = []
    for median in args.medians:
        points.append(run_point(root, args, median))
    result: dict[str, Any] = {
        "rollout": "paced",
        "points": points,
        "machine": machine(),
        "method": {
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "description": __doc__,  # the grid run, recorded / replayed predictions, rest, gaps, auto, cached
            "grid": f"settle {SETTLE}, then grid {args.grid} x {args.reps} in seeded random orders",
            "auto_steps": args.auto_steps,
            "shape": "GRPO 16 prompts x n=8, responses <= 256 tokens, lognormal lengths (median per workload, "
            f"p99/median {args.tail:g}), R {args.R:g}",
        },
    }
    result["machine"].update(provenance.finish(prov))
    if earlier is not None:  # a re-analysis: the provenance is the runs', this one is noted beside it
        result["reanalysis"] = result["machine"]
        result["machine"] = earlier["machine"]
    done = [p for p in points if "evaluation" in p]
    args.out = out
    figure = functools.partial(plot, done) if done else lambda png: None
    script.write_result("autotune_verl", args, result, figure, report_verl.autotune_verl)
    return 0 if len(done) == len(points) else 1


if __name__ == "__main__":
    sys.exit(main())
