"""Replay-buffer insert and sample throughput: Conduit vs TorchRL vs RLlib vs a plain memcpy.

    python benchmarks/buffer_throughput.py [--quick] [--load] [--out FILE]

Every system runs the same cells — (op, sampler, batch, dim) with the same prefilled (full) buffer
capacity — in one run. TorchRL runs in its own venv (``benchmarks/envs/setup_torchrl.sh``: TorchRL
0.14.1 on the main env's CPU torch) through a subprocess; RLlib and Conduit run in this process.
Every row carries the median and the best round side by side (and every round) and the work one call
did (``work``: transitions, fields, bytes, priority update); a Conduit ÷ peer ratio is only computed on
equal work, else refused with the difference. RLlib's cell builds a full DQN train batch from episodes,
so it is compared with ``conduit_dqn`` (Conduit delivering the same train batch), not with Conduit's
one-column cell. Writes a JSON of flat rows plus ratios, targets and machine facts, and a PNG of the
same stem. See ``peers/`` for what each system's call does.
With ``--load``, every timing round also runs with (cores - 1) busy processes on the other cores;
those rows carry ``load: true``, and ``load_ratios`` (+ ``<stem>_load.png``) gives loaded ÷ idle.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))
sys.path.insert(1, str(HERE))
sys.path.insert(2, str(HERE.parent))

import analysis  # noqa: E402
import conduit_dqn_peer  # noqa: E402
import harness  # noqa: E402
import load as load_module  # noqa: E402
import memcpy_peer  # noqa: E402
import orchestrate  # noqa: E402
import provenance  # noqa: E402
import report_tables  # noqa: E402
import rllib_peer  # noqa: E402
import script  # noqa: E402
from analysis import compute_load_ratios, compute_overhead, compute_ratios, evaluate_targets  # noqa: E402
from buffer_report import plot, plot_load  # noqa: E402
from conduit_peer import ConduitSystem  # noqa: E402
from harness import ALPHA, BETA, System, Timing, capacity_for, make_grid, progress_line  # noqa: E402
from load import CpuLoad, reference_slowdown  # noqa: E402
from memcpy_peer import GatherSystem, MemcpySystem  # noqa: E402
from orchestrate import run_interleaved  # noqa: E402
from torchrl_driver import DEFAULT_PYTHON, RemoteTorchRL, ensure_env  # noqa: E402

OPS = ("sample", "insert")
SAMPLERS = ("prioritized", "uniform")
ALL_SYSTEMS = ("memcpy", "conduit", "conduit_dqn", "rllib", "torchrl")
FULL = {
    "batches": [32, 256, 1024],
    "dims": [4, 64, 1024, 16384],
    "rllib_batches": [32, 256],
    "rllib_dims": [4, 64],
}
QUICK = {"batches": [32, 256], "dims": [4, 64, 1024, 16384], "rllib_batches": [32, 256], "rllib_dims": [4]}
FULL_TIMING = Timing(min_time=0.5, rounds=20, warmup=3)  # 25 ms rounds, as before; 20 of them, not 8
QUICK_TIMING = Timing(min_time=0.2, rounds=10, warmup=2)
DEFAULT_OUT = HERE / "results" / "buffer_throughput.json"
DOCUMENTED = (harness, orchestrate, analysis, load_module, memcpy_peer, conduit_dqn_peer, rllib_peer)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    ap = script.parser(__doc__, quick="fewer cells and rounds (a smoke run)", out=DEFAULT_OUT)
    ap.add_argument(
        "--load",
        action="store_true",
        help="also time every round with (cores - 1) busy processes on the other cores",
    )
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma list of systems to run")
    ap.add_argument("--torchrl-python", type=Path, default=DEFAULT_PYTHON, help="python of the TorchRL venv")
    ap.add_argument(
        "--setup-torchrl", action="store_true", help="build the TorchRL venv first if it is missing"
    )
    return ap.parse_args(argv)


def make_systems(
    args: argparse.Namespace, grid: dict[str, list[int]], errors: dict[str, str]
) -> list[System]:
    """The requested systems (memcpy also brings the gather reference); TorchRL's venv is checked first."""
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(ALL_SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {ALL_SYSTEMS}")
    systems: list[System] = []
    if "memcpy" in wanted:
        systems += [MemcpySystem(), GatherSystem()]
    if "conduit" in wanted:
        systems.append(ConduitSystem())
    if "conduit_dqn" in wanted:
        systems.append(conduit_dqn_peer.ConduitDQNSystem(grid["rllib_dims"], grid["rllib_batches"]))
    if "rllib" in wanted:
        systems.append(rllib_peer.RLlibSystem(grid["rllib_dims"], grid["rllib_batches"]))
    if "torchrl" in wanted:
        err = ensure_env(args.torchrl_python, args.setup_torchrl)
        if err:
            errors["torchrl"] = err
            print(f"!! torchrl UNAVAILABLE: {err}", flush=True)
        else:
            systems.append(RemoteTorchRL(args.torchrl_python))
    return systems


def run_all(args: argparse.Namespace, grid: dict[str, list[int]], timing: Timing) -> dict[str, Any]:
    """Run every requested system on the grid, interleaved; return rows, gather rows, errors, TorchRL info."""
    errors: dict[str, str] = {}
    systems = make_systems(args, grid, errors)
    cells = make_grid(grid["batches"], grid["dims"], OPS, SAMPLERS)
    torchrl_info: dict[str, Any] = {}
    load = CpuLoad() if args.load else None
    load_reference: dict[str, Any] | None = None
    try:
        for s in systems:
            if isinstance(s, RemoteTorchRL):
                torchrl_info = s.info()
        on_row = lambda row: print(progress_line(row), flush=True)  # noqa: E731
        all_rows = run_interleaved(systems, cells, timing, on_row, errors, load)
        load_reference = reference_slowdown(load) if load is not None else None
    finally:
        if load is not None:
            load.close()
        for s in systems:
            if isinstance(s, RemoteTorchRL):
                s.shutdown()
    names = [s.name for s in systems if s.name != "gather"] + [
        n for n in errors if n not in {s.name for s in systems}
    ]
    status = {
        n: ({"status": "error", "error": errors[n]} if n in errors else {"status": "ok"}) for n in names
    }
    return {
        "rows": [r for r in all_rows if r["system"] != "gather"],
        "gather_rows": [r for r in all_rows if r["system"] == "gather"],
        "errors": errors,
        "torchrl_info": torchrl_info,
        "systems": status,
        "load_processes": load.processes if load is not None else 0,
        "load_reference": load_reference,
    }


def build_report(
    args: argparse.Namespace,
    grid: dict[str, list[int]],
    timing: Timing,
    run: dict[str, Any],
    machine: dict[str, Any],
    prov: provenance.Start,
) -> dict[str, Any]:
    """The result document written to JSON (``prov``: from ``provenance.start()`` when the run began)."""
    import torch

    overhead = compute_overhead(run["rows"], run["gather_rows"])
    torchrl_env = run["torchrl_info"] or {"status": run["errors"].get("torchrl", "not run")}
    machine = script.machine(prov, **machine, torch_threads=torch.get_num_threads(), torchrl_env=torchrl_env)
    cores = machine.get("cores") or 0
    warnings = [
        f"load average {when} {load[0]} exceeded {cores} cores: other processes shared the CPU; rates are noisy"
        for when, load in (
            ("at start", machine["load_average_start"]),
            ("at end", machine["load_average_end"]),
        )
        if load and cores and load[0] > cores
    ]
    return {
        "benchmark": "buffer_throughput",
        "warnings": warnings,
        "mode": "quick" if args.quick else "full",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config": {
            **grid,
            "capacity": {str(d): capacity_for(d) for d in grid["dims"]},
            "timing": timing.to_dict(),
            "alpha": ALPHA,
            "beta": BETA,
            "torch_threads": torch.get_num_threads(),
            "load_processes": run["load_processes"],
        },
        # what every system's call does, the work record, the ratios, the timing and the load: the docstrings
        "definitions": {"buffer_throughput": __doc__} | {m.__name__: m.__doc__ for m in DOCUMENTED},
        "machine": machine,
        "systems": run["systems"],
        "rows": run["rows"],
        "gather_reference": run["gather_rows"],
        "overhead": overhead,
        "ratios": compute_ratios(run["rows"]),
        "load_ratios": compute_load_ratios(run["rows"]),
        "load_reference": run["load_reference"],
        "targets": evaluate_targets(run["rows"], overhead, run["errors"]),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, write JSON + PNG, print the table; exit 1 if any system failed."""
    args = parse_args(argv)
    prov = provenance.start()
    import torch

    grid = QUICK if args.quick else FULL
    timing = QUICK_TIMING if args.quick else FULL_TIMING
    machine = {"cpu_model": script.cpu_model(), "cores": os.cpu_count()}
    print(
        f"buffer_throughput ({'quick' if args.quick else 'full'}): {machine['cpu_model']}, {machine['cores']} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {prov.load_average_start}",
        flush=True,
    )
    load = prov.load_average_start
    if load and machine["cores"] and load[0] > machine["cores"]:
        print(
            f"WARNING: load average {load[0]} exceeds {machine['cores']} cores; timings will be noisy",
            flush=True,
        )
    t0 = time.perf_counter()
    run = run_all(args, grid, timing)
    doc = build_report(args, grid, timing, run, machine, prov)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    png = args.out.with_suffix(".png")
    plot(
        doc["rows"],
        png,
        f"Replay buffer throughput ({doc['mode']}, {machine['cpu_model']}, {machine['cores']} cores)",
    )
    if doc["load_ratios"]:
        load_png = args.out.with_name(args.out.stem + "_load.png")
        plot_load(doc["load_ratios"], load_png, f"Loaded / idle ({doc['mode']}, {machine['cores']} cores)")
    print("\n" + "\n".join(report_tables.buffer_throughput(doc)))
    for name, msg in run["errors"].items():
        print(f"\n!! {name} did not produce results: {msg}")
    print(f"\nwrote {args.out} and {png} ({doc['wall_s']} s)", flush=True)
    return 1 if run["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
