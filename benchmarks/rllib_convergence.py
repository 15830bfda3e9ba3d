"""Convergence, native RLlib vs Conduit: DQN and PPO on CartPole-v1, several seeds, one plot.

    python benchmarks/rllib_convergence.py [--algo dqn|ppo|both] [--seeds 3] [--max-env-steps 200000]
        [--target 450] [--max-seconds-per-run S] [--quick] [--out FILE]

Reports, per algorithm and system, the env steps each seed needed to reach a mean episode return of
``--target`` (``null`` if it never did) and writes every learning curve to JSON and one PNG. Native
and Conduit runs alternate seed by seed. Each run stops at the target, at ``--max-env-steps`` or after
``--max-seconds-per-run``, so the whole run is bounded by
``algos x seeds x 2 x max-seconds-per-run``. ``--quick``: one seed, a few thousand env steps, small
batches (a smoke run that checks the pipeline, not convergence).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _recipe(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, RECIPES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def curve(
    algo: str, conduit: bool, seed: int, max_steps: int, target: float, max_seconds: float, quick: bool
) -> dict:
    mod = _recipe(f"rllib_{algo}")
    small = {}
    if quick:
        small = (
            {"steps_per_iter": 250, "learning_starts": 250}
            if algo == "dqn"
            else {"train_batch_size": 500, "minibatch_size": 100, "num_epochs": 4}
        )
    args = mod.Args(conduit=conduit, seed=seed, iters=10**6, **small)
    built = mod.build(args)
    points, reached = [], None
    t0 = time.perf_counter()
    try:
        while True:
            r = built.train()
            steps = r["env_runners"].get("num_env_steps_sampled_lifetime", 0)
            ret = r["env_runners"].get("episode_return_mean")
            points.append((steps, ret))
            if reached is None and ret is not None and ret >= target:
                reached = steps
                break
            if steps >= max_steps or time.perf_counter() - t0 >= max_seconds:
                break
    finally:
        built.stop()
    return {
        "algo": algo,
        "system": "conduit" if conduit else "native",
        "seed": seed,
        "curve": points,
        "steps_to_target": reached,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=["dqn", "ppo", "both"], default="both")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-env-steps", type=int, default=200_000)
    p.add_argument("--max-seconds-per-run", type=float, default=3600.0)
    p.add_argument("--target", type=float, default=450.0)
    p.add_argument("--quick", action="store_true", help="1 seed, 2,000 env steps, small batches")
    p.add_argument("--out", default="benchmarks/results/rllib_convergence.json")
    a = p.parse_args()
    prov = provenance.start()
    if a.quick:
        a.seeds = 1
        a.max_env_steps = min(a.max_env_steps, 2_000)
    algos = ["dqn", "ppo"] if a.algo == "both" else [a.algo]
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    runs = []
    for algo in algos:
        for seed in range(a.seeds):
            for conduit in (False, True):  # alternate native / Conduit per seed
                run = curve(algo, conduit, seed, a.max_env_steps, a.target, a.max_seconds_per_run, a.quick)
                runs.append(run)
                print(
                    f"{algo} {run['system']:8s} seed={seed} steps_to_{a.target:g}={run['steps_to_target']}",
                    flush=True,
                )
    summary = {}
    for algo in algos:
        for system in ("native", "conduit"):
            hits = [r["steps_to_target"] for r in runs if r["algo"] == algo and r["system"] == system]
            ok = [h for h in hits if h is not None]
            summary[f"{algo} {system}"] = {
                "median_steps": statistics.median(ok) if ok else None,
                "reached": len(ok),
                "runs": len(hits),
            }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "target": a.target,
        "seeds": a.seeds,
        "max_env_steps": a.max_env_steps,
        "max_seconds_per_run": a.max_seconds_per_run,
        "quick": a.quick,
    }
    machine = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        **provenance.finish(prov),
    }
    out.write_text(json.dumps({**settings, "machine": machine, "runs": runs, "summary": summary}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(algos), figsize=(5 * len(algos), 4), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        for r in (r for r in runs if r["algo"] == algo):
            xs = [s for s, v in r["curve"] if v is not None]
            ys = [v for s, v in r["curve"] if v is not None]
            ax.plot(
                xs,
                ys,
                color="tab:blue" if r["system"] == "native" else "tab:orange",
                alpha=0.7,
                label=f"{r['system']} seed {r['seed']}",
            )
        ax.axhline(a.target, color="gray", lw=0.8)
        ax.set_title(f"{algo.upper()} CartPole-v1")
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean episode return")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(json.dumps(summary, indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    ray.shutdown()


if __name__ == "__main__":
    main()
