"""verl 0.9.1 on CPU: one iteration of GRPO/PPO, verl's trainers vs Conduit's ``conduit`` mode.

    python benchmarks/verl_iteration.py [--quick] [--algo grpo|ppo] [--systems a,b,...] [--out FILE]

Systems, same seed and data, run one after another in this invocation (each start costs ~75 s
of Ray/verl start-up, so iterations cannot alternate between systems): ``verl_sync`` (as shipped,
2 s replay-buffer poll), ``verl_sync_tuned`` (the poll period a sweep found best; the sweep is one
run with a per-step period schedule and is recorded), ``verl_colocate_async``, ``conduit``. The first
iteration of each run is warm-up. Exposed time: see ``verl_analysis.py``.

TransferQueue's storage backend is a second dimension. A system runs on its mode's default: verl's
SimpleStorage for verl's modes, Conduit's backend for ``conduit``; the suffix ``+tq_conduit`` or
``+tq_simple`` picks the other one (``verl_sync_tuned+tq_conduit``: verl's tuned sync trainer with
its experience in Conduit's storage; ``conduit+tq_simple``: Conduit's mode on verl's storage). Every
row records the backend the run reported (``tq_backend``, from its ``summary.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from verl_analysis import ratios, rows_for_run  # noqa: E402
from verl_plots import reward_curve, stage_bars  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SWEEP = (0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005)
#: the harness's ``--tq-backend`` choices -> TransferQueue's backend names
TQ_BACKENDS = {"conduit": "Conduit", "simple": "SimpleStorage"}
TQ_SUFFIX = "+tq_"
DEFAULT_SYSTEMS = (
    "verl_sync,verl_sync_tuned,verl_sync_tuned+tq_conduit,verl_colocate_async,"
    "conduit,conduit+tq_simple,conduit_stream"
)


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
    """One CPU-mode training run; returns (exit code, log tail). ``--reuse``: a finished run is read."""
    if args.reuse and (work / "metrics.jsonl").exists():
        print(f"[bench] reusing {work}", flush=True)
        return 0, ""
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--trainer-mode", mode, "--steps", str(steps)]
    cmd += ["--seed", str(args.seed), "--algo", args.algo, "--work-dir", str(work), *extra]
    print(f"[bench] {' '.join(cmd[2:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    print(f"[bench]   rc={proc.returncode} in {time.monotonic() - t0:.0f}s", flush=True)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def sweep(root: Path, args: argparse.Namespace, per: int) -> tuple[float, dict[str, Any]]:
    """One sync run whose poll period changes every ``per`` steps; the fastest period wins."""
    schedule = [2.0] + [p for p in SWEEP for _ in range(per)]
    rc, tail = run(
        root / "sweep", "sync", len(schedule), args, ["--poll-interval", ",".join(map(str, schedule))]
    )
    if rc:
        return 0.05, {"error": tail}
    rows = rows_for_run(root / "sweep", args.algo, "verl_sync", 1, {})
    by = {p: [r["wall_s"] for r in rows if schedule[r["iteration"] - 1] == p] for p in SWEEP}
    med = {p: statistics.median(v) for p, v in by.items() if v}
    best = min(med.values())
    # the smallest period within 3 % of the fastest (a shorter poll costs driver CPU for nothing)
    chosen = max(p for p, w in med.items() if w <= best * 1.03)
    return chosen, {
        "median_wall_s_by_poll_s": {str(p): round(w, 4) for p, w in med.items()},
        "chosen": chosen,
    }


def reward_runs(root: Path, args: argparse.Namespace, png: Path, errors: dict[str, str]) -> dict[str, Any]:
    """verl sync and conduit, same seed, ``--reward-steps`` iterations each: mean score per step."""
    curves: dict[str, list[tuple[int, float]]] = {}
    lr = ["--lr", str(args.reward_lr)]
    for system, mode, extra in (
        ("verl_sync", "sync", ["--poll-interval", "0.05"]),
        ("conduit", "conduit", []),
    ):
        work = root / f"reward_{system}"
        rc, tail = run(work, mode, args.reward_steps, args, lr + extra + conduit_knobs(args, system))
        if rc:
            errors[f"reward_{system}"] = tail
            continue
        recs = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
        curves[system] = [(int(r["step"]), float(r["data"]["critic/score/mean"])) for r in recs]
    if curves:
        reward_curve(
            curves, png, f"verl 0.9.1 CPU {args.algo}, lr {args.reward_lr}: mean score per iteration"
        )
    return {"lr": args.reward_lr, "curves": curves}


def conduit_knobs(args: argparse.Namespace, system: str) -> list[str]:
    """The conduit mode's knobs for this benchmark (none for verl's own modes)."""
    base, _ = split_system(system)
    if base == "conduit_stream":  # always stream, in pieces of a fixed size
        return [f"+trainer.v1.conduit.g_ing={args.stream_g_ing}"]
    return [f"+trainer.v1.conduit.g_ing={args.g_ing}"] if base == "conduit" else []


def tq_seconds_per_iteration(work: Path) -> dict[str, float]:
    """Mean seconds per iteration inside TQ storage put/get calls, summed over every process of the run
    (the harness times each storage manager's ``put_data`` / ``get_data``; ``summary.json``)."""
    path = work / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    calls, n = summary.get("tq_calls") or {}, max(1, int(summary.get("iterations") or 1))
    return {f"tq_{op}_s_per_iter": round(calls.get(f"tq_{op}_s", 0.0) / n, 4) for op in ("put", "get")}


def table(rows: list[dict[str, Any]], systems: list[str]) -> str:
    """Per system: its backend, measured iterations, median wall and exposed time."""
    head = f"{'system':<28} {'tq_backend':<14} {'n':>3} {'wall_s':>8} {'exposed_s':>9} {'tq_put_s':>9} {'tq_get_s':>9}"
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
        lines.append(
            f"{system:<28} {backend:<14} {len(mine):>3} {wall:>8.3f} {exposed:>9.3f} {tq[0]:>9.3f} {tq[1]:>9.3f}"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    info.update(cpus=os.cpu_count(), torch=torch.__version__)
    try:
        import verl

        info["verl"] = verl.__version__
    except Exception:  # noqa: BLE001
        pass
    return info


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer iterations and a shorter sweep")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument(
        "--out",
        default=None,
        help="JSON path (default benchmarks/results/verl_iteration[_quick]_<algo>.json)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="measured iterations per system")
    p.add_argument(
        "--reward-steps", type=int, default=0, help="also longer sync and conduit runs for a reward curve"
    )
    p.add_argument("--reward-lr", type=float, default=3e-3, help="learning rate of the reward-curve runs")
    p.add_argument("--g-ing", default="auto", help="conduit: prompt groups per ingestion piece (int or auto)")
    p.add_argument("--stream-g-ing", type=int, default=2, help="conduit_stream: fixed groups per piece")
    p.add_argument("--rounds", type=int, default=None, help="rounds of all systems (default 2, quick 1)")
    p.add_argument(
        "--systems",
        default=DEFAULT_SYSTEMS,
        help=f"comma list; a suffix {TQ_SUFFIX}conduit / {TQ_SUFFIX}simple sets the TransferQueue backend",
    )
    p.add_argument("--poll", type=float, default=None, help="skip the sweep; tuned poll period (s)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--work", default=None, help="scratch dir (default: a new temp dir)")
    p.add_argument(
        "--reuse", action="store_true", help="with --work: re-analyse runs already there instead of rerunning"
    )
    args = p.parse_args()
    prov = provenance.start()
    steps = args.steps or (4 if args.quick else 14)
    rounds = args.rounds or (1 if args.quick else 2)
    name = f"verl_iteration{'_quick' if args.quick else ''}_{args.algo}"
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

    root = Path(args.work or tempfile.mkdtemp(prefix="verl_bench_"))
    systems = args.systems.split(",")
    for system in systems:
        split_system(system)  # a bad suffix fails before any run
    result: dict[str, Any] = {"rows": [], "machine": machine(), "errors": {}}
    poll = args.poll
    if any(split_system(s)[0] == "verl_sync_tuned" for s in systems) and poll is None:
        poll, result["sweep"] = sweep(root, args, 1 if args.quick else 2)
    modes = {
        "verl_sync": ("sync", []),
        "verl_sync_tuned": ("sync", ["--poll-interval", str(poll)]),
        "verl_colocate_async": ("colocate_async", []),
        "conduit": ("conduit", []),
        "conduit_stream": ("conduit", []),
    }
    for k in range(rounds):  # rounds interleave the systems against drift in the machine's load
        for system in systems:
            plain, backend = split_system(system)
            mode, extra = modes[plain]
            work = root / f"{system}_r{k}"
            extra = [*extra, "--tq-backend", backend, *conduit_knobs(args, system)]
            rc, tail = run(work, mode, steps + 1, args, extra)
            if rc or not (work / "metrics.jsonl").exists():
                result["errors"][f"{system}_r{k}"] = tail
                continue
            info = {"round": k, "poll_s": poll if "tuned" in plain else None}
            info["tq_backend"] = backend_ran(work, backend)
            info.update(tq_seconds_per_iteration(work))
            result["rows"] += rows_for_run(work, args.algo, system, 1, info)
    base = [s for s in systems if not s.startswith("conduit")]
    # g_ing=auto measures 3 iterations with and 3 without streaming after the warm-up one
    result["ratios"] = ratios(result["rows"], base, steady_from=8 if steps + 1 > 8 else 0)
    result["method"] = {
        "order": f"{rounds} round(s); in each, the systems run one after another (each start ~35-75 s), "
        "same seed/data; iteration 1 of each run is warm-up and dropped",
        "conduit_stream": f"conduit with g_ing={args.stream_g_ing} fixed (always streams)",
        "tq_backend": "TransferQueue storage per system: verl's modes on SimpleStorage, conduit on "
        f"Conduit's backend, unless the system name ends in {TQ_SUFFIX}simple / {TQ_SUFFIX}conduit; "
        "each row's tq_backend is what the run reported",
        "conduit_steady": "conduit (g_ing=auto) iterations 8 and later, after its measurement phase",
        "exposed": (sys.modules["verl_analysis"].__doc__ or "").strip(),
        "steps_per_system_per_round": steps,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine_load": "2 shared cores; other jobs may run concurrently (noisy)",
    }
    if result["rows"]:
        stage_bars(
            result["rows"], out.with_suffix(".png"), f"verl 0.9.1 CPU {args.algo}: stages per iteration"
        )
    if args.reward_steps:
        result["reward_curve"] = reward_runs(
            root, args, out.with_name(f"{name}_reward.png"), result["errors"]
        )
    result["machine"].update(provenance.finish(prov))  # after the reward runs: the run's real end
    out.write_text(json.dumps(result, indent=1))
    print(table(result["rows"], systems))
    print(json.dumps(result["ratios"], indent=1))
    print(f"[bench] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
