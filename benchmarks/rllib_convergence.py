"""Convergence, native RLlib vs Conduit: DQN and PPO on CartPole-v1, several seeds, one plot.

    python benchmarks/rllib_convergence.py [--seeds 3] [--max-steps 200000] [--target 450] [--out FILE]

Reports, per algorithm and system, the env steps each seed needed to reach a mean episode return of
``--target`` (``null`` if it never did) and writes every learning curve to JSON and one PNG.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _recipe(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, RECIPES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def curve(algo: str, conduit: bool, seed: int, max_steps: int, target: float) -> dict:
    mod = _recipe(f"rllib_{algo}")
    args = mod.Args(conduit=conduit, seed=seed, iters=10**6)
    built = mod.build(args)
    points, reached = [], None
    try:
        while True:
            r = built.train()
            steps = r["env_runners"].get("num_env_steps_sampled_lifetime", 0)
            ret = r["env_runners"].get("episode_return_mean")
            points.append((steps, ret))
            if reached is None and ret is not None and ret >= target:
                reached = steps
                break
            if steps >= max_steps:
                break
    finally:
        built.stop()
    return {
        "algo": algo,
        "system": "conduit" if conduit else "native",
        "seed": seed,
        "curve": points,
        "steps_to_target": reached,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=200_000)
    p.add_argument("--target", type=float, default=450.0)
    p.add_argument("--algos", default="dqn,ppo")
    p.add_argument("--out", default="benchmarks/results/rllib_convergence.json")
    a = p.parse_args()
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    runs = []
    for algo in a.algos.split(","):
        for seed in range(a.seeds):
            for conduit in (False, True):  # alternate native / Conduit per seed
                run = curve(algo, conduit, seed, a.max_steps, a.target)
                runs.append(run)
                print(
                    f"{algo} {run['system']:8s} seed={seed} steps_to_{a.target:g}={run['steps_to_target']}",
                    flush=True,
                )
    summary = {}
    for algo in a.algos.split(","):
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
    out.write_text(json.dumps({"target": a.target, "runs": runs, "summary": summary}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(a.algos.split(",")), figsize=(10, 4), squeeze=False)
    for ax, algo in zip(axes[0], a.algos.split(",")):
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
    ray.shutdown()


if __name__ == "__main__":
    main()
