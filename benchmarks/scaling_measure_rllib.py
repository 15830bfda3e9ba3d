"""One measured RLlib configuration of ``scaling.py --measure``: DQN on CartPole with one env runner per
Ray node (``nodes`` nodes of this machine, 127.0.0.1), native RLlib vs ``conduit_rllib.enable``, built
side by side and trained alternately (``rllib_iteration.run_workload``: the same timing wrappers on both,
work counted). Each node offers one ``native_slot`` and one ``conduit_slot``; each system's runners ask
for one of their own, so each system has exactly one runner on every node. Run in its own process::

    python benchmarks/scaling_measure_rllib.py --nodes 2 --out FILE [--iters 3] [--steps 400]
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
sys.path[:0] = [str(HERE.parent), str(HERE)]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # nodes bind 127.0.0.1 (local_ray.py)

import provenance  # noqa: E402

MIB = 2**20


def runner_nodes(algo: Any) -> list[str]:
    """The node of each remote env runner of ``algo``."""
    import ray

    return algo.env_runner_group.foreach_env_runner(
        lambda er: ray.get_runtime_context().get_node_id(), local_env_runner=False
    )


def measure(ids: list[str], iters: int, warmup: int, steps: int) -> dict[str, Any]:
    """On the connected cluster of nodes ``ids`` (each offering a ``native_slot`` and a ``conduit_slot``):
    ``warmup + iters`` alternating iterations of each system, one env runner per node each."""
    from rllib_iteration import Workload, make_config, run_workload
    from rllib_native_timing import PathTimer

    t0 = time.perf_counter()
    w = Workload("dqn", "CartPole-v1", 32)

    def config(slot: str) -> Any:
        return make_config(w, steps, seed=1).env_runners(
            num_env_runners=len(ids), num_cpus_per_env_runner=0, custom_resources_per_env_runner={slot: 1}
        )

    placed: dict[str, list[int]] = {}

    def extra(system: str, algo: Any) -> dict[str, Any]:
        if system not in placed:
            placed[system] = sorted(ids.index(n) for n in runner_nodes(algo))
        return {}

    rows = run_workload(w, iters, warmup, steps, "async", PathTimer(), make=lambda: config("conduit_slot"),
                        make_native=lambda: config("native_slot"), extra=extra)  # fmt: skip
    return {"nodes": len(ids), "rows": rows, "runner_nodes": placed, "steps_per_iteration": steps,
            "wall_s": time.perf_counter() - t0}  # fmt: skip


def run(nodes: int, iters: int, warmup: int, steps: int) -> dict[str, Any]:
    """A cluster of ``nodes`` nodes (``scaling_measure_tq.start_cluster``), :func:`measure`, shut down."""
    import ray
    import torch
    from scaling_measure_tq import start_cluster

    torch.set_num_threads(1)
    cluster, ids = start_cluster(nodes)
    try:
        return measure(ids, iters, warmup, steps)
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=400, help="env steps sampled per DQN iteration")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    tok = provenance.start()  # this configuration's commit and the load around it
    out = run(a.nodes, a.iters, a.warmup, a.steps)
    a.out.write_text(json.dumps(out | {"machine": provenance.finish(tok)}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
