"""verl CPU mode: what ``piece_groups=auto``'s tuning costs over a long run, fresh and from its cache.

    python benchmarks/tuning_cost_verl.py [--steps 100] [--rollout hf|paced] [--quick]

Two conduit runs of GRPO with ``piece_groups=auto``, ``--steps`` measured iterations each after the
warm-up: the first with a fresh tuner cache, the second sharing it. Per run: each step's arm (``whole``
or ``stream``), the probe steps (``conduit/policy/probe_steps`` increments), the settled arm (most
non-probe steps), and the tuning cost: over the steps in the *other* arm, the sum of (iteration less the
settled arm's median non-probe iteration), as a share of the run's summed iterations (it carries the
steps' noise and can be negative). Target (issue 14): at most 2% of a 100-iteration run. Method:
``benchmarks/notes/tuning_cost_verl_hf.md``. JSON + PNG under ``benchmarks/results/``; a ``paced`` row is
a model of separate rollout hardware, not a GPU measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_verl  # noqa: E402
import script  # noqa: E402
from verl_analysis import calibration, jsonl, rows_for_run  # noqa: E402
from verl_runs import add_run_flags, calibrate, harness_args, machine, run  # noqa: E402

TARGET = 0.02


def probe_flags(work: Path) -> dict[int, bool]:
    """Step -> whether it was a probe (the policy's probe counter went up on that step)."""
    flags, before = {}, 0.0
    for rec in jsonl(work / "metrics.jsonl"):
        count = float(rec["data"].get("conduit/policy/probe_steps", before))
        flags[int(rec["step"])] = count > before
        before = count
    return flags


def tuning_cost(rows: list[dict[str, Any]], groups: int) -> dict[str, Any]:
    """The run's arms, probes, settled arm and tuning cost (module docstring)."""
    steps = [
        {
            "iteration": r["iteration"],
            "wall_s": r["wall_s"],
            "arm": "whole" if int(r["g_ing"] or 0) >= groups else "stream",
            "probe": r["probe"],
        }
        for r in rows
    ]
    settled_steps = [s for s in steps if not s["probe"]] or steps
    counts = {arm: sum(s["arm"] == arm for s in settled_steps) for arm in ("stream", "whole")}
    settled = max(counts, key=lambda arm: counts[arm])
    reference = statistics.median(s["wall_s"] for s in settled_steps if s["arm"] == settled)
    other = [s for s in steps if s["arm"] != settled]
    extra = sum(s["wall_s"] - reference for s in other)
    total = sum(s["wall_s"] for s in steps)
    medians = {
        arm: statistics.median([s["wall_s"] for s in steps if s["arm"] == arm])
        for arm in ("stream", "whole")
        if any(s["arm"] == arm for s in steps)
    }
    return {
        "steps": steps,
        "settled_arm": settled,
        "probe_steps": sum(s["probe"] for s in steps),
        "other_arm_steps": len(other),
        "median_wall_s": medians,
        "tuning_s": round(extra, 4),
        "total_s": round(total, 4),
        "tuning_share": round(extra / total, 5) if total else None,
    }


def work_counters(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Steps, responses and response tokens of a run."""
    return {
        "steps": len(rows),
        "responses": sum(r["work"]["responses"] for r in rows),
        "response_tokens": sum(r["work"]["response_tokens"] for r in rows),
    }


def plot(runs: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    fig, axes = script.pyplot().subplots(
        1, len(runs), figsize=(6 * len(runs), 3.6), sharey=True, squeeze=False
    )
    for ax, (name, res) in zip(axes[0], runs.items(), strict=True):
        for arm, colour in (("stream", "tab:blue"), ("whole", "tab:orange")):
            pts = [s for s in res["steps"] if s["arm"] == arm]
            ax.scatter([s["iteration"] for s in pts], [s["wall_s"] for s in pts], s=12, c=colour, label=arm)
        probes = [s for s in res["steps"] if s["probe"]]
        ax.scatter(
            [s["iteration"] for s in probes],
            [s["wall_s"] for s in probes],
            s=60,
            facecolors="none",
            edgecolors="k",
            label="probe",
        )
        share = res["tuning_share"]
        ax.set_title(
            f"{name}: {res['probe_steps']} probes, {res['other_arm_steps']} steps off '{res['settled_arm']}', "
            f"tuning {share * 100:+.1f}%"
            if share is not None
            else name,
            fontsize=9,
        )
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("iteration wall (s)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    script.save_figure(fig, path, dpi=120)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = script.parser(__doc__, quick="20 iterations per run")
    p.add_argument(
        "--steps", type=int, default=None, help="measured iterations per run (default 100; quick 20)"
    )
    p.add_argument("--rollout", choices=("hf", "paced"), default="hf")
    add_run_flags(p, timeout=3600, paced="paced: ")
    args = p.parse_args(argv)
    args.steps = args.steps or (20 if args.quick else 100)
    if args.steps < 10:
        p.error(
            "--steps must be at least 10 (the arms are measured 3 times each, re-measured every 10th step)"
        )
    # verl_runs' run / calibrate / harness_args read these
    paced = args.rollout == "paced"
    args.algo = "grpo"
    args.batch_size, args.n = (16, 8) if paced else (None, None)
    args.response_length, args.pace_median = 256, 64
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    prov = provenance.start()
    root = Path(args.work or tempfile.mkdtemp(prefix="tuning_cost_verl_"))
    harness = harness_args(args)
    if args.rollout == "paced":  # a short calibration run
        cal = calibration(calibrate(root, argparse.Namespace(**{**vars(args), "quick": True}), args.tail))
        harness = harness_args(args, args.tail, args.R * cal["time_scale_per_R"])
    groups = args.batch_size or 4  # the harness's default batch size: 4 prompts
    cache = root / "tuner_cache"
    extra = ["+trainer.v1.conduit.piece_groups=auto", "--tuner-cache", str(cache), *harness]
    runs: dict[str, dict[str, Any]] = {}
    counters: dict[str, dict[str, int]] = {}
    for name in ("fresh", "cached"):
        work = root / name
        rc, log = run(work, "conduit", args.steps + 1, args, extra)
        if rc:
            raise SystemExit(f"[tuning_cost] {name} run failed:\n{log}")
        rows = rows_for_run(work, "grpo", "conduit", 1, {})
        flags = probe_flags(work)
        for r in rows:
            r["probe"] = flags.get(r["iteration"], False)
        runs[name] = tuning_cost(rows, groups)
        counters[name] = work_counters(rows)
    label = (
        "PACED (a model of separate rollout hardware)"
        if args.rollout == "paced"
        else "hf rollout (shared cores)"
    )
    result: dict[str, Any] = {
        "rollout": args.rollout,
        "runs": runs,
        "work": counters,
        "work_equal": counters["fresh"] == counters["cached"],
        "target_share": TARGET,
        "machine": machine(),
        "method": {
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "runs": f"GRPO, conduit piece_groups=auto, {args.steps} measured steps after warm-up; 'fresh': an empty "
            "tuner cache; 'cached': the same workload sharing the first run's cache",
            "tuning": "sum over the steps run in the arm that did not settle of (iteration - median iteration "
            "of the settled arm's non-probe steps), as a share of the run's summed iterations",
            "rollout": label,
        },
    }
    result["machine"].update(provenance.finish(prov))
    title = f"piece_groups=auto tuning cost over {args.steps} iterations, {label}"
    name = f"tuning_cost_verl_{args.rollout}"
    script.write_result(name, args, result, lambda png: plot(runs, png, title), report_verl.tuning_cost)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
