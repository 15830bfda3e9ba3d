"""The RLlib half of one measured configuration of ``scaling.py --measure``: DQN on CartPole with one env
runner per Ray node (``nodes`` nodes of this machine, 127.0.0.1), native RLlib vs ``conduit_rllib.enable``,
built side by side and trained alternately (``rllib_iteration.run_workload``: the same timing wrappers on
both, work counted). Each node offers one ``native_slot`` and one ``conduit_slot``; each system's runners
ask for one of their own, so each system has exactly one runner on every node. Run on the cluster of the
configuration's TransferQueue measurement, after it, in its process (``scaling_measure_tq.py
--rllib-steps``; ``scaling_measure.run_config`` starts it).
"""

from __future__ import annotations

import time
from typing import Any


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
