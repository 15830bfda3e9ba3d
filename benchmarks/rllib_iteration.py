"""RLlib iteration time, native vs Conduit, alternating iteration by iteration (A B A B) in one run.

    python benchmarks/rllib_iteration.py [--quick] [--env ID] [--algo dqn|ppo]
        [--train-batch-size N] [--iters N] [--overlap sync|async] [--out FILE]

Per iteration: wall time and exposed experience-path time, both systems timed by the same wrappers
(``rllib_native_timing.py``; the plugin's own ``conduit/exposed_s`` kept as
``conduit_reported_exposed_s``), and the work (env steps, gradient updates, module steps). Ratios
(Conduit ÷ native, medians) are refused unless the work is equal; the median wall per gradient update is
shown beside. Conduit DQN's staleness is measured beside (``rllib_staleness.py``). Method:
``benchmarks/notes/rllib_iteration.md``. JSON rows and a PNG of the ratios per workload; ``--quick`` is a
smoke run writing to /tmp unless ``--out``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_tables  # noqa: E402
import rllib_staleness  # noqa: E402
import script  # noqa: E402
from rllib_native_timing import PathTimer, SideBySide, ratio_or_refusal, work_totals  # noqa: E402

MA_ENV = "MultiAgentCartPole"


@dataclass(frozen=True)
class Workload:
    algo: str
    env: str
    train_batch_size: int

    @property
    def name(self) -> str:
        return f"{self.algo} {self.env} b{self.train_batch_size}"


DEFAULT_SWEEP = [
    Workload("dqn", "CartPole-v1", 32),
    Workload("dqn", "CartPole-v1", 256),
    Workload("dqn", "MountainCar-v0", 32),
    Workload("dqn", MA_ENV, 32),
    Workload("ppo", "CartPole-v1", 4000),
    Workload("ppo", MA_ENV, 4000),
]


def make_config(w: Workload, steps_per_iter: int, seed: int):  # noqa: ANN201
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    if w.algo == "dqn":
        cfg = DQNConfig().training(
            train_batch_size=w.train_batch_size, num_steps_sampled_before_learning_starts=steps_per_iter
        )
        cfg = cfg.reporting(min_sample_timesteps_per_iteration=steps_per_iter)
    else:
        cfg = PPOConfig().training(train_batch_size=w.train_batch_size, minibatch_size=128, num_epochs=30)
    cfg = cfg.env_runners(num_env_runners=0).debugging(seed=seed)
    if w.env == MA_ENV:
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
        from ray.tune.registry import register_env

        register_env(MA_ENV, lambda c: MultiAgentCartPole({"num_agents": 2}))
        cfg = cfg.environment(MA_ENV).multi_agent(
            policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **k: f"p{aid}"
        )
        if w.algo == "dqn":  # RLlib's single-agent episode buffer cannot sample multi-agent episodes
            cfg = cfg.training(
                replay_buffer_config={
                    "type": "MultiAgentPrioritizedEpisodeReplayBuffer",
                    "capacity": 50_000,
                    "alpha": 0.6,
                    "beta": 0.4,
                }
            )
    else:
        cfg = cfg.environment(w.env)
    return cfg


def run_workload(
    w: Workload,
    iters: int,
    warmup: int,
    steps: int,
    overlap: str,
    timer: PathTimer,
    make: Callable[[], Any] | None = None,
    make_native: Callable[[], Any] | None = None,
    extra: Callable[[str, Any], dict] | None = None,
    seconds: float | None = None,
) -> list[dict]:
    """``warmup + iters`` alternating iterations of ``w`` (built by ``make()``, default :func:`make_config`;
    native's by ``make_native()`` where given), native then Conduit; one row per measured iteration and
    system, with its work and ``extra(system, algo)``'s fields (e.g. memory), printed after the work.
    ``seconds``: a time budget, building included; the run stops after the first measured pair past it."""
    t0 = time.perf_counter()
    build = make or (lambda: make_config(w, steps, seed=1))
    pair = SideBySide(build, overlap, timer, make_native=make_native)
    probe = rllib_staleness.StalenessProbe(pair.algos["conduit"]) if w.algo == "dqn" else None
    rows = []
    try:
        for it in range(warmup + iters):
            for system in ("native", "conduit"):
                result, wall, exposed, parts, work = pair.train(system)
                more = extra(system, pair.algos[system]) if extra is not None else {}
                stale: dict = {}
                if system == "conduit":
                    stale["conduit_reported_exposed_s"] = result["conduit"]["exposed_s"]
                    if probe is not None:
                        age, delay = probe.take()
                        stale["priority_age_hist"], stale["staging_delay_hist"] = age, delay
                if it < warmup:
                    continue
                rows.append(
                    {
                        "algo": w.algo,
                        "env": w.env,
                        "train_batch_size": w.train_batch_size,
                        "system": system,
                        "iteration": it - warmup,
                        "wall_s": wall,
                        "exposed_s": exposed,
                        **work,
                        **more,
                        **stale,
                        "path_parts": parts,
                        "return_mean": result["env_runners"].get("episode_return_mean"),
                    }
                )
                print(
                    f"{w.name:32s} {system:8s} it={it - warmup} wall={wall:.3f}s exposed={exposed:.4f}s "
                    f"env_steps={work['env_steps_sampled']} updates={work['gradient_updates']} "
                    f"module_steps={work['module_steps_trained']}"
                    + "".join(
                        f" {k}={v:g}" if isinstance(v, float) else f" {k}={v}" for k, v in more.items()
                    ),
                    flush=True,
                )
            if seconds is not None and it >= warmup and time.perf_counter() - t0 >= seconds:
                break
    finally:
        pair.stop()
    return rows


def _per_update(sel: list[dict], system: str) -> float | None:
    """Median wall seconds per gradient update over ``system``'s rows that made updates."""
    vals = [
        r["wall_s"] / r["gradient_updates"] for r in sel if r["system"] == system and r["gradient_updates"]
    ]
    return statistics.median(vals) if vals else None


def _staleness(sel: list[dict], key: str) -> dict | None:
    """Conduit's pooled staleness histogram ``key`` over the workload's rows, summarized."""
    return rllib_staleness.summary(
        rllib_staleness.pooled(r.get(key) for r in sel if r["system"] == "conduit")
    )


def ratios(rows: list[dict]) -> dict[str, dict]:
    """Per workload: medians side by side, work totals, the ratios (or why they are refused), and
    Conduit's measured priority age and staging delay (pooled over the measured iterations)."""
    out: dict[str, dict] = {}
    keys = sorted({(r["algo"], r["env"], r["train_batch_size"]) for r in rows})
    for algo, env, tb in keys:
        sel = [r for r in rows if (r["algo"], r["env"], r["train_batch_size"]) == (algo, env, tb)]
        med = {
            (s, m): statistics.median(r[m] for r in sel if r["system"] == s)
            for s in ("native", "conduit")
            for m in ("wall_s", "exposed_s")
        }
        work_n, work_c = work_totals(sel, "native"), work_totals(sel, "conduit")
        wall, refused = ratio_or_refusal(
            med[("native", "wall_s")], med[("conduit", "wall_s")], work_n, work_c
        )
        exposed, _ = ratio_or_refusal(
            max(med[("native", "exposed_s")], 1e-9), med[("conduit", "exposed_s")], work_n, work_c
        )
        out[f"{algo} {env} b{tb}"] = {
            "native_wall_s": med[("native", "wall_s")],
            "conduit_wall_s": med[("conduit", "wall_s")],
            "native_exposed_s": med[("native", "exposed_s")],
            "conduit_exposed_s": med[("conduit", "exposed_s")],
            "native_work": work_n,
            "conduit_work": work_c,
            "ratio_wall": wall,
            "ratio_exposed": exposed,
            "ratio_refused": refused,
            "native_wall_s_per_update": _per_update(sel, "native"),
            "conduit_wall_s_per_update": _per_update(sel, "conduit"),
            "conduit_priority_age_updates": _staleness(sel, "priority_age_hist"),
            "conduit_staging_delay_transitions": _staleness(sel, "staging_delay_hist"),
        }
    return out


def targets_met(rat: dict[str, Any], targets: dict[str, float]) -> dict[str, bool | None]:
    """Per target (``ratio_* -> at most``): met, missed, or None where the ratio was refused."""
    return {k: None if rat[k] is None else rat[k] <= limit for k, limit in targets.items()}


def record(
    mach: dict[str, Any],
    settings: dict[str, Any],
    rows: list[dict],
    rat: dict[str, Any],
    targets: dict[str, float],
) -> dict[str, Any]:
    """The result file of one workload's side-by-side run: ``machine``, settings, rows, ratios and targets."""
    return {
        "machine": mach,
        "settings": settings,
        "rows": rows,
        "ratios": rat,
        "targets": targets,
        "targets_met": targets_met(rat, targets),
    }


def plot_side_by_side(
    rows: list[dict[str, Any]],
    rat: dict[str, Any],
    targets: dict[str, float | None],
    panels: tuple[tuple[str, str], ...],
    title: str,
    path: Path,
) -> None:
    """One workload's PNG: per-iteration ``panels`` (row key, title) of both systems, then the median
    ratios Conduit ÷ native (``targets``' keys) against their targets where given (a refused ratio drawn
    as 0, labelled refused)."""
    fig, axes = script.pyplot().subplots(1, len(panels) + 1, figsize=(4 * len(panels) + 4, 3.8))
    for ax, (metric, label) in zip(axes, panels):
        for system, color in (("native", "tab:blue"), ("conduit", "tab:orange")):
            sel = [r for r in rows if r["system"] == system]
            ax.plot([r["iteration"] for r in sel], [r[metric] for r in sel], "o-", color=color, label=system)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    ax = axes[len(panels)]
    keys = list(targets)
    vals = [rat[k] if rat[k] is not None else 0.0 for k in keys]
    ax.bar(range(len(keys)), vals, 0.5, color=["tab:green", "tab:purple"])
    for i, k in enumerate(keys):
        if targets[k] is not None:
            ax.hlines(targets[k], i - 0.35, i + 0.35, colors="red", linestyles="--")
        ax.text(i, vals[i], "refused" if rat[k] is None else f"{vals[i]:.3f}", ha="center", va="bottom")
    ax.set_xticks(range(len(keys)), [k.removeprefix("ratio_") for k in keys])
    red = " (red: target)" if any(t is not None for t in targets.values()) else ""
    ax.set_title(f"median ratio Conduit ÷ native{red}", fontsize=9)
    fig.suptitle(title, fontsize=10)
    script.save_figure(fig, path)


def plot(rat: dict[str, dict], path: Path) -> None:
    names = [n for n in rat if rat[n]["ratio_wall"] is not None]  # refused ratios are not plotted
    x = range(len(names))
    fig, ax = script.pyplot().subplots(figsize=(max(6, 1.6 * len(names)), 4))
    ax.bar(
        [i - 0.2 for i in x],
        [rat[n]["ratio_wall"] for n in names],
        0.4,
        label="end-to-end (Conduit ÷ native)",
    )
    ax.bar(
        [i + 0.2 for i in x],
        [rat[n]["ratio_exposed"] for n in names],
        0.4,
        label="exposed path (Conduit ÷ native)",
    )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("median ratio")
    ax.legend(fontsize=8)
    script.save_figure(fig, path, dpi=120)


def main() -> None:
    p = script.parser(__doc__, quick="few, short iterations (a smoke run, to /tmp)")
    p.add_argument("--env", default=None)
    p.add_argument("--algo", choices=["dqn", "ppo"], default=None)
    p.add_argument("--train-batch-size", type=int, default=None)
    p.add_argument("--iters", type=int, default=None, help="measured iterations per system")
    p.add_argument("--overlap", choices=["sync", "async"], default="async")
    a = p.parse_args()
    if a.out is None and a.quick:  # a smoke run never overwrites results
        a.out = Path("/tmp/rllib_iteration_quick.json")
    prov = provenance.start()

    torch.set_num_threads(1)
    import ray
    from conduit_rllib.local_ray import init_local_ray

    init_local_ray(log_to_driver=False)
    sweep = DEFAULT_SWEEP
    if a.algo or a.env or a.train_batch_size:
        algo = a.algo or "dqn"
        tb = a.train_batch_size or (32 if algo == "dqn" else 4000)
        sweep = [Workload(algo, a.env or "CartPole-v1", tb)]
    if a.quick:
        sweep = [Workload(w.algo, w.env, min(w.train_batch_size, 1000)) for w in sweep]
    iters = a.iters or (3 if a.quick else 10)
    steps = 200 if a.quick else 1000
    timer = PathTimer()
    rows = []
    for w in sweep:
        rows += run_workload(w, iters, warmup=1, steps=steps, overlap=a.overlap, timer=timer)
    rat = ratios(rows)
    mach = script.machine(
        prov,
        overlap=a.overlap,
        settings={
            "dqn_env_steps_per_iteration": steps,
            "train_batch_sizes": {w.name: w.train_batch_size for w in sweep},
            "measured_iterations": iters,
            "warmup_iterations": 1,
            "exposed_timing": "benchmark wrappers on both systems (rllib_native_timing.install(conduit=True))",
        },
    )
    doc = {"machine": mach, "rows": rows, "ratios": rat}
    script.write_result("rllib_iteration", a, doc, lambda png: plot(rat, png), report_tables.rllib_iteration)
    ray.shutdown()


if __name__ == "__main__":
    main()
