"""Named placements vs the planner's, on two workloads and across sizes; planner accuracy.

    python benchmarks/placement_ablation.py [--quick] [--out FILE]

Real allocations and copies on this machine's host tiers (pageable host, shm, disk). ``dqn_replay``: a
prioritized replay as RLlib's DQN uses it (a fragment in, a batch sampled and its priorities updated),
observations growing. ``grpo_tq``: verl's GRPO fields in the TransferQueue backend's node store, put and
read as verl's stages read them, responses growing; the store runs in this process, so the Ray transport
a host-tier field pays is missing (it favours ``host``). Placements: ``all_*`` and ``planned``
(``conduit.placement.plan`` on the measured topology); budgets are simulated and a placement over one is
out of memory (a missing point). Planner accuracy: Spearman's rank correlation of predicted against
measured seconds. GPU placements are priced on ``topologies/h200x8.toml``: predictions, labelled so.
Method: ``benchmarks/notes/placement_ablation.md``.
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(HERE))
sys.path.insert(2, str(ROOT / "integrations" / "verl"))

import provenance  # noqa: E402
import report_ops  # noqa: E402
import script  # noqa: E402
from placement_workloads import (  # noqa: E402
    GRPO_DTYPES,
    GRPO_READS,
    budgeted,
    dqn_fields,
    dqn_schema,
    dqn_setup,
    grpo_fields,
    grpo_setup,
)

from conduit.discovery import local_topology  # noqa: E402
from conduit.errors import CapacityError  # noqa: E402
from conduit.placement import BASELINES, Access, Field, plan, price  # noqa: E402
from conduit.placer import usable_tiers  # noqa: E402
from conduit.topology import Topology  # noqa: E402

FULL = {
    "dims": [64, 1024, 4096, 16384],
    "capacity": 4000,
    "tokens": [512, 2048, 8192],
    "samples": 128,
    "iters": 15,
}
QUICK = {"dims": [64, 4096], "capacity": 1000, "tokens": [512, 4096], "samples": 64, "iters": 5}
HOST_TIERS = ("host", "shm", "disk")
#: tiers measured here: the host tiers, and on a GPU machine pinned host and the first GPU's HBM
TIERS = HOST_TIERS + (("pinned", "cuda:0") if torch.cuda.is_available() else ())


def spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    c = np.corrcoef(rx, ry)[0, 1]
    return None if not np.isfinite(c) else round(float(c), 3)


def placements(fields: list[Field], topo: Topology, usable: dict[str, str]) -> dict[str, dict[str, str]]:
    """Buffer tier per field for each named placement that can exist here, and the planner's."""
    back = {v: k for k, v in usable.items()}
    names = {"host": "all_pageable_host", "cuda:0": "one_gpu"}
    store = bool(fields) and fields[0].name != "obs"  # the TQ store's fields: host tiers only
    kinds = HOST_TIERS if store else TIERS
    out = {names.get(t, f"all_{t}"): {f.name: t for f in fields} for t in kinds}
    try:
        # the TQ store plans among the tiers a reader maps (planning.py): no room on host for it
        host = topo.tier(usable["host"])
        headroom = {host.name: host.capacity_bytes} if store else {}
        out["planned"] = {n: back[t] for n, t in plan(fields, topo, headroom).assignment.items()}
    except CapacityError:
        pass
    return out


def sweep(
    workload: str,
    sizes: list[int],
    fields_at: Callable[[int], list[Field]],
    setup: Callable[[int, dict[str, str]], Callable[[], None]],
    topo: Topology,
    usable: dict[str, str],
    iters: int,
    rng: random.Random,
) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        at = {"workload": workload, "size": size}
        fields = fields_at(size)
        steps: dict[str, Callable[[], None]] = {}
        predicted: dict[str, float] = {}
        for name, tiers in placements(fields, topo, usable).items():
            try:
                predicted[name] = price(fields, topo, {f: usable[t] for f, t in tiers.items()}).predicted_s
            except CapacityError as e:
                rows.append({**at, "system": name, "oom": True, "seconds": None, "error": str(e)[:160]})
                print(f"   {workload} size {size}: {name} out of memory (simulated budget)", flush=True)
                continue
            steps[name] = setup(size, tiers)
            for _ in range(3):  # warm-up (the setup already wrote every slot once)
                steps[name]()
        times = script.interleaved({n: script.timed(f) for n, f in steps.items()}, iters, rng)
        for name in steps:
            med = statistics.median(times[name])
            rows.append(
                {
                    **at,
                    "system": name,
                    "oom": False,
                    "seconds": med,
                    "iteration_s": times[name],
                    "predicted_s": predicted[name],
                    "placement": placements(fields, topo, usable)[name],
                }
            )
            print(
                f"   {workload} size {size:>6}: {name:<18} {med * 1e3:9.3f} ms/iter measured, "
                f"{predicted[name] * 1e3:9.3f} ms predicted",
                flush=True,
            )
        del steps
    return rows


def gpu_predictions(dims: list[int], capacity: int, tokens: list[int], samples: int) -> list[dict[str, Any]]:
    """Named GPU placements and the planner priced on the described 8×H200 node (predictions only)."""
    topo = Topology.load(ROOT / "topologies" / "h200x8.toml")
    gpu, host = "node0/cuda:0", "node0/host"
    rows = []
    cases: list[tuple[str, int, list[Field]]] = []
    for dim in dims:  # DQN: env runners write from host; the learner reads on cuda:0
        fields = [
            Field(
                c.name,
                f.bytes_per_item,
                f.items,
                (Access(host, 32 / capacity),),
                (Access(gpu, 256 / capacity),),
            )
            for c, f in zip(dqn_schema(dim), dqn_fields(dim, capacity, {"host": "h"}), strict=True)
        ]
        cases.append(("dqn_replay", dim, fields))
    for n in tokens:  # GRPO: rollout writes from host; 8 data-parallel ranks each read one shard
        ranks = [f"node0/cuda:{g}" for g in range(8)]
        fields = [
            Field(name, samples * n * torch.empty((), dtype=dt).element_size(), 1, (Access(host, 1),),
                  tuple(Access(r, GRPO_READS[name] / 8) for r in ranks))
            for name, dt in GRPO_DTYPES.items()
        ]  # fmt: skip
        cases.append(("grpo_tq", n, fields))
    for workload, size, fields in cases:
        named: dict[str, Any] = {**{n: f for n, f in BASELINES.items()}, "planned": lambda fs, t: plan(fs, t)}
        for name, fn in named.items():
            at = {"workload": workload, "system": name, "size": size}
            try:
                p = fn(fields, topo)
                rows.append(
                    {
                        **at,
                        "predicted_s": p.predicted_s,
                        "prediction": "described 8xH200 topology (not measured)",
                    }
                )
            except CapacityError as e:
                rows.append(
                    {
                        **at,
                        "predicted_s": None,
                        "oom": True,
                        "error": str(e)[:160],
                        "prediction": "described 8xH200 topology",
                    }
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = script.parser(__doc__, quick="two sizes per workload, fewer iterations")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    prov = provenance.start()
    largest = sum(f.nbytes for f in dqn_fields(cfg["dims"][-1], cfg["capacity"], {"host": "h"}))
    host = int(0.6 * largest)
    topo = budgeted(local_topology(), host=host)
    usable = {k: v for k, v in usable_tiers(topo).items() if k in TIERS}
    print(f"== {topo.source}", flush=True)
    rng = random.Random(0)
    rows = sweep("dqn_replay", cfg["dims"], lambda d: dqn_fields(d, cfg["capacity"], usable),
                 lambda d, t: dqn_setup(d, cfg["capacity"], t), topo, usable, cfg["iters"], rng)  # fmt: skip
    rows += sweep("grpo_tq", cfg["tokens"], lambda n: grpo_fields(n, cfg["samples"], usable),
                  lambda n, t: grpo_setup(n, cfg["samples"], t), topo, usable, cfg["iters"], rng)  # fmt: skip
    summary: dict[str, Any] = {}
    for workload in ("dqn_replay", "grpo_tq"):
        pts = [r for r in rows if r["workload"] == workload and not r["oom"]]
        per_size = {}
        for size in sorted({r["size"] for r in pts}):
            here = {r["system"]: r["seconds"] for r in pts if r["size"] == size}
            best = min(here, key=here.__getitem__)
            per_size[str(size)] = {
                "best_measured": best,
                "planned_over_best": round(here["planned"] / here[best], 3) if "planned" in here else None,
                "spearman": spearman([r["predicted_s"] for r in pts if r["size"] == size],
                                     [r["seconds"] for r in pts if r["size"] == size]),
            }  # fmt: skip
        summary[workload] = {
            "spearman_all_points": spearman([r["predicted_s"] for r in pts], [r["seconds"] for r in pts]),
            "per_size": per_size,
            "oom": [(r["system"], r["size"]) for r in rows if r["workload"] == workload and r["oom"]],
        }
    predictions = gpu_predictions(cfg["dims"], cfg["capacity"], cfg["tokens"], cfg["samples"])
    result = {"host_budget": host, "rows": rows, "gpu_predictions": predictions, "summary": summary,
              "topology": topo.source, "machine": script.machine(prov)}  # fmt: skip
    figure = functools.partial(plot, rows, predictions)
    script.write_result("placement_ablation", args, result, figure, report_ops.placement_ablation)
    return 0


def plot(rows: list[dict[str, Any]], predictions: list[dict[str, Any]], path: Path) -> None:
    plt = script.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for ax, workload, xlabel in (
        (axes[0], "dqn_replay", "observation floats"),
        (axes[1], "grpo_tq", "tokens per response"),
    ):
        systems = sorted({r["system"] for r in rows if r["workload"] == workload})
        for name in systems:
            pts = [
                (r["size"], r["seconds"])
                for r in rows
                if r["workload"] == workload and r["system"] == name and not r["oom"]
            ]
            ax.plot(
                [p[0] for p in pts],
                [p[1] * 1e3 for p in pts],
                "o-" if name != "planned" else "D-",
                label=name,
                lw=2.5 if name == "planned" else 1,
            )
            for r in rows:
                if r["workload"] == workload and r["system"] == name and r["oom"]:
                    ax.annotate(f"{name}: OOM", (r["size"], ax.get_ylim()[1] * 0.8), fontsize=7, color="red")
        _log_log(ax, xlabel, "ms per iteration (measured)", f"{workload} (this machine)")
    ax = axes[2]
    for workload, marker in (("dqn_replay", "o"), ("grpo_tq", "s")):
        pts = [r for r in rows if r["workload"] == workload and not r["oom"]]
        ax.scatter(
            [r["predicted_s"] * 1e3 for r in pts],
            [r["seconds"] * 1e3 for r in pts],
            marker=marker,
            label=workload,
        )
    _log_log(ax, "predicted ms/iter", "measured ms/iter", "planner accuracy")
    ax = axes[3]
    gp = [r for r in predictions if r["workload"] == "grpo_tq" and r.get("predicted_s")]
    for name in sorted({r["system"] for r in gp}):
        pts = [(r["size"], r["predicted_s"]) for r in gp if r["system"] == name]
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], "o--", label=name)
    _log_log(ax, "tokens per response", "ms/iter (PREDICTED)", "grpo_tq on 8xH200: prediction only")
    script.save_figure(fig, path)


def _log_log(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=7)


if __name__ == "__main__":
    raise SystemExit(main())
