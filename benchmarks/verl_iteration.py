"""verl 0.9.1 on CPU: one iteration of GRPO/PPO, verl's trainers vs Conduit's ``conduit`` mode.

    python benchmarks/verl_iteration.py [--quick] [--algo grpo|ppo] [--systems a,b,...] [--out FILE]
    python benchmarks/verl_iteration.py --rollout paced [--tail 4] [--R 4] [--sweep] [--quick] ...

Systems, same seed and data, run one after another in this invocation (each start costs ~75 s
of Ray/verl start-up, so iterations cannot alternate between systems; runs do): ``verl_sync`` (as
shipped, 2 s replay-buffer poll), ``verl_sync_tuned`` (the poll period that measured fastest in a
sweep: one run with a per-step period schedule, recorded with whether the sweep could order the
periods, ``verl_analysis.choose_poll``), ``verl_colocate_async``, ``verl_separate_async`` (verl's
trainer with the rollout on resources of its own, weights synced every step), ``conduit``. In each
round verl's systems and Conduit's alternate, and every other round runs in the reverse order
(``round_order``), so drift in the machine's load hits both sides alike. The first iteration of each
run is warm-up; every system's medians are over the same iterations (``verl_analysis.measured``).
Exposed time: see ``verl_analysis.py``.

``--rollout paced`` (16 prompts x n=8, responses up to 256 tokens, lognormal lengths with median
64 and p99/median ``--tail``): the tiny model generates every token, but each response is released
when a modelled inference server on separate hardware would finish it (``conduit_verl_cpu/pace.py``).
A calibration run (paced sync, nothing waits) measures the ingestion time; the time scale then makes
a step's modelled generation ``--R`` times it. ``--sweep`` adds tails 1-8 x R 1-8 for
``verl_sync_tuned`` and ``conduit`` and plots the speed-up against the tail, one line per R. Every
row carries ``rollout``, ``tail`` and ``R``: a paced row is a model of separate hardware, not a GPU
measurement. The tuned poll period: each period repeated, in random order; the one with the lowest
median wall (``sweep``).

TransferQueue's storage backend is a second dimension. A system runs on its mode's default: verl's
SimpleStorage for verl's modes, Conduit's backend for ``conduit``; the suffix ``+tq_conduit`` or
``+tq_simple`` picks the other one (``verl_sync_tuned+tq_conduit``: verl's tuned sync trainer with
its experience in Conduit's storage; ``conduit+tq_simple``: Conduit's mode on verl's storage). Every
row records the backend the run reported (``tq_backend``, from its ``summary.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from poll_check import poll_findings  # noqa: E402
from verl_analysis import STEADY_FROM, calibration, exposed_profile, ratios, sweep_table, targets  # noqa: E402
from verl_headlines import PAIR, iteration_headlines  # noqa: E402
from verl_plots import paced_sweep, rollout_title, stage_bars  # noqa: E402
from verl_runs import (  # noqa: E402
    TQ_SUFFIX,
    add_run_flags,
    calibrate,
    harness_args,
    machine,
    plan_size,
    reward_runs,
    run_method,
    run_systems,
    split_system,
    sweep,
    table,
)
from verl_vllm_analysis import generation_cost, ingestion_floor, response_identity  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
#: the paced rollout's sweep: response-length tail (p99 / median) and R (generation / ingestion)
SWEEP_TAILS, SWEEP_RS = (1.0, 2.0, 4.0, 8.0), (1.0, 2.0, 4.0, 8.0)
QUICK_TAILS, QUICK_RS = (1.0, 8.0), (1.0, 4.0)
#: systems of the paced defaults, and of every other point of the paced sweep
#: (``round_order`` pairs verl's systems with Conduit's in this order: the headline pair first)
PACED_SYSTEMS = (
    "verl_sync_tuned,verl_sync_tuned+tq_conduit,verl_sync,verl_colocate_async,verl_separate_async,"
    "conduit,conduit_stream"
)
#: the headline pair and the control that separates the trainer mode from the storage backend
QUICK_PACED_SYSTEMS = "verl_sync_tuned,verl_sync_tuned+tq_conduit,conduit"
SWEEP_SYSTEMS = ("verl_sync_tuned", "conduit")
#: ``--rollout vllm``: every trainer mode, verl's async ones on both storage backends
VLLM_SYSTEMS = (
    "verl_sync_tuned,verl_sync_tuned+tq_conduit,verl_sync,verl_colocate_async,"
    "verl_colocate_async+tq_conduit,verl_separate_async,verl_separate_async+tq_conduit,conduit"
)
#: verl's trainers that train on responses one weight version old: their rows are reported, and a
#: conduit / baseline ratio against them is refused (``verl_analysis.ratios``)
OFF_POLICY = ("verl_colocate_async", "verl_separate_async")
DEFAULT_SYSTEMS = (
    "verl_sync,verl_sync_tuned,verl_sync_tuned+tq_conduit,verl_colocate_async,"
    "conduit,conduit+tq_simple,conduit_stream"
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations and a shorter sweep")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument(
        "--out",
        default=None,
        help="JSON path (default benchmarks/results/verl_iteration[_quick][_paced][_sweep]_<algo>.json)",
    )
    p.add_argument("--steps", type=int, default=None, help="measured iterations per system")
    p.add_argument(
        "--reward-steps", type=int, default=0, help="also longer sync and conduit runs for a reward curve"
    )
    p.add_argument("--reward-lr", type=float, default=3e-3, help="learning rate of the reward-curve runs")
    p.add_argument("--seeds", type=int, default=1, help="--reward-steps: seeds seed..seed+N-1 per system")
    p.add_argument(
        "--reward-only",
        action="store_true",
        help="only the reward-curve runs (default out: verl_reward[_vllm]_<algo>.json)",
    )
    p.add_argument(
        "--piece-groups", default="auto", help="conduit: prompt groups per ingestion piece (int or auto)"
    )
    p.add_argument(
        "--stream-piece-groups", type=int, default=2, help="conduit_stream: fixed groups per piece"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds of the headline pair {PAIR} (default 3, quick 1); the other systems run in round 0",
    )
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma list; a suffix {TQ_SUFFIX}conduit / {TQ_SUFFIX}simple sets the TransferQueue backend",
    )
    p.add_argument("--poll", type=float, default=None, help="skip the sweep; tuned poll period (s)")
    p.add_argument(
        "--rollout",
        choices=("hf", "paced", "vllm"),
        default="hf",
        help="hf: CPU generation as fast as it goes; paced: real tokens released at a modelled "
        "inference server's times (conduit_verl_cpu/pace.py), a model of separate rollout hardware; "
        "vllm: verl's vLLM rollout on vLLM's CPU build, its own core (--core-split)",
    )
    p.add_argument(
        "--sweep", action="store_true", help=f"paced: also tails {SWEEP_TAILS} x R {SWEEP_RS} (quick: fewer)"
    )
    p.add_argument("--batch-size", type=int, default=None, help="prompts per step (paced default 16)")
    p.add_argument("--n", type=int, default=None, help="responses per prompt (paced default 8)")
    p.add_argument("--response-length", type=int, default=256, help="paced, vllm: max response tokens")
    p.add_argument(
        "--core-split", default="0:1", help="vllm: VLLM_CORES:TRAINER_CORES (the harness's --core-split)"
    )
    p.add_argument("--pace-median", type=int, default=64, help="paced: median response tokens")
    add_run_flags(p, timeout=900, paced="paced: ")
    args = p.parse_args(argv)
    paced = args.rollout == "paced"
    if args.sweep and not paced:
        p.error("--sweep needs --rollout paced")
    if args.reward_steps and paced:
        p.error("--reward-steps runs the hf or vllm rollout (the paced one needs a calibration)")
    if args.reward_only and not args.reward_steps:
        p.error("--reward-only needs --reward-steps N")
    if args.reward_steps and (args.reward_steps < 2 or args.seeds < 1):
        p.error("--reward-steps needs at least 2 iterations and --seeds >= 1")
    if not args.systems:  # a quick paced run: the headline pair only
        args.systems = (QUICK_PACED_SYSTEMS if args.quick else PACED_SYSTEMS) if paced else DEFAULT_SYSTEMS
        args.systems = VLLM_SYSTEMS if args.rollout == "vllm" else args.systems
    if paced or args.rollout == "vllm":
        args.batch_size, args.n = args.batch_size or 16, args.n or 8
    return args


def reward_only(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """``--reward-only``: the reward-curve runs alone, on this invocation's rollout and shape."""
    prov = provenance.start()
    name = "verl_reward" + "_vllm" * (args.rollout == "vllm") + f"_{args.algo}"
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(args.work or tempfile.mkdtemp(prefix="verl_reward_"))
    result: dict[str, Any] = {"rows": [], "machine": machine(), "errors": {}, "rollout": args.rollout}
    result["algo"] = args.algo

    def save(curve: dict[str, Any]) -> None:
        result["reward_curve"] = curve
        result["method"] = method_reward(args, curve)
        result["machine"].update(provenance.finish(prov))
        out.write_text(json.dumps(result, indent=1))

    save(reward_runs(root, args, out.with_suffix(".png"), result["errors"], harness_args(args), save))
    return result, out


def method_reward(args: argparse.Namespace, curve: dict[str, Any]) -> dict[str, Any]:
    """How ``--reward-only``'s runs were made (goes into the JSON)."""
    return {
        "reward": f"verl sync (poll 0.05 s) and conduit, {args.reward_steps} iterations each, seeds "
        f"{args.seed}..{args.seed + args.seeds - 1}, lr {args.reward_lr}, the same rollout and shape "
        f"({' '.join(curve['shape'])}); final score = mean critic/score/mean of the last "
        f"{curve['final_over_last']} iterations; conduit_within_spread: conduit's mean final score within "
        "[min, max] of verl sync's seeds. Runs in order: both systems at the first seed, then verl sync's "
        "other seeds, then conduit's; the file is rewritten after every run, so a series cut short keeps what "
        "ran (seeds counts the seeds asked for; final_score lists those that ran). Not timed: timing comes "
        "from verl_iteration's own runs",
    }


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """Run every point and system; write the JSON (and PNGs); return the result and its path."""
    if args.reward_only:
        return reward_only(args)
    prov = provenance.start()
    paced = args.rollout == "paced"
    steps, rounds = plan_size(args)
    name = "verl_iteration" + "_quick" * args.quick + "_paced" * paced + "_vllm" * (args.rollout == "vllm")
    name += "_sweep" * args.sweep
    name += f"_{args.algo}"
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(args.work or tempfile.mkdtemp(prefix="verl_bench_"))
    systems = args.systems.split(",")
    for system in systems:
        split_system(system)  # a bad suffix fails before any run
    result: dict[str, Any] = {"rows": [], "machine": machine(), "errors": {}, "rollout": args.rollout}
    # (tail, R) points: the defaults first; with --sweep, the rest of the grid
    points: list[tuple[float | None, float | None]] = [(args.tail, args.R) if paced else (None, None)]
    if args.sweep:
        grid = [
            (t, r)
            for t in (QUICK_TAILS if args.quick else SWEEP_TAILS)
            for r in (QUICK_RS if args.quick else SWEEP_RS)
        ]
        points += [pt for pt in grid if pt != points[0]]
    calibrated: dict[float, dict[str, float]] = {}
    harness: dict[tuple[float | None, float | None], list[str]] = {}
    for tail, r in points:
        if paced and tail is not None and r is not None:
            if tail not in calibrated:
                calibrated[tail] = calibration(calibrate(root, args, tail))
            harness[tail, r] = harness_args(args, tail, r * calibrated[tail]["time_scale_per_R"])
        else:
            harness[tail, r] = harness_args(args)
    if paced:
        result["calibration"] = {f"tail={t:g}": c for t, c in calibrated.items()}
    poll = args.poll
    if any(split_system(s)[0] == "verl_sync_tuned" for s in systems) and poll is None:
        poll, result["sweep"] = sweep(root, args, 2 if args.quick else 3, harness[points[0]])
    sweep_ratios: dict[str, dict[str, Any]] = {}
    for i, (tail, r) in enumerate(points):
        label = "" if not paced else f"paced_t{tail:g}_R{r:g}_"
        info = {"rollout": args.rollout, "tail": tail, "R": r}
        plan = {"poll": poll, "rounds": rounds if i == 0 else 1, "steps": steps, "label": label, "pair": PAIR}
        plan.update(harness=harness[tail, r], info=info)
        mine = systems if i == 0 else [s for s in SWEEP_SYSTEMS if s in systems]
        rows = run_systems(root, args, mine, plan, result)
        result["rows"] += rows
        base = [s for s in mine if not s.startswith("conduit")]
        off_policy = [s for s in base if split_system(s)[0] in OFF_POLICY]
        # piece_groups=auto measures 3 iterations with and 3 without streaming after the warm-up one
        found = ratios(
            rows, base, steady_from=STEADY_FROM if steps + 1 > STEADY_FROM else 0, off_policy=off_policy
        )
        if i == 0:
            result["ratios"] = found
            result["poll_check"] = poll_findings(rows)
            result["headlines"] = iteration_headlines(rows, found, result["poll_check"], args.rollout)
            result["profile"] = {s: exposed_profile(rows, s) for s in mine if s.startswith("conduit")}
        if args.sweep:
            sweep_ratios[f"tail={tail:g},R={r:g}"] = found
    if args.sweep:
        result["sweep_ratios"] = sweep_ratios
    if args.rollout == "vllm":
        vllm_figures(result, systems)
    if paced or args.rollout == "vllm":
        result["targets"] = targets(result["ratios"], sweep_ratios)
    if args.rollout == "vllm":
        same = result["equivalence"]["conduit_vs_verl_sync_tuned"]
        result["targets"]["identical>=95%"] = same["target>=0.95"]
        # vLLM batches the requests in flight: the pair's rule is the share of identical responses
        result["headlines"] = iteration_headlines(
            [r for r in result["rows"] if r.get("tail") is None],
            result["ratios"],
            result["poll_check"],
            args.rollout,
            identical=same["share_identical"],
        )
    result["method"] = method(args, rounds, steps)
    label = ("\n" if paced else "") + rollout_title(args.rollout, *((args.tail, args.R) if paced else ()))
    first = [
        row for row in result["rows"] if row.get("tail") == points[0][0] and row.get("R") == points[0][1]
    ]
    if first:
        title = f"verl 0.9.1 CPU {args.algo}, {label}: stages per iteration"
        stage_bars(first, out.with_suffix(".png"), title)
    if args.sweep and sweep_ratios:
        paced_sweep(sweep_ratios, out.with_name(f"{out.stem}_speedup.png"), args.algo)
    if args.reward_steps:
        result["reward_curve"] = reward_runs(
            root, args, out.with_name(f"{out.stem}_reward.png"), result["errors"], harness[points[0]]
        )
    result["machine"].update(provenance.finish(prov))  # after the reward runs: the run's real end
    out.write_text(json.dumps(result, indent=1))
    return result, out


def vllm_figures(result: dict[str, Any], systems: list[str]) -> None:
    """``--rollout vllm``: equivalence (share of identical responses, iteration by iteration, in the
    first round: ``conduit`` and ``verl_sync`` against ``verl_sync_tuned``, the latter the baseline's
    own repeat with another poll period) and what generation costs per system (R included)."""
    dirs = {name.removesuffix("_r0"): Path(d) for name, d in result.get("work_dirs", {}).items()}
    base = dirs.get("verl_sync_tuned")
    result["equivalence"] = {
        f"{other}_vs_verl_sync_tuned": response_identity(dirs[other], base)
        if base is not None and other in dirs
        else {"share_identical": None, "target>=0.95": False, "missing": True}
        for other in ("conduit", "verl_sync")
    }
    result["generation"] = {s: generation_cost(result["rows"], s) for s in systems}
    if "conduit" in dirs:
        result["ingestion_floor"] = ingestion_floor(result["rows"], dirs["conduit"], "conduit")


def main() -> int:
    args = parse()
    result, out = bench(args)
    if args.reward_only:
        rc = result["reward_curve"]
        print(
            "reward:",
            json.dumps({k: rc[k] for k in ("final_score", "verl_sync_spread", "conduit_within_spread")}),
        )
        print(f"[bench] wrote {out}")
        return 0
    paced = args.rollout == "paced"
    note = " (paced: modelled separate rollout hardware, not a GPU measurement)" if paced else ""
    print(f"rollout={args.rollout}{note}")
    first = [
        r
        for r in result["rows"]
        if (r.get("tail"), r.get("R")) == ((args.tail, args.R) if paced else (None, None))
    ]
    print(table(first, args.systems.split(",")))
    print(json.dumps(result["ratios"], indent=1))
    print("where conduit's exposed time went (medians):", json.dumps(result.get("profile", {}), indent=1))
    if args.sweep:
        print(sweep_table(result["sweep_ratios"]))
    if args.rollout == "vllm":
        print("equivalence:", json.dumps(result["equivalence"]))
        print("generation per system:", json.dumps(result["generation"], indent=1))
    if "targets" in result:
        print("targets vs verl_sync_tuned:", json.dumps(result["targets"]))
    print(f"[bench] wrote {out}")
    return 0


def method(args: argparse.Namespace, rounds: int, steps: int) -> dict[str, Any]:
    """How the rows were made (goes into the JSON)."""
    out = {
        **run_method(rounds, steps),
        "iterations": "every system's medians and ratios over all its measured iterations (the same "
        "rule for every system); targets use these",
        "conduit_stream": f"conduit with piece_groups={args.stream_piece_groups} fixed (always streams)",
        "tq_backend": "TransferQueue storage per system: verl's modes on SimpleStorage, conduit on "
        f"Conduit's backend, unless the system name ends in {TQ_SUFFIX}simple / {TQ_SUFFIX}conduit; "
        "each row's tq_backend is what the run reported",
        "conduit_steady": f"conduit_steady_over_*: both systems' iterations {STEADY_FROM} and later "
        "(after piece_groups=auto's measurement phase), the same window for both; reported, not used by targets",
        "poll": "every verl trainer but verl_sync (verl as shipped, 2 s) runs at one replay-buffer poll "
        "period: --poll, else the one with the lowest median wall in the sweep (sweep.chosen; sweep.resolved "
        "says whether the sweep ordered the periods); poll_check lists any baseline whose waits still sit on "
        "a >= 1 s poll",
        "exposed": (sys.modules["verl_analysis"].__doc__ or "").strip(),
        "work": "each row's work counters (responses, response tokens of its iteration); a ratio is "
        "refused (refused/...) when two systems did different work",
        "steps_per_system_per_round": steps,
    }
    if args.rollout == "paced":
        out["paced"] = (
            "PACED: the tiny model generates every token, but each response is released at the time a "
            "modelled continuous-batching inference server on separate hardware would finish it "
            "(tools/verl_cpu/conduit_verl_cpu/pace.py); the rollout sleeps meanwhile. Time-scaled so "
            "that a step's modelled generation is R x the ingestion time measured in a calibration run "
            "(paced sync, scale 0). A model of separate rollout hardware, not a GPU measurement."
        )
        out["shape"] = (
            f"{args.batch_size} prompts x n={args.n}, responses up to {args.response_length} tokens, "
            f"median {args.pace_median}; lognormal lengths with p99/median = tail"
        )
    if args.rollout == "vllm":
        out["vllm"] = (
            "VLLM: verl's own vLLM rollout (vLLMHttpServer, agent loop, weight sync after every update) on "
            f"vLLM's CPU build; cores split {args.core_split} (vLLM's server, EngineCore and Worker : the "
            "trainer, FSDP workers and Conduit), each row's cores from the run's summary.json. Per-request "
            "seeds (seam S4). Rows' vllm: vLLM's own /metrics counters per iteration (engine steps, tokens, "
            "TTFT, inter-token latency); generation: gen_busy, tokens/s and R = gen_busy / ingest_s per "
            "system. Every run dumps its samples (--dump-samples, after the step's timer) for equivalence: "
            "the share of conduit's responses that verl_sync_tuned also produced, iteration by iteration; "
            "verl_sync vs verl_sync_tuned is the baseline's own repeat. verl's async trainers are off-policy "
            "(one version stale): their rows are reported, ratios of conduit to them refused."
        )
        out["shape"] = (
            f"{args.batch_size} prompts x n={args.n}, responses up to {args.response_length} tokens, "
            "temperature 1"
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
