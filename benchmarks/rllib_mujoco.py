"""MuJoCo PPO (Meta-World MT1 ``reach-v3``; gymnasium's HalfCheetah-v5), native RLlib vs Conduit at
equal gradient updates.

    python benchmarks/rllib_mujoco.py [--quick] [--env metaworld:reach-v3 | HalfCheetah-v5]
        [--env-runners 2] [--train-batch-size 4000] [--minibatch-size 256] [--num-epochs 10]
        [--iters 10] [--overlap sync|async] [--out FILE]

Needs the ``mujoco`` extra. ``--env metaworld:<task>`` is Meta-World's MT1 task (:func:`register_metaworld`);
any other ``--env`` is a gymnasium id. Native RLlib PPO and PPO through ``conduit_rllib.enable`` (GAE at
ingestion, minibatches by ``get_epochs``) alternate iteration by iteration in one process through
``rllib_iteration.run_workload`` (same timing wrappers, work counters per row; a ratio is refused when any
counter differs). Targets: exposed ≤ 0.3×, wall ≤ 1.0×. Method: ``benchmarks/notes/rllib_mujoco.md``.
Writes the JSON (with provenance and the env's versions) and a PNG; ``--quick`` (1,000 steps, 2 epochs,
3 iterations) is a smoke run writing to /tmp unless ``--out``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_rllib  # noqa: E402
import rllib_iteration  # noqa: E402
import script  # noqa: E402
from rllib_native_timing import PathTimer  # noqa: E402

NAME = "rllib_mujoco"
TARGETS = {"ratio_exposed": 0.3, "ratio_wall": 1.0}  # Conduit ÷ native, at most
ENV = "metaworld:reach-v3"
METAWORLD = "metaworld:"  # --env metaworld:<task>: Meta-World's MT1 task <task>


def register_metaworld(task: str) -> str:
    """Registers Meta-World's MT1 ``task`` with RLlib (``ray.tune.registry``) and returns its name,
    ``metaworld-mt1-<task>``; the creator's ``env_config["seed"]`` seeds MT1's goal positions and the env.

    The creator is ``gym.make("Meta-World/MT1", env_name=task, seed=seed)`` with the observation space
    Meta-World reports once a task is set: its env is built goal-hidden (0 bounds on the goal's 3
    entries) and a reset sets one of MT1's tasks, which show the goal. The creator is a closure with its
    imports inside, so Ray pickles it by value for remote env runners."""
    from ray.tune.registry import register_env

    def create(config: Any) -> Any:
        import gymnasium as gym
        import metaworld  # noqa: F401  (registers Meta-World/MT1 with gymnasium)

        seed = config.get("seed")
        env = gym.make("Meta-World/MT1", env_name=task, seed=seed, disable_env_checker=True)
        env.reset(seed=seed)  # sets a task: the goal becomes observable
        env.observation_space = env.unwrapped.sawyer_observation_space
        return env

    name = f"metaworld-mt1-{task}"
    register_env(name, create)
    return name


def rllib_env(env: str, seed: int) -> tuple[str, dict[str, Any]]:
    """RLlib's env name and ``env_config`` for ``env``: ``metaworld:<task>`` registered by
    :func:`register_metaworld`, else a gymnasium id as it is."""
    if env.startswith(METAWORLD):
        return register_metaworld(env[len(METAWORLD) :]), {"seed": seed}
    return env, {}


def make_config(
    env: str = ENV,
    runners: int = 2,
    train_batch_size: int = 4000,
    minibatch_size: int = 256,
    num_epochs: int = 10,
    seed: int = 1,
    hiddens: list[int] | None = None,
    cpus_per_runner: float = 1.0,
) -> Any:
    """RLlib PPO on ``env`` (see :func:`rllib_env`) with ``runners`` remote env runners (0: the local
    one); ``hiddens`` the policy and value MLPs (None: RLlib's default)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    name, env_config = rllib_env(env, seed)
    cfg = (
        PPOConfig()
        .environment(name, env_config=env_config)
        .env_runners(num_env_runners=runners, num_cpus_per_env_runner=cpus_per_runner)
        .training(train_batch_size=train_batch_size, minibatch_size=minibatch_size, num_epochs=num_epochs)
        .debugging(seed=seed)
    )
    return cfg if hiddens is None else cfg.rl_module(model_config={"fcnet_hiddens": list(hiddens)})


def targets_met(rat: dict[str, Any]) -> dict[str, bool | None]:
    """Per target: met, missed, or None where the ratio was refused (unequal work)."""
    return rllib_iteration.targets_met(rat, TARGETS)


def plot(rows: list[dict[str, Any]], rat: dict[str, Any], title: str, path: Path) -> None:
    """Per-iteration wall and exposed time of both systems, and the two ratios against their targets."""
    panels = (("wall_s", "iteration wall (s)"), ("exposed_s", "exposed path (s)"))
    rllib_iteration.plot_side_by_side(rows, rat, TARGETS, panels, title, path)


def main(argv: list[str] | None = None) -> Path:
    p = script.parser(__doc__, quick="1,000 env steps, 2 epochs, 3 iterations (a smoke run)")
    p.add_argument("--env", default=ENV, help=f"{METAWORLD}<MT1 task> or a gymnasium id ({ENV})")
    p.add_argument("--env-runners", type=int, default=2)
    p.add_argument("--train-batch-size", type=int, default=None, help="env steps per iteration (4000)")
    p.add_argument("--minibatch-size", type=int, default=256)
    p.add_argument("--num-epochs", type=int, default=None, help="epochs per iteration (10)")
    p.add_argument("--iters", type=int, default=None, help="measured iterations per system (10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--overlap", choices=["sync", "async"], default="async")
    a = p.parse_args(argv)
    if a.out is None:  # the canonical file; a smoke run never overwrites results
        a.out = Path(f"/tmp/{NAME}_quick.json") if a.quick else script.RESULTS / f"{NAME}.json"
    tb = a.train_batch_size or (1000 if a.quick else 4000)
    epochs = a.num_epochs or (2 if a.quick else 10)
    iters = a.iters or (3 if a.quick else 10)
    prov = provenance.start()

    import ray
    import torch
    from conduit_rllib.local_ray import init_local_ray

    torch.set_num_threads(1)
    init_local_ray(num_cpus=max(2, 2 * a.env_runners), log_to_driver=False)
    w = rllib_iteration.Workload("ppo", a.env, tb)
    settings = {
        "env": a.env,
        **env_settings(a.env, a.seed),
        "env_runners": a.env_runners,
        "train_batch_size": tb,
        "minibatch_size": a.minibatch_size,
        "num_epochs": epochs,
        "model": "RLlib's default (fcnet [256, 256], separate value network)",
        "seed": a.seed,
        "overlap": a.overlap,
        "measured_iterations": iters,
        "warmup_iterations": 1,
        "exposed_timing": "benchmark wrappers on both systems (rllib_native_timing.install(conduit=True))",
    }

    def build() -> Any:
        return make_config(a.env, a.env_runners, tb, a.minibatch_size, epochs, a.seed)

    try:
        rows = rllib_iteration.run_workload(
            w, iters, warmup=1, steps=tb, overlap=a.overlap, timer=PathTimer(), make=build
        )
    finally:
        ray.shutdown()
    for r in rows:
        r["env_runners"] = a.env_runners
    rat = rllib_iteration.ratios(rows)[w.name]
    machine = script.machine(
        prov,
        mujoco=script.version("mujoco"),
        metaworld=script.version("metaworld"),
        gymnasium=script.version("gymnasium"),
    )
    record = rllib_iteration.record(machine, settings, rows, rat, TARGETS)
    title = f"PPO {a.env}, {a.env_runners} env runners, batch {tb}: native RLlib vs Conduit ({a.overlap})"
    return script.write_result(
        NAME, a, record, lambda png: plot(rows, rat, title, png), report_rllib.rllib_mujoco
    )


def env_settings(env: str, seed: int) -> dict[str, Any]:
    """What the JSON records about how ``env`` is made."""
    if not env.startswith(METAWORLD):
        return {"env_make": f"gym.make({env!r})"}
    task = env[len(METAWORLD) :]
    return {
        "env_make": f'gym.make("Meta-World/MT1", env_name="{task}", seed={seed})',
        "env_wrappers": "Meta-World's: TimeLimit(500), AutoTerminateOnSuccess (off), RecordEpisodeStatistics, "
        "RandomTaskSelect (one of MT1's 50 goals per reset); observation space as Meta-World's once a "
        "task is set (goal bounds)",
        "observation": "float64 (39,)",
        "action": "float32 (4,)",
    }


if __name__ == "__main__":
    main()
