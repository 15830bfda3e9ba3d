"""TransferQueue storage backends through TQ's own client API: SimpleStorage vs RayStore vs Conduit.

    python benchmarks/tq_backends.py [--quick] [--nodes {1,3}] [--out FILE]

Timed: ``tq.kv_batch_put`` of a GRPO-shaped batch, then ``tq.kv_batch_get`` of all its fields (``kv_clear``
untimed). Each system runs in its own worker subprocess with its own Ray cluster (``tq.init`` once per
process, one controller per cluster), driven one cell at a time over JSON lines (``tq_phase.py``); systems
are interleaved per round, the median over the timed rounds is reported, and round 0 (warm-up) checks the
data read back. A memcpy of the same bytes is timed in the driver in the same rounds. ``--nodes 3`` runs
a 3-node ``ray.cluster_utils.Cluster`` on this machine (loopback). SimpleStorage is swept over
``--simple-units`` and compared at its best count per cell and op; RayStore is recorded under ``skipped``
where Ray's NIXL transport is missing. Ray logical CPUs: TQ's controller and each SimpleStorage unit
reserve one (``tq_worker.ray_cpus``; too few and ``tq.init`` hangs). The JSON's ``setup`` says the rest;
the method and its caveats: ``benchmarks/notes/tq_backends.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(HERE / "peers")]
import provenance  # noqa: E402
import report_tables  # noqa: E402
import script  # noqa: E402
from tq_analysis import compute_ratios, evaluate_targets, mark_best_units, units_summary  # noqa: E402
from tq_batch import JAGGED_FIELDS  # noqa: E402
from tq_phase import Phase  # noqa: E402
from tq_report import figure_title, plot  # noqa: E402
from tq_worker import SIMPLE_TOTAL_SIZE, worker_label, worker_main  # noqa: E402

DEFAULT_OUT = HERE / "results" / "tq_backends.json"
SYSTEMS = ("SimpleStorage", "RayStore", "Conduit")
SAME_FULL = [(b, t) for b in (64, 256, 1024) for t in (512, 4096, 16384)]
SAME_QUICK = [(b, t) for b in (64, 256) for t in (512, 4096)]
CROSS_CELLS = [(256, 4096), (1024, 4096), (256, 16384)]
ROUNDS = {"quick": 5, "full": 7}  # timed rounds per cell, after one warm-up round
SIMPLE_UNITS = (1, 2, 4)  # SimpleStorage storage units swept (TQ's default: 2)


def machine_facts() -> dict[str, Any]:
    """The measured tq_store's content hash, the machine and the package versions."""
    import platform

    import torch

    digest = hashlib.sha256()
    for f in sorted((REPO / "integrations" / "verl" / "conduit_verl" / "tq_store").glob("*.py")):
        digest.update(f.name.encode() + f.read_bytes())
    return {
        "tq_store_sha256": digest.hexdigest()[:16],
        "cpu_count": os.cpu_count(),
        "cpu_model": script.cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads_driver": torch.get_num_threads(),
        "ray": script.version("ray"),
        "transfer_queue": script.version("TransferQueue"),
        "tensordict": script.version("tensordict"),
        "hostname": platform.node(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = script.parser(__doc__, quick="same node only, 2 x 2 cells, 5 rounds (~3 min)", out=DEFAULT_OUT)
    ap.add_argument("--nodes", type=int, choices=(1, 3), default=None,
                    help="only the same-node (1) or the cross-node (3) phase (default: both; --quick: 1)")  # fmt: skip
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of systems")
    ap.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per cell (default 5 quick, 7 full)"
    )
    ap.add_argument("--samples", default=None, help="comma list overriding the samples axis (every phase)")
    ap.add_argument("--tokens", default=None, help="comma list overriding the tokens axis (every phase)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads in the driver, the workers and the client actors (default 1: on a "
                    "small shared machine intra-op threads stall on each other)")  # fmt: skip
    ap.add_argument("--simple-units", default=",".join(str(u) for u in SIMPLE_UNITS),
                    help="SimpleStorage storage unit counts to sweep (default 1,2,4; TQ's default is 2)")  # fmt: skip
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--units", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.nodes or 1, args.threads, args.units)
        return 0
    import torch

    prov = provenance.start()
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_start = prov.load_average_start
    mode = "quick" if args.quick else "full"
    systems = [s for s in args.systems.split(",") if s]
    bad = set(systems) - set(SYSTEMS)
    if bad:
        raise SystemExit(f"unknown systems {sorted(bad)}; choose from {SYSTEMS}")
    units = [int(u) for u in args.simple_units.split(",") if u]
    labels = [
        lab for s in systems for lab in ([worker_label(s, u) for u in units] if s == "SimpleStorage" else [s])
    ]
    phases = [args.nodes] if args.nodes else ([1] if args.quick else [1, 3])
    same = SAME_QUICK if args.quick else SAME_FULL
    cross = CROSS_CELLS
    if args.samples or args.tokens:  # override the cells of every phase
        bs = [int(x) for x in args.samples.split(",")] if args.samples else sorted({b for b, _ in same})
        ts = [int(x) for x in args.tokens.split(",")] if args.tokens else sorted({t for _, t in same})
        same = cross = [(b, t) for b in bs for t in ts]
    rounds = args.rounds or ROUNDS[mode]
    logdir = Path(tempfile.mkdtemp(prefix="tq_backends-logs-"))
    print(f"tq_backends ({mode}): systems {labels}, phases {phases}, {rounds} timed rounds + 1 warm-up "
          f"per cell; load {load_start}; worker logs in {logdir}", flush=True)  # fmt: skip
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    errors: list[dict] = []
    for nodes in phases:
        if nodes == 3 and "RayStore" in skipped:  # it failed on the same node: the same call fails here
            print(f"\n(RayStore skipped for the cross-node phase: {skipped['RayStore'][:200]})", flush=True)
        phase = Phase(nodes, labels, rounds, logdir, skipped, errors, args.threads)
        rows += phase.run(same if nodes == 1 else cross, t_start)
    wall = time.perf_counter() - t_start
    mark_best_units(rows)
    ratios, targets = compute_ratios(rows), evaluate_targets(rows)
    facts = provenance.finish(prov)  # git_commit, git_dirty, load_average_start/_end, created_utc
    created = facts.pop("created_utc")
    facts.update(machine_facts())
    result = {
        "benchmark": "tq_backends",
        "mode": mode,
        "created": created,
        "wall_seconds": round(wall, 1),
        "machine": facts,
        "setup": {
            "api": "transfer_queue kv_batch_put / kv_batch_get (timed), kv_clear (untimed)",
            "fields": {**JAGGED_FIELDS, "rm_scores": "float32 scalar per sample"},
            "lengths": "per sample uniform in [L/2, L], shared by all token fields",
            "rounds": rounds,
            "warmup_rounds": 1,
            "statistic": "median over timed rounds, systems interleaved per round (rotating order)",
            "backend_seconds": "time inside the TQ storage manager's put_data / get_data, less the controller "
            "notification TQ's base class sends from put_data; client_seconds: the rest of the call "
            "(TransferQueue's client and controller, the same for every backend); a target cell's 'bound' is "
            "the reference's seconds (SimpleStorage or memcpy) / Conduit's client_seconds: the ratio a backend "
            "taking no time would reach",
            "ray": "same node: ray.init(address='local', num_cpus=3, 127.0.0.1, no dashboard); cross node: "
            "ray.cluster_utils.Cluster, 3 nodes x num_cpus=2 on 127.0.0.1 (logical CPUs; see docstring)",
            "simplestorage": {
                "total_storage_size": SIMPLE_TOTAL_SIZE,
                "num_data_storage_units": units,
                "compared": "per cell and op, the unit count with the highest GB/s "
                "(rows: storage_units, best_of_units; ratios and targets: simplestorage_units)",
            },
            "ray_cpus": "same node: max(3, units + 1) logical CPUs; cross node: 2 per node (3 where the "
            "SimpleStorage units put two on one node)",
            "conduit_path_bytes": "per Conduit row, bytes per round through each path from the storage actors' "
            "counters (put: bytes_put, bytes_put_direct; get: bytes_get_mapped, bytes_get_copied) and "
            "mapped_share = bytes on the mapped path / payload bytes; measured bytes per path, not copies",
            "torch_threads": args.threads,
            "memcpy": "op 'copy_into': copy_ of every field's flat values into preallocated tensors (the reference "
            "of the memcpy target); op 'copy': torch clone (fresh memory). In the driver, per round the fastest of "
            ">= 2 back-to-back copies (>= 20 ms in all, at most 20), then the median over rounds",
        },
        "skipped": skipped,
        "errors": errors,
        "rows": rows,
        "ratios": ratios,
        "simplestorage_units": units_summary(rows),
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    png = args.out.with_suffix(".png")
    if rows:
        plot(rows, systems, png, figure_title(result))
    script.show(report_tables.tq_backends(result))  # the table, skipped systems and targets of BENCHMARKS.md
    if errors:
        print(f"\n{len(errors)} error(s) recorded in the JSON")
    print(
        f"\nwrote {args.out} and {png}  ({wall:.0f}s wall; load {load_start} -> {facts['load_average_end']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
