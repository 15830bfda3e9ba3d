"""verl 0.9.1 on CPU under bounded staleness: Conduit's ``max_staleness=k`` mode and verl's async trainers.

    python benchmarks/verl_staleness.py [--algo grpo|ppo] [--quick] [--systems a,b,...] [--out FILE]
    python benchmarks/verl_staleness.py --rollout vllm ...
    python benchmarks/verl_staleness.py --reward-steps 50 --seeds 3     # also the reward curves
    python benchmarks/verl_staleness.py --reward-only --reward-steps 50 --seeds 3   # only the reward curves

Issue 30's benchmark, built on ``verl_iteration.py``'s runs (``verl_runs``: one harness run per system
and round, rounds alternating verl's and Conduit's systems; ``verl_analysis``: per-iteration rows, wall
and exposed time, medians, the backend ratio). Systems, same seed and data:

* ``verl_colocate_async``, ``verl_separate_async``: verl's async trainers (one batch generated ahead,
  no staleness bound: the harness sets ``trainer.v1.sampler.max_off_policy_threshold=null``), each on
  verl's SimpleStorage and, with the suffix ``+tq_conduit``, on Conduit's TransferQueue backend;
* ``verl_colocate_async_k1`` (the equal-bound baseline; ``_k<k>`` on either async trainer): the same
  trainer under verl's own bound, ``max_off_policy_threshold`` = k + 1 (verl counts the versions a
  trajectory spans: one version old spans 2) with strategy ``drop``;
* ``conduit_k0``, ``conduit_k1``, ``conduit_k2``: trainer mode ``conduit`` with
  ``+trainer.v1.conduit.max_staleness=k`` and a group log (``<work>/groups.jsonl``: one line per trained
  prompt group, the versions that generated it and the one that trained it); k = 0 is the on-policy mode;
* ``verl_sync_tuned`` (reference, on-policy): verl's sync trainer at a fixed replay-buffer poll period
  (``--poll``, default 0.02 s; no sweep here: ``verl_iteration.py`` sweeps it).

Every row (per measured iteration, and per system in ``summary``) carries ``algo``, ``system``,
``max_staleness`` (the bound: k; 0 for verl's sync trainer; None for verl's unbounded async ones),
the measured staleness ``staleness_median`` / ``staleness_max`` (lag = version trained on - oldest
version that generated any token of the group), ``wall_s``, ``exposed_s`` (``verl_analysis``), the
work counters (``work``: responses and response tokens the rollout generated per weight version;
``prompts_trained``, ``stale_dropped``, ``prompts_generated`` = trained + dropped) and
``update_weights_s`` (verl's ``timing_s/update_weights``: the weight push to the rollout). In async
modes the generated work depends on when in-flight requests are aborted and resumed: it is reported
beside the staleness ratios (``work/<a>_vs_<b>``), not a refusal; the backend and on-policy ratios
refuse on it, except on the last iteration of trainers that generate ahead.

Staleness sources: Conduit's rows from the group log (per group; the step's ``conduit/staleness/*``
metrics where no log is there); verl's rows from verl's own ``training/off_policy/
trajectory_staleness_worst/{mean,max}`` per step, so a verl system's ``staleness_median`` is the median
of per-step means (no per-group source exists for verl's trainers). ``conduit_k1 / verl_colocate_async``
(and every other conduit_k>=1 over each verl async system) is computed only where Conduit trained no
staler data: its median of per-step means (the statistic both sides have) and its maximum each at most
the verl system's (fresher data can only have cost Conduit time); otherwise ``refused/...`` says which
was staler, and ``staleness/...`` gives both measurements beside every computed ratio. The backend ratio (``backend/...``) is
``verl_analysis.ratios``' rule; ``conduit_k0 / verl_sync_tuned`` too (both on-policy).

``--reward-steps N --seeds S`` (off by default) also runs ``conduit_k1`` and ``verl_colocate_async`` for
N iterations with seeds seed..seed+S-1 on the same rollout and shape: mean score per iteration, and
whether k = 1's final score lies within verl's seed-to-seed spread. ``--reward-only``: those runs alone
(the paced rollout calibrated first), in a file of their own (``verl_staleness_reward[_vllm]_<algo>.json``
and its PNG), rewritten after every run. Paced rollout: a model of separate rollout hardware
(``verl_iteration.py``'s docstring), not a GPU measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_staleness  # noqa: E402
import script  # noqa: E402
from poll_check import poll_findings  # noqa: E402
from verl_analysis import calibration  # noqa: E402
from verl_plots import reward_curve  # noqa: E402
from verl_runs import (  # noqa: E402
    TQ_SUFFIX,
    add_run_flags,
    calibrate,
    harness_args,
    machine,
    plan_size,
    round_order,
    run_method,
    run_systems,
    split_system,
    table,
)
from verl_staleness_analysis import (  # noqa: E402
    CONDUIT_K,
    HEADLINE,
    TARGET_BACKEND_SPEEDUP,
    TARGET_EXPOSED,
    TARGET_WALL,
    VERL_K,
    all_ratios,
    annotate,
    bound,
    headline_pair,
    headlines,
    summarize,
    targets,
)

#: every system of the default run (``round_order`` pairs verl's with Conduit's in this order)
SYSTEMS = (
    "verl_colocate_async",
    "verl_colocate_async_k1",
    "verl_colocate_async+tq_conduit",
    "verl_separate_async",
    "verl_separate_async+tq_conduit",
    "verl_sync_tuned",
    "conduit_k1",
    "conduit_k0",
    "conduit_k2",
)
#: ``--quick``: the headline pair, the backend pair, and the on-policy mode (4 runs, ~10 min)
QUICK_SYSTEMS = ("verl_colocate_async", "verl_colocate_async+tq_conduit", "conduit_k1", "conduit_k0")
VERL_MODES = ("verl_sync", "verl_sync_tuned", "verl_colocate_async", "verl_separate_async")
REWARD_SYSTEMS = ("conduit_k1", "verl_colocate_async")
#: the reward curves' final score: mean over this many last iterations
REWARD_TAIL = 10


def conduit_modes(systems: list[str], piece_groups: str) -> dict[str, tuple[str, list[str]]]:
    """``run_systems``' extra systems: ``conduit_k<k>`` -> trainer mode ``conduit`` with the bound
    and a group log in the run's work dir (``{work}``); ``verl_colocate_async_k<k>`` (and separate) ->
    verl's trainer under verl's own bound (``max_off_policy_threshold`` = k + 1, strategy drop)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for system in systems:
        plain, _ = split_system(system)
        k = bound(system)
        if (m := VERL_K.match(plain)) and k is not None:
            out[plain] = (
                m.group(1).removeprefix("verl_"),
                [
                    f"trainer.v1.sampler.max_off_policy_threshold={k + 1}",
                    "trainer.v1.sampler.max_off_policy_strategy=drop",
                ],
            )
        if CONDUIT_K.match(plain) and k is not None:
            out[plain] = (
                "conduit",
                [
                    f"+trainer.v1.conduit.max_staleness={k}",
                    "+trainer.v1.conduit.group_log={work}/groups.jsonl",
                    f"+trainer.v1.conduit.piece_groups={piece_groups}",
                ],
            )
    return out


def reward_runs(
    root: Path,
    args: argparse.Namespace,
    plan: dict[str, Any],
    errors: dict[str, str],
    saved: Callable[[dict[str, Any]], object] = lambda _: None,
) -> dict[str, Any]:
    """``--reward-steps``: ``conduit_k1`` and ``verl_colocate_async``, one run each per seed (per seed
    in ``round_order``: verl's first), through ``run_systems`` (warm-up iteration dropped as everywhere):
    mean score per iteration, each system's final score (mean of the last ``REWARD_TAIL`` iterations)
    per seed, and whether k = 1's mean final score lies within verl's seed-to-seed spread (min..max
    over its seeds). ``saved`` gets the summary so far after every run (``--reward-only`` writes it)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    final: dict[str, dict[str, float]] = {s: {} for s in REWARD_SYSTEMS}
    out: dict[str, Any] = {
        "lr": args.reward_lr,
        "seeds": args.seeds,
        "iterations": args.reward_steps,
        "final_over_last": REWARD_TAIL,
        "final_score": final,
        "verl_colocate_async_spread": None,
        "k1_within_spread": None,
        "curves": curves,
    }
    for seed in range(args.seed, args.seed + args.seeds):
        a = argparse.Namespace(**{**vars(args), "seed": seed})
        mine = {**plan, "rounds": 1, "steps": args.reward_steps - 1, "label": f"reward_s{seed}_"}
        mine["harness"] = [*plan["harness"], "--lr", str(args.reward_lr)]
        for system in round_order(list(REWARD_SYSTEMS), 0):
            rows = run_systems(root, a, [system], mine, {"errors": errors})
            pts = [(r["iteration"], float(r["score"])) for r in rows if r["score"] is not None]
            if pts:
                curves[f"{system} seed {seed}"] = pts
                final[system][str(seed)] = round(statistics.fmean(v for _, v in pts[-REWARD_TAIL:]), 4)
            spread = list(final["verl_colocate_async"].values())
            k1 = list(final["conduit_k1"].values())
            out["verl_colocate_async_spread"] = [min(spread), max(spread)] if spread else None
            out["k1_within_spread"] = (
                min(spread) <= statistics.fmean(k1) <= max(spread) if len(spread) >= 2 and k1 else None
            )
            saved(out)
    return out


def plot(summary: list[dict[str, Any]], png: Path, title: str) -> None:
    """Per system: median wall and exposed time (bars), and the measured staleness (median, max)."""
    plt = script.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    names = [s["system"] for s in summary]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [s["wall_s"] or 0 for s in summary], 0.4, label="wall")
    ax.bar([x + 0.2 for x in xs], [s["exposed_s"] or 0 for s in summary], 0.4, label="exposed")
    ax.set_xticks(list(xs), names, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("seconds per iteration (median)")
    ax.legend(fontsize=8)
    nan = float("nan")
    for key, marker in (("staleness_median", "o"), ("staleness_max", "x")):
        ys = [nan if s[key] is None else s[key] for s in summary]
        bx.scatter(xs, ys, label=key.removeprefix("staleness_"), marker=marker)
    bx.set_xticks(list(xs), names, rotation=25, ha="right", fontsize=7)
    bx.set_ylabel("lag, versions (trained - generated)")
    bx.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    script.save_figure(fig, png)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = script.parser(__doc__, quick="4 measured iterations, 1 round, 4 systems (about 10 min paced)")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma list (default {','.join(SYSTEMS)}); conduit_k<k> for any k; a suffix "
        f"{TQ_SUFFIX}conduit / {TQ_SUFFIX}simple sets the TransferQueue backend",
    )
    p.add_argument(
        "--steps", type=int, default=None, help="measured iterations per run (default 14, quick 4)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds of the headline pair ({HEADLINE}; on vLLM {headline_pair('vllm')}) (default 3, "
        "quick 1); the other systems run in round 0",
    )
    p.add_argument(
        "--poll",
        type=float,
        default=0.02,
        help="replay-buffer poll period (s) of every verl trainer but verl_sync (verl as shipped: 2 s)",
    )
    p.add_argument(
        "--rollout",
        choices=("paced", "vllm"),
        default="paced",
        help="paced: real tokens released at a modelled inference server's times (a model of separate "
        "rollout hardware); vllm: verl's vLLM rollout on vLLM's CPU build, its own core (--core-split)",
    )
    add_run_flags(p, timeout=900, paced="paced: ")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--response-length", type=int, default=256, help="max response tokens")
    p.add_argument("--pace-median", type=int, default=64, help="paced: median response tokens")
    p.add_argument("--core-split", default="0:1", help="vllm: VLLM_CORES:TRAINER_CORES")
    p.add_argument(
        "--piece-groups", default="auto", help="conduit_k*: prompt groups per ingestion piece (int or auto)"
    )
    p.add_argument(
        "--reward-steps",
        type=int,
        default=0,
        help="also reward curves: conduit_k1 and verl_colocate_async, this many iterations per seed (0: off)",
    )
    p.add_argument("--seeds", type=int, default=3, help="--reward-steps: seeds seed..seed+N-1")
    p.add_argument("--reward-lr", type=float, default=3e-3, help="learning rate of the reward-curve runs")
    p.add_argument(
        "--reward-only",
        action="store_true",
        help="only the reward-curve runs (default out: verl_staleness_reward[_vllm]_<algo>.json)",
    )
    args = p.parse_args(argv)
    args.systems = args.systems or ",".join(QUICK_SYSTEMS if args.quick else SYSTEMS)
    for system in args.systems.split(","):
        try:
            plain, _ = split_system(system)
        except SystemExit as e:
            p.error(str(e))
        if plain not in VERL_MODES and not CONDUIT_K.match(plain) and not VERL_K.match(plain):
            p.error(
                f"system {system!r}: use one of {', '.join(VERL_MODES)}, conduit_k<k> (k >= 0) or "
                "verl_colocate_async_k<k> / verl_separate_async_k<k> (k >= 1: verl's own bound)"
            )
        if (m := VERL_K.match(plain)) and int(m.group(2)) < 1:
            p.error(f"system {system!r}: verl's bound needs k >= 1 (k = 0 is verl_sync)")
    if args.reward_only and not args.reward_steps:
        p.error("--reward-only needs --reward-steps N")
    if args.reward_steps and (args.reward_steps < 2 or args.seeds < 1):
        p.error("--reward-steps needs at least 2 iterations (the first is warm-up) and --seeds >= 1")
    return args


def prepare(args: argparse.Namespace, prefix: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """What every run of this invocation shares: the scratch dir (``--work``, else a new one named
    ``prefix``...), the result's first fields (the paced rollout's calibration, run here) and the plan
    ``run_systems`` takes."""
    paced = args.rollout == "paced"
    steps, rounds = plan_size(args)
    root = Path(args.work or tempfile.mkdtemp(prefix=prefix)).resolve()
    systems = args.systems.split(",")
    result: dict[str, Any] = {"algo": args.algo, "rollout": args.rollout, "machine": machine(), "errors": {}}
    if paced:
        cal = calibration(calibrate(root, args, args.tail))
        result["calibration"] = {f"tail={args.tail:g}": cal}
        harness = harness_args(args, args.tail, args.R * cal["time_scale_per_R"])
    else:
        harness = harness_args(args)
    plan = {
        "poll": args.poll,
        "pair": headline_pair(args.rollout),
        "rounds": rounds,
        "steps": steps,
        "label": "",
        "harness": harness,
        "info": {
            "rollout": args.rollout,
            "tail": args.tail if paced else None,
            "R": args.R if paced else None,
        },
        "modes": conduit_modes([*systems, *REWARD_SYSTEMS], str(args.piece_groups)),
    }
    return root, result, plan


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """Calibrate (paced), run every system in its rounds, analyse; write the JSON and PNGs."""
    if args.reward_only:
        return reward_only(args)
    prov = provenance.start()
    paced = args.rollout == "paced"
    name = "verl_staleness" + "_vllm" * (not paced) + f"_{args.algo}"
    args.out = args.out or script.RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    root, result, plan = prepare(args, "verl_staleness_")
    systems = args.systems.split(",")
    rows = run_systems(root, args, systems, plan, result)
    annotate(rows, result.get("work_dirs", {}), plan["label"], args.batch_size)
    summary = summarize(rows, systems)
    result.update(rows=rows, summary=summary)
    result["ratios"] = all_ratios(rows, summary)
    result["targets"] = targets(result["ratios"], summary)
    result["poll_check"] = poll_findings(rows)
    result["headlines"] = headlines(rows, result["ratios"], result["poll_check"])
    if args.reward_steps:
        result["reward_curve"] = reward_runs(root, args, plan, result["errors"])
        reward_plot(result["reward_curve"], args.out.with_name(f"{args.out.stem}_reward.png"), args)
    result["method"] = method(args, plan["rounds"], plan["steps"])
    result["machine"].update(provenance.finish(prov))
    label = f"PACED rollout (modelled), tail {args.tail:g}, R {args.R:g}" if paced else "vLLM (CPU) rollout"
    title = f"verl 0.9.1 CPU {args.algo}, {label}: bounded staleness"
    out = script.write_result(name, args, result, lambda png: plot(summary, png, title) if summary else None)
    return result, out


def reward_only(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """``--reward-only``: ``reward_runs`` alone on this invocation's rollout and shape (the paced one
    calibrated first); the JSON and its PNG are rewritten after every run."""
    prov = provenance.start()
    name = "verl_staleness_reward" + "_vllm" * (args.rollout == "vllm") + f"_{args.algo}"
    root, result, plan = prepare(args, "verl_staleness_reward_")
    run = run_method(1, args.reward_steps - 1)
    how = {"command": run["command"], "machine_load": run["machine_load"], **setting(args)}
    how["reward"] += (
        "; the file is rewritten after every run, so a series cut short keeps what ran (seeds counts the "
        "seeds asked for; final_score lists those that ran). Not timed: timing comes from the full run"
    )

    def save(curve: dict[str, Any]) -> Path:
        result.update(reward_curve=curve, method=how)
        result["machine"].update(provenance.finish(prov))
        return script.write_result(name, args, result, lambda png: reward_plot(curve, png, args))

    return result, save(reward_runs(root, args, plan, result["errors"], save))


def reward_plot(curve: dict[str, Any], png: Path, args: argparse.Namespace) -> None:
    """``reward_runs``' curves, mean score per iteration per system and seed (no PNG where none ran)."""
    if curve["curves"]:
        title = f"verl 0.9.1 CPU {args.algo}, {args.rollout} rollout, lr {args.reward_lr}: mean score"
        reward_curve(curve["curves"], png, title)


def method(args: argparse.Namespace, rounds: int, steps: int) -> dict[str, Any]:
    """How the rows were made (goes into the JSON)."""
    return {
        **run_method(rounds, steps),
        "description": __doc__,  # the systems, the staleness measured, the equal-staleness rule, the work
        "conduit": f"piece_groups={args.piece_groups}; verl_sync_tuned's poll period {args.poll} s (no sweep here)",
        "exposed": (sys.modules["verl_analysis"].__doc__ or "").strip(),
        "targets": f"k1 over verl_colocate_async: wall <= {TARGET_WALL}x, exposed <= {TARGET_EXPOSED}x (None "
        "where refused), and the same over verl_colocate_async_k1 (k1_equal_bound_*, verl under its own bound "
        f"of 1) where it ran; backend: <base>+tq_conduit / <base> wall <= 1/{TARGET_BACKEND_SPEEDUP}, else "
        "backend_<base>_storage_share = SimpleStorage's TQ put+get seconds per iteration (summed over "
        "processes) / its median wall: what any backend could save at most",
        **setting(args),
    }


def setting(args: argparse.Namespace) -> dict[str, Any]:
    """The shape, the rollout and the reward runs (``method``'s and ``--reward-only``'s JSON)."""
    out = {"shape": f"{args.batch_size} prompts x n={args.n}, responses up to {args.response_length} tokens"}
    if args.rollout == "paced":
        out["paced"] = (
            "PACED: real tokens released at a modelled inference server's times, time-scaled so a step's "
            f"modelled generation is R={args.R:g} x the ingestion time of a calibration run (tail "
            f"{args.tail:g}, median {args.pace_median} tokens); a model of separate rollout hardware, not "
            "a GPU measurement"
        )
    else:
        out["vllm"] = f"verl's vLLM rollout on vLLM's CPU build, cores {args.core_split}"
    if args.reward_steps:
        out["reward"] = (
            f"conduit_k1 and verl_colocate_async, {args.reward_steps} iterations, seeds {args.seed}.."
            f"{args.seed + args.seeds - 1}, lr {args.reward_lr}, same rollout and shape; final score = "
            f"mean critic/score/mean of the last {REWARD_TAIL} iterations; k1_within_spread: k1's mean "
            "final score within [min, max] of verl_colocate_async's seeds; per seed verl_colocate_async "
            "runs first, then conduit_k1"
        )
    return out


def main() -> int:
    args = parse()
    result, out = bench(args)
    if args.reward_only:
        script.show(report_staleness.reward(result))
        return 0
    print(table(result["rows"], args.systems.split(",")))
    script.show(report_staleness.staleness({out.name: result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
