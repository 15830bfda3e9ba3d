"""DQN on CartPole, native RLlib vs Conduit, side by side in one process (about a minute).

    ./dev demo [--seconds 60] [--out demo_results/] [--train-batch-size 32]
    python benchmarks/rllib_demo.py [same flags]        (with conduit-rl[rllib,bench] installed)

Both algorithms are built with the same seed and trained alternately, one iteration each (native,
Conduit, native, ...), so both see the same machine load. Per iteration it prints the wall time and
the exposed experience-path time: for native RLlib the replay buffer's add + sample + priority update,
the learner connector and minibatch iteration (wrapped methods, ``rllib_native_timing.py``); for Conduit
the time the training step was blocked in Conduit (``result["conduit"]["exposed_s"]``) plus any RLlib
minibatch iteration still on its path, and the iteration's work (env steps sampled, gradient updates,
module steps trained). Then medians and ratios (Conduit ÷ native) — refused ("—" and the reason) if the
two sides did different work; writes ``demo.json`` and ``demo.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cartpole  # noqa: E402
import provenance  # noqa: E402
from rllib_native_timing import PathTimer, SideBySide, ratio_or_refusal, work_totals  # noqa: E402


def dqn_config(train_batch_size: int, steps_per_iter: int, seed: int) -> Any:
    """The demo's DQN: learning from the first iteration's steps on."""
    return cartpole.dqn_config(train_batch_size, steps_per_iter, steps_per_iter, seed)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median wall and exposed seconds per system, work totals, and the ratios (Conduit ÷ native).

    A ratio is ``None`` with ``ratio_refused`` saying why when the two sides' work counters differ.
    """
    out: dict[str, Any] = {}
    for system in ("native", "conduit"):
        for metric in ("wall_s", "exposed_s"):
            vals = [r[metric] for r in rows if r["system"] == system]
            out[f"{system}_{metric}"] = statistics.median(vals) if vals else None
        out[f"{system}_work"] = work_totals(rows, system)
    out["ratio_refused"] = None
    for metric in ("wall_s", "exposed_s"):
        ratio, refused = ratio_or_refusal(
            out[f"native_{metric}"], out[f"conduit_{metric}"], out["native_work"], out["conduit_work"]
        )
        out[f"ratio_{metric.removesuffix('_s')}"] = ratio
        out["ratio_refused"] = out["ratio_refused"] or refused
    return out


def plot(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = {"native": "tab:blue", "conduit": "tab:orange"}
    for ax, metric, title in (
        (axes[0], "wall_s", "iteration wall time"),
        (axes[1], "exposed_s", "exposed experience-path time"),
    ):
        for system in ("native", "conduit"):
            sel = [r for r in rows if r["system"] == system]
            ax.plot(
                [r["iteration"] for r in sel],
                [r[metric] for r in sel],
                "o-",
                color=colors[system],
                label=system,
            )
        ratio = summary.get(f"ratio_{metric.removesuffix('_s')}")
        ax.set_title(f"{title}" + (f" (median ratio {ratio:.3f})" if ratio is not None else ""), fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel("seconds")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("DQN CartPole-v1: native RLlib vs Conduit, alternating iterations", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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

    t_start = time.perf_counter()
    started_ray = False
    if not ray.is_initialized():
        torch.set_num_threads(1)
        init_local_ray(log_to_driver=False)
        started_ray = True
    print(f"building native and Conduit DQN (CartPole-v1, train batch {train_batch_size}) ...", flush=True)
    pair = SideBySide(lambda: dqn_config(train_batch_size, steps_per_iter, seed), overlap, PathTimer())
    rows: list[dict[str, Any]] = []
    print(
        f"{'iter':>4s}  {'system':8s} {'wall s':>8s} {'exposed s':>10s} {'updates':>7s} {'return':>7s}   elapsed",
        flush=True,
    )
    it = -1  # iteration -1 fills the replay buffers (no learning yet) and is not measured
    try:
        while True:
            for system in ("native", "conduit"):
                result, wall, exposed, _, work = pair.train(system)
                ret = result["env_runners"].get("episode_return_mean")
                elapsed = time.perf_counter() - t_start
                tag = "warm-up" if it < 0 else f"{it:4d}"
                print(
                    f"{tag:>4s}  {system:8s} {wall:8.3f} {exposed:10.4f} {work['gradient_updates']:7d} {ret if ret is not None else float('nan'):7.1f}"
                    f"   [{elapsed:5.1f}s / {seconds:g}s]",
                    flush=True,
                )
                if it >= 0:
                    rows.append(
                        {
                            "iteration": it,
                            "system": system,
                            "wall_s": wall,
                            "exposed_s": exposed,
                            **work,
                            "return_mean": ret,
                        }
                    )
            it += 1
            out_of_time = time.perf_counter() - t_start >= seconds
            if it >= 1 and (out_of_time or (max_iters is not None and it >= max_iters)):
                break  # (at least one measured pair, whatever the budget)
    finally:
        pair.stop()
        if started_ray:
            ray.shutdown()
    summary = summarize(rows)
    report = {
        "workload": {
            "algo": "DQN",
            "env": "CartPole-v1",
            "train_batch_size": train_batch_size,
            "steps_per_iteration": steps_per_iter,
            "overlap": overlap,
            "seed": seed,
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), **provenance.finish(prov)},
        "rows": rows,
        "summary": summary,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(report, indent=1))
    plot(rows, summary, out / "demo.png")

    def fmt(v: float | None, spec: str) -> str:
        return format(v, spec) if v is not None else "—"

    print(f"\nmedians over {len(rows) // 2} iteration pairs:")
    print(f"{'':10s} {'native':>10s} {'Conduit':>10s} {'ratio':>7s}")
    for metric, label, ratio in (
        ("wall_s", "wall s", "ratio_wall"),
        ("exposed_s", "exposed s", "ratio_exposed"),
    ):
        print(
            f"{label:10s} {fmt(summary[f'native_{metric}'], '10.4f')} {fmt(summary[f'conduit_{metric}'], '10.4f')} "
            f"{fmt(summary[ratio], '7.3f'):>7s}"
        )
    for key in ("env_steps_sampled", "gradient_updates", "module_steps_trained"):
        print(f"{key:22s} native {summary['native_work'][key]:8d}  Conduit {summary['conduit_work'][key]:8d}")
    if summary["ratio_refused"]:
        print(f"ratio refused: {summary['ratio_refused']}")
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
