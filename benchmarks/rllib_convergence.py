"""Learning is preserved: DQN on CartPole-v1, native RLlib vs Conduit async and sync, several seeds.

    python benchmarks/rllib_convergence.py [--seeds 3] [--target 100]
        [--max-env-steps 15000] [--max-seconds-per-run 600] [--quick] [--out FILE]

Per seed, native RLlib, Conduit async and Conduit sync train with the same seed, one after the other;
each run records the env steps it needed to reach a mean return of ``--target`` (``null`` if not within
``--max-env-steps``; a run stopped by ``--max-seconds-per-run`` is flagged ``stopped_by: "time"``), its
learning curve, wall and exposed time per iteration (as in ``rllib_iteration.py``) and its work. One PNG
plots the curves. Method: ``benchmarks/notes/rllib_convergence.md``. Defaults take at most about 35
minutes on 2 cores; ``--quick`` (one seed, 2,000 env steps) checks the pipeline, not learning.
"""

from __future__ import annotations

import functools
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_tables  # noqa: E402
import script  # noqa: E402
from rllib_native_timing import WORK_KEYS, PathTimer, WorkCounter, install, timed_train  # noqa: E402

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SYSTEMS = ("native", "conduit-async", "conduit-sync")
COLORS = {"native": "tab:blue", "conduit-async": "tab:orange", "conduit-sync": "tab:green"}


def _recipe(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, RECIPES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _build(system: str, seed: int, quick: bool) -> Any:
    mod = _recipe("rllib_dqn")
    kw: dict[str, Any] = {"conduit": system != "native", "seed": seed, "iters": 10**6}
    steps, starts = (250, 250) if quick else (500, 1000)
    kw.update(steps_per_iter=steps, learning_starts=starts)
    if system != "native":
        kw["overlap"] = system.removeprefix("conduit-")
    return mod.build(mod.Args(**kw))


def run(
    system: str,
    seed: int,
    target: float,
    max_steps: int,
    max_seconds: float,
    quick: bool,
    timer: PathTimer,
    wrap_buffer: Any,
) -> dict[str, Any]:
    """Train one seed until ``target``, ``max_steps`` env steps or ``max_seconds``; the run's record."""
    built = _build(system, seed, quick)
    wrap_buffer(built)
    counter = WorkCounter(built)
    curve: list[dict[str, Any]] = []
    reached, stopped_by = None, "steps"
    t0 = time.perf_counter()
    try:
        while True:
            result, wall, exposed, _ = timed_train(built, timer, conduit=system != "native")
            steps = int(result["env_runners"].get("num_env_steps_sampled_lifetime", 0))
            ret = result["env_runners"].get("episode_return_mean")
            curve.append(
                {"env_steps": steps, "return_mean": ret, "wall_s": wall, "exposed_s": exposed}
                | counter.take(result)
            )
            if ret is not None and ret >= target:
                reached, stopped_by = steps, "target"
                break
            if steps >= max_steps:
                break
            if time.perf_counter() - t0 >= max_seconds:
                stopped_by = "time"
                break
    finally:
        built.stop()
    return {
        "algo": "dqn",
        "system": system,
        "seed": seed,
        "steps_to_target": reached,
        "stopped_by": stopped_by,
        "wall_s": sum(p["wall_s"] for p in curve),
        "exposed_s": sum(p["exposed_s"] for p in curve),
        "work": {k: sum(p[k] for p in curve) for k in WORK_KEYS},
        "curve": curve,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per system: median steps to target over the seeds that reached it, and medians of time and work."""
    out: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(r["system"] for r in runs):
        sel = [r for r in runs if r["system"] == system]
        hits = [r["steps_to_target"] for r in sel if r["steps_to_target"] is not None]
        its = [p for r in sel for p in r["curve"]]
        out[system] = {
            "median_steps_to_target": statistics.median(hits) if hits else None,
            "reached": len(hits),
            "runs": len(sel),
            "steps_to_target": [r["steps_to_target"] for r in sel],
            "median_iteration_wall_s": statistics.median(p["wall_s"] for p in its),
            "median_iteration_exposed_s": statistics.median(p["exposed_s"] for p in its),
            "gradient_updates_per_env_step": sum(r["work"]["gradient_updates"] for r in sel)
            / max(1, sum(r["work"]["env_steps_sampled"] for r in sel)),
        }
    return out


def plot(runs: list[dict[str, Any]], target: float, title: str, path: Path) -> None:
    fig, ax = script.pyplot().subplots(figsize=(7, 4.5))
    for r in runs:
        pts = [(p["env_steps"], p["return_mean"]) for p in r["curve"] if p["return_mean"] is not None]
        ax.plot(
            [s for s, _ in pts],
            [v for _, v in pts],
            color=COLORS[r["system"]],
            alpha=0.8,
            marker="o",
            ms=2,
            label=f"{r['system']} seed {r['seed']}",
        )
    ax.axhline(target, color="gray", lw=0.8, ls="--")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    ax.legend(fontsize=6, ncol=3)
    script.save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = script.parser(__doc__, quick="1 seed, 2,000 env steps, small batches")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--target", type=float, default=100.0, help="mean episode return to reach")
    p.add_argument("--max-env-steps", type=int, default=15_000, help="env-step budget per run")
    p.add_argument("--max-seconds-per-run", type=float, default=600.0, help="safety net per run")
    a = p.parse_args(argv)
    prov = provenance.start()
    if a.quick:
        a.seeds, a.max_env_steps = 1, min(a.max_env_steps, 2_000)
    import ray
    import torch
    from conduit_rllib.local_ray import init_local_ray

    torch.set_num_threads(1)
    started = not ray.is_initialized()
    if started:
        init_local_ray(log_to_driver=False)
    timer = PathTimer()
    wrap_buffer = install(timer)
    runs = []
    try:
        for seed in range(a.seeds):
            for system in SYSTEMS:  # systems alternate within each seed
                r = run(
                    system,
                    seed,
                    a.target,
                    a.max_env_steps,
                    a.max_seconds_per_run,
                    a.quick,
                    timer,
                    wrap_buffer,
                )
                runs.append(r)
                print(
                    f"dqn {system:13s} seed={seed} steps_to_{a.target:g}={r['steps_to_target']} "
                    f"stopped_by={r['stopped_by']} wall={r['wall_s']:.1f}s exposed={r['exposed_s']:.1f}s "
                    f"updates={r['work']['gradient_updates']}",
                    flush=True,
                )
    finally:
        if started:
            ray.shutdown()
    summary = summarize(runs)
    settings = {
        "algo": "dqn",
        "env": "CartPole-v1",
        "target": a.target,
        "seeds": a.seeds,
        "max_env_steps": a.max_env_steps,
        "max_seconds_per_run": a.max_seconds_per_run,
    }
    report = {**settings, "machine": script.machine(prov), "summary": summary, "runs": runs}
    title = f"DQN CartPole-v1: native RLlib vs Conduit, {a.seeds} seed(s), target {a.target:g}"
    figure = functools.partial(plot, runs, a.target, title)
    script.write_result("rllib_convergence_dqn", a, report, figure, report_tables.rllib_convergence)
    return report


if __name__ == "__main__":
    main()
