"""DQN on CartPole, native RLlib vs Conduit, side by side in one process (about a minute).

    ./dev demo [--seconds 60] [--out demo_results/] [--train-batch-size 32]
    python benchmarks/rllib_demo.py [same flags]        (with conduit-rl[rllib,bench] installed)

Both algorithms are built with the same seed and trained alternately, one iteration each, through
``rllib_iteration.run_workload`` on a time budget. Per iteration it prints the wall time, the exposed
experience-path time (both systems timed by the same wrappers, ``rllib_native_timing.py``) and the work;
then the medians and ratios (Conduit ÷ native), refused if the work differs. Writes ``demo.json`` and
``demo.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cartpole  # noqa: E402
import provenance  # noqa: E402
import report_rllib  # noqa: E402
import rllib_iteration  # noqa: E402
import script  # noqa: E402
from rllib_native_timing import PathTimer  # noqa: E402

PANELS = (("wall_s", "iteration wall time (s)"), ("exposed_s", "exposed experience-path time (s)"))


def run(
    seconds: float,
    out: Path,
    train_batch_size: int = 32,
    steps_per_iter: int = 200,
    overlap: str = "async",
    seed: int = 1,
    max_iters: int | None = None,
) -> dict[str, Any]:
    """Alternate native / Conduit iterations until ``seconds`` have passed; write JSON and PNG to ``out``."""
    prov = provenance.start()
    import ray
    import torch
    from conduit_rllib.local_ray import init_local_ray

    started_ray = not ray.is_initialized()
    if started_ray:
        torch.set_num_threads(1)
        init_local_ray(log_to_driver=False)
    w = rllib_iteration.Workload("dqn", "CartPole-v1", train_batch_size)
    print(f"building native and Conduit DQN (CartPole-v1, train batch {train_batch_size}) ...", flush=True)
    try:  # iteration 0 fills the replay buffers (learning starts after its steps) and is not measured
        rows = rllib_iteration.run_workload(
            w,
            max_iters or 10**9,
            warmup=1,
            steps=steps_per_iter,
            overlap=overlap,
            timer=PathTimer(),
            make=lambda: cartpole.dqn_config(train_batch_size, steps_per_iter, steps_per_iter, seed),
            seconds=seconds,
        )
    finally:
        if started_ray:
            ray.shutdown()
    summary = rllib_iteration.ratios(rows)[w.name]
    workload = {"algo": "DQN", "env": "CartPole-v1", "train_batch_size": train_batch_size}
    workload |= {"steps_per_iteration": steps_per_iter, "overlap": overlap, "seed": seed}
    report = {"workload": workload, "machine": script.machine(prov), "rows": rows, "summary": summary}
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(report, indent=1))
    title = "DQN CartPole-v1: native RLlib vs Conduit, alternating iterations"
    targets = {"ratio_wall": None, "ratio_exposed": None}
    rllib_iteration.plot_side_by_side(rows, summary, targets, PANELS, title, out / "demo.png")
    print(f"\nmedians and ratios over {len(rows) // 2} iteration pairs:")
    script.show(report_rllib.rllib_mujoco({"ratios": summary}))
    print(f"wrote {out / 'demo.json'} and {out / 'demo.png'}", flush=True)
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="time budget, building included")
    p.add_argument("--out", default="demo_results", help="folder for demo.json and demo.png")
    p.add_argument("--train-batch-size", type=int, default=32)
    p.add_argument("--steps-per-iter", type=int, default=200, help="env steps per iteration")
    p.add_argument("--overlap", choices=["sync", "async"], default="async")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-iters", type=int, default=None, help="stop after this many iteration pairs")
    a = p.parse_args(argv)
    return run(a.seconds, Path(a.out), a.train_batch_size, a.steps_per_iter, a.overlap, a.seed, a.max_iters)


if __name__ == "__main__":
    main()
