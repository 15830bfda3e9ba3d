"""The runs behind ``verl_iteration.py`` (and ``autotune_verl.py``, ``tuning_cost_verl.py``): one CPU-mode
training run of the harness, the systems in their rounds, the baseline's poll sweep, the paced rollout's
calibration, the reward-curve runs, and the per-system table."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import script  # noqa: E402
from intervals import MIN_ROUNDS, check_abba, round_plan  # noqa: E402
from verl_analysis import choose_poll, rows_for_run  # noqa: E402
from verl_plots import reward_curve  # noqa: E402
from verl_vllm_analysis import engine_steps, run_info  # noqa: E402

SWEEP = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005)
QUICK_SWEEP = (0.5, 0.1, 0.02, 0.005)
#: the harness's ``--tq-backend`` choices -> TransferQueue's backend names
TQ_BACKENDS = {"conduit": "Conduit", "simple": "SimpleStorage"}
TQ_SUFFIX = "+tq_"


def split_system(system: str) -> tuple[str, str]:
    """``"verl_sync_tuned+tq_conduit"`` -> ``("verl_sync_tuned", "conduit")``; without a suffix the
    mode's default backend (``conduit`` for Conduit's mode, ``simple`` for verl's)."""
    base, _, backend = system.partition(TQ_SUFFIX)
    if backend and backend not in TQ_BACKENDS:
        raise SystemExit(
            f"system {system!r}: unknown backend suffix; use {TQ_SUFFIX}conduit or {TQ_SUFFIX}simple"
        )
    return base, backend or ("conduit" if base.startswith("conduit") else "simple")


def backend_ran(work: Path, backend: str) -> str:
    """The TransferQueue backend the run reported (``summary.json``; older runs: the one asked for)."""
    path = work / "summary.json"
    ran = json.loads(path.read_text()).get("tq_backend_ran") if path.exists() else None
    return ran or TQ_BACKENDS[backend]


def run(work: Path, mode: str, steps: int, args: argparse.Namespace, extra: list[str]) -> tuple[int, str]:
    """One CPU-mode training run; returns (exit code, log tail). ``--reuse``: a finished run (its
    summary.json written) is read, a run cut short is run again."""
    if args.reuse and (work / "summary.json").exists():  # written last: a killed run has none
        print(f"[bench] reusing {work}", flush=True)
        return 0, ""
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--trainer-mode", mode, "--steps", str(steps)]
    cmd += ["--seed", str(args.seed), "--algo", args.algo, "--work-dir", str(work), *extra]
    print(f"[bench] {' '.join(cmd[2:])}", flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except (
        subprocess.TimeoutExpired
    ) as e:  # a run over --timeout is an error row, not the end of the benchmark
        out = "".join(
            x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr)
        )
        print(f"[bench]   timed out after {args.timeout}s", flush=True)
        return 124, f"timed out after {args.timeout} s (--timeout)\n{out[-3000:]}"
    print(f"[bench]   rc={proc.returncode} in {time.monotonic() - t0:.0f}s", flush=True)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def sweep(
    root: Path, args: argparse.Namespace, reps: int, harness: list[str]
) -> tuple[float, dict[str, Any]]:
    """The tuned baseline's poll period: one sync run whose period changes every step. Each period
    runs ``reps`` times, every repetition in a new random order (seeded), so drift in the machine's
    load does not favour one period; the period with the lowest median wall wins (``choose_poll``:
    the most favourable poll for verl, recorded with whether the sweep resolved the order)."""
    periods = QUICK_SWEEP if args.quick else SWEEP
    rng = random.Random(args.seed)
    order = [p for _ in range(reps) for p in rng.sample(periods, len(periods))]
    schedule = [2.0, *order]
    extra = ["--poll-interval", ",".join(map(str, schedule)), *harness]
    rc, tail = run(root / "sweep", "sync", len(schedule), args, extra)
    if rc:
        return 0.05, {"error": tail}
    rows = rows_for_run(root / "sweep", args.algo, "verl_sync", 1, {})
    by = {p: [r["wall_s"] for r in rows if schedule[r["iteration"] - 1] == p] for p in periods}
    chosen, info = choose_poll(by)
    return chosen, {
        "order": order,
        "repetitions": reps,
        "wall_s_by_poll_s": {str(p): v for p, v in by.items()},
        **info,
    }


#: a run's final score: the mean of its last iterations' mean scores
REWARD_TAIL = 10


#: the reward runs' systems: (name, trainer mode, flags)
REWARD_SYSTEMS = (("verl_sync", "sync", ["--poll-interval", "0.05"]), ("conduit", "conduit", []))


def reward_order(first: int, seeds: int) -> list[tuple[str, int]]:
    """(system, seed) in run order: both systems at the first seed, then verl sync's other seeds (its
    spread), then conduit's, so a run cut short still holds a comparison and the baseline's spread."""
    names = [name for name, _, _ in REWARD_SYSTEMS]
    later = range(first + 1, first + seeds)
    return [(n, first) for n in names] + [(n, s) for n in names for s in later]


def reward_runs(
    root: Path,
    args: argparse.Namespace,
    png: Path,
    errors: dict[str, str],
    harness: list[str],
    saved: Callable[[dict[str, Any]], None] = lambda _: None,
) -> dict[str, Any]:
    """verl sync and conduit, ``--reward-steps`` iterations each for every seed of ``--seeds`` (seed ..
    seed + seeds - 1), on this invocation's rollout and shape (``harness``), in ``reward_order``: mean
    score per step, each run's final score, and whether conduit's mean final score lies within verl
    sync's seed-to-seed spread (min..max over its seeds; needs 2 seeds or more). ``saved`` gets the
    summary so far after every run (the caller writes it: a long series cut short keeps what ran)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    final: dict[str, dict[str, float]] = {name: {} for name, _, _ in REWARD_SYSTEMS}
    flags = {name: (mode, extra) for name, mode, extra in REWARD_SYSTEMS}
    lr = ["--lr", str(args.reward_lr)]
    out: dict[str, Any] = {
        "lr": args.reward_lr,
        "seeds": args.seeds,
        "iterations": args.reward_steps,
        "shape": harness,
        "final_over_last": REWARD_TAIL,
        "final_score": final,
        "verl_sync_spread": None,
        "conduit_within_spread": None,
        "curves": curves,
    }
    for system, seed in reward_order(args.seed, args.seeds):
        a = argparse.Namespace(**{**vars(args), "seed": seed})
        mode, extra = flags[system]
        work = root / (f"reward_{system}" + (f"_s{seed}" if args.seeds > 1 else ""))
        rc, tail = run(work, mode, args.reward_steps, a, lr + harness + extra + conduit_knobs(args, system))
        if rc:
            errors[f"reward_{system}_s{seed}"] = tail
            continue
        recs = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
        pts = [(int(r["step"]), float(r["data"]["critic/score/mean"])) for r in recs]
        curves[system if args.seeds == 1 else f"{system} seed {seed}"] = pts
        final[system][str(seed)] = round(statistics.fmean(v for _, v in pts[-REWARD_TAIL:]), 4)
        title = f"verl 0.9.1 CPU {args.algo} ({args.rollout}), lr {args.reward_lr}: mean score per iteration"
        reward_curve(curves, png, title)
        spread, mine = list(final["verl_sync"].values()), list(final["conduit"].values())
        out["verl_sync_spread"] = [min(spread), max(spread)] if spread else None
        out["conduit_within_spread"] = (
            min(spread) <= statistics.fmean(mine) <= max(spread) if len(spread) >= 2 and mine else None
        )
        saved(out)
    return out


def conduit_knobs(args: argparse.Namespace, system: str) -> list[str]:
    """The conduit mode's knobs for this benchmark (none for verl's own modes)."""
    base, _ = split_system(system)
    if base == "conduit_stream":  # always stream, in pieces of a fixed size
        return [f"+trainer.v1.conduit.piece_groups={args.stream_piece_groups}"]
    return [f"+trainer.v1.conduit.piece_groups={args.piece_groups}"] if base == "conduit" else []


def tq_seconds_per_iteration(work: Path) -> dict[str, float]:
    """Mean seconds per iteration inside TQ storage put/get calls, summed over every process of the run
    (the harness times each storage manager's ``put_data`` / ``get_data``; ``summary.json``), over the
    iterations after the warm-up one where the run recorded them (as wall and exposed time are)."""
    path = work / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    if summary.get("tq_calls_after_warmup") is not None and summary.get("iterations_after_warmup"):
        calls, n = summary["tq_calls_after_warmup"], max(1, int(summary["iterations_after_warmup"]))
    else:
        calls, n = summary.get("tq_calls") or {}, max(1, int(summary.get("iterations") or 1))
    return {f"tq_{op}_s_per_iter": round(calls.get(f"tq_{op}_s", 0.0) / n, 4) for op in ("put", "get")}


def round_order(systems: list[str], k: int) -> list[str]:
    """The order of round ``k``: verl's systems and Conduit's alternate (the first of each side
    first), and odd rounds run the reverse, so over two rounds every system's mean position is the
    same and drift in the machine's load hits both sides alike."""
    verl = [s for s in systems if not s.startswith("conduit")]
    mine = [s for s in systems if s.startswith("conduit")]
    order = [s for pair in zip(verl, mine, strict=False) for s in pair]
    n = min(len(verl), len(mine))
    order += verl[n:] + mine[n:]
    return order if k % 2 == 0 else order[::-1]


def table(rows: list[dict[str, Any]], systems: list[str]) -> str:
    """Per system: its backend, measured iterations, median wall and exposed time, TQ calls,
    verl's ``update_actor`` (the same work in every system) and wall ÷ the two-resource bound
    (``verl_analysis.two_resource_bound``; nan where no row has one)."""
    head = (
        f"{'system':<28} {'tq_backend':<14} {'n':>3} {'wall_s':>8} {'exposed_s':>9} {'tq_put_s':>9} "
        f"{'tq_get_s':>9} {'upd_actor':>9} {'wall/bound':>10}"
    )
    lines = [head]
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        if not mine:
            lines.append(f"{system:<28} {'-':<14} {0:>3} {'failed':>8}")
            continue
        wall = statistics.median(r["wall_s"] for r in mine)
        exposed = statistics.median(r["exposed_s"] for r in mine)
        backend = ",".join(sorted({r["tq_backend"] for r in mine}))
        tq = [
            statistics.median(r.get(f"tq_{op}_s_per_iter", float("nan")) for r in mine)
            for op in ("put", "get")
        ]
        actor = statistics.median(r["stages"].get("update_actor", float("nan")) for r in mine)
        over = [r["wall_over_bound"] for r in mine if r.get("wall_over_bound") is not None]
        bound = statistics.median(over) if over else float("nan")
        lines.append(
            f"{system:<28} {backend:<14} {len(mine):>3} {wall:>8.3f} {exposed:>9.3f} {tq[0]:>9.3f} "
            f"{tq[1]:>9.3f} {actor:>9.3f} {bound:>10.2f}"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """The machine and torch's and verl's versions (``provenance.finish`` is added when the run ends)."""
    import torch  # noqa: F401  (script.facts records the versions of what the run imported)

    return script.facts(verl=script.version("verl"))


def plan_size(args: argparse.Namespace) -> tuple[int, int]:
    """Measured iterations per run and rounds: ``--steps`` / ``--rounds``, or the defaults every verl
    benchmark shares (14 and ``intervals.MIN_ROUNDS``; ``--quick`` 4 and 1)."""
    return args.steps or (4 if args.quick else 14), args.rounds or (1 if args.quick else MIN_ROUNDS)


def run_method(rounds: int, steps: int) -> dict[str, Any]:
    """What every benchmark built on ``run_systems`` says of how its rows were made (its result's
    ``method``): the order of the runs, the command line and the machine's load."""
    return {
        "order": f"{rounds} round(s) of {steps} measured iterations per run (+1 warm-up, dropped): every "
        "system in round 0, verl's and Conduit's alternating (verl_runs.round_order); after it the headline "
        "pair alone, adjacent, its order reversed each round (ABBA: intervals.round_plan; the file's "
        "round_plan, rows' round and position); same seed and data. Intervals: intervals.bootstrap_ratio",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine_load": "2 shared cores; other jobs may run concurrently (noisy)",
    }


def add_run_flags(p: argparse.ArgumentParser, timeout: int, paced: str = "") -> None:
    """The flags of a benchmark built on these runs: the paced rollout's model (``--tail``, ``--R``;
    ``paced`` starts their help), ``--seed``, ``--timeout`` (seconds per run) and its scratch directory
    (``--work``, ``--reuse``)."""
    p.add_argument("--tail", type=float, default=4.0, help=f"{paced}p99 / median response length")
    p.add_argument("--R", type=float, default=4.0, help=f"{paced}generation time / measured ingestion time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=int, default=timeout)
    p.add_argument("--work", default=None, help="scratch dir (default: a new temp dir)")
    p.add_argument("--reuse", action="store_true", help="with --work: re-analyse runs already there")
    p.add_argument(
        "--fixed-length",
        action="store_true",
        help="timing runs of equal work: every response runs to --response-length (the harness's "
        "--fixed-length: vllm ignores EOS, paced draws every length at the cap); the hf rollout refuses it",
    )


def harness_args(
    args: argparse.Namespace, tail: float | None = None, scale: float | None = None
) -> list[str]:
    """The harness flags every run of this invocation shares (shape; the paced rollout's model; with
    ``--fixed-length``, every response at the length cap: equal work in every system, whatever the
    policy and the timing do to response lengths)."""
    fixed = getattr(args, "fixed_length", False)
    if fixed and args.rollout not in ("paced", "vllm"):
        raise SystemExit(
            f"--fixed-length applies to --rollout vllm or paced (got {args.rollout}): the hf rollout "
            "stops at EOS and has no switch to ignore it"
        )
    out = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    out += ["--fixed-length"] if fixed else []
    out += ["--n", str(args.n)] if args.n else []
    if args.rollout == "paced":
        out += ["--rollout", "paced", "--response-length", str(args.response_length)]
        out += [
            "--pace-median",
            str(args.pace_median),
            "--pace-tail",
            str(tail),
            "--pace-scale",
            f"{scale:.6g}",
        ]
    if args.rollout == "vllm":  # every run dumps its samples: the equivalence figures
        out += ["--rollout", "vllm", "--response-length", str(args.response_length)]
        out += ["--core-split", args.core_split, "--dump-samples"]
    return out


def calibrate(root: Path, args: argparse.Namespace, tail: float) -> list[dict[str, Any]]:
    """Rows of a short paced sync run with scale 0 (nothing waits): its measured ingestion time and
    the unscaled modelled generation time per step, for ``verl_analysis.calibration``."""
    work = root / f"calibrate_tail{tail:g}"
    extra = ["--poll-interval", "0.05", *harness_args(args, tail, 0.0)]
    rc, log = run(work, "sync", 3 if args.quick else 4, args, extra)
    if rc or not (work / "metrics.jsonl").exists():
        raise SystemExit(f"[bench] calibration run failed:\n{log}")
    return rows_for_run(work, args.algo, "verl_sync", 1, {})


def polled(plain: str, poll: float | None) -> list[str]:
    """The harness flag that sets the replay-buffer poll of a polling baseline: every verl trainer
    (sync, colocate_async, separate_async, bounded or not) at ``poll``, except ``verl_sync``, which
    is verl as shipped (2 s); Conduit's trainer mode waits on its own completion channel."""
    if plain.startswith("conduit") or plain == "verl_sync" or poll is None:
        return []
    return ["--poll-interval", str(poll)]


def plan_rounds(systems: list[str], rounds: int, pair: tuple[str, str] | None) -> list[list[str]]:
    """The systems of each round: with a headline ``pair`` among ``systems``, ``intervals.round_plan``
    (every system in round 0, then the pair alone, its order reversed each round); otherwise every
    system in every round, in ``round_order``."""
    if pair and pair[0] in systems and pair[1] in systems:
        return round_plan(round_order(systems, 0), pair, rounds)
    return [round_order(systems, k) for k in range(rounds)]


def run_systems(
    root: Path, args: argparse.Namespace, systems: list[str], plan: dict[str, Any], result: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every system in ``plan_rounds``' order: ``plan["rounds"]`` rounds, in ``round_order`` (verl's and
    Conduit's systems alternate, odd rounds reversed: drift hits both sides alike) or, with a headline
    ``plan["pair"]``, every system in round 0 and the pair alone after it, reversed each round (ABBA;
    ``result["round_plan"]``); every polling baseline at ``plan["poll"]`` (``polled``); rows tagged with the plan's ``info``
    (rollout, tail, R, ...) and the run's place in its round (``position``). ``plan["modes"]``
    (optional): a benchmark's own systems, name -> (trainer mode, harness flags), where ``{work}`` in
    a flag becomes the run's work dir (``verl_staleness.py``: ``conduit_k1`` -> ``conduit`` with
    ``+trainer.v1.conduit.max_staleness=1``, its group log under ``{work}``)."""
    poll = plan["poll"]
    modes = {
        "verl_sync": ("sync", []),  # as shipped: verl's 2 s replay-buffer poll
        "verl_sync_tuned": ("sync", []),
        "verl_colocate_async": ("colocate_async", []),
        "verl_separate_async": ("separate_async", []),  # the harness's overrides.separate_async_overrides
        "conduit": ("conduit", []),
        "conduit_stream": ("conduit", []),
        **plan.get("modes", {}),
    }
    rows: list[dict[str, Any]] = []
    rounds = plan_rounds(systems, plan["rounds"], plan.get("pair"))
    result["round_plan"] = rounds
    if plan.get("pair") and (why := check_abba(rounds, plan["pair"])):
        result["round_plan_breaks_abba"] = why
    for k, order in enumerate(rounds):
        for position, system in enumerate(order):
            plain, backend = split_system(system)
            mode, extra = modes[plain]
            work = root / f"{plan['label']}{system}_r{k}"
            extra = [x.replace("{work}", str(work)) for x in extra]
            extra += polled(plain, poll)
            extra = [*extra, "--tq-backend", backend, *conduit_knobs(args, system), *plan["harness"]]
            rc, tail = run(work, mode, plan["steps"] + 1, args, extra)
            if rc or not (work / "metrics.jsonl").exists():
                result["errors"][f"{plan['label']}{system}_r{k}"] = tail
                continue
            info = {"round": k, "position": position, "poll_s": poll if polled(plain, poll) else None}
            info.update(plan["info"])
            info["tq_backend"] = backend_ran(work, backend)
            info.update(tq_seconds_per_iteration(work), **run_info(work))
            mine = rows_for_run(work, args.algo, system, 1, info)
            if args.rollout == "vllm":  # vLLM's own counters for each iteration's generation
                engine = engine_steps(work)
                for row in mine:
                    row["vllm"] = engine.get(row["iteration"])
            rows += mine
            result.setdefault("work_dirs", {})[f"{plan['label']}{system}_r{k}"] = str(work)
    return rows
