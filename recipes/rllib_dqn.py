"""DQN on RLlib with Conduit's experience path (or RLlib's own, for comparison), in one file.

    python recipes/rllib_dqn.py --env CartPole-v1 --iters 20 [--no-conduit] [--overlap async]

Everything RLlib-specific stays RLlib's: the env runners, the Q-learner and its target network.
``conduit_rllib.enable`` swaps only the replay path: episodes are ingested as columns, n-step
returns are computed once at ingestion, and train batches are sampled (prioritized or uniform, as
``replay_buffer_config`` says) and built on the learner device ahead of the update.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass


@dataclass
class Args:
    env: str = "CartPole-v1"
    """gymnasium environment id"""
    train_batch_size: int = 32
    """transitions per learner update"""
    iters: int = 20
    """training iterations (each samples `steps_per_iter` env steps)"""
    steps_per_iter: int = 1000
    """env steps per iteration (RLlib's min_sample_timesteps_per_iteration)"""
    learning_starts: int = 1000
    """env steps sampled before the first update"""
    n_step: int = 1
    """n-step return length"""
    conduit: bool = True
    """route the replay path through Conduit (False: RLlib's native episode replay buffer)"""
    overlap: str = "sync"
    """Conduit overlap: sync (inline) or async (ingestion and delivery on background workers)"""
    g_del: int = 0
    """mini-batches Conduit samples and gathers per delivery call (0: the plugin's default)"""
    seed: int = 1
    """RLlib and Conduit seed"""


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)
    return Args(**vars(p.parse_args(argv)))


def build(args: Args):  # noqa: ANN201
    from ray.rllib.algorithms.dqn import DQNConfig

    config = (
        DQNConfig()
        .environment(args.env)
        .env_runners(num_env_runners=0)
        .training(
            train_batch_size=args.train_batch_size,
            n_step=args.n_step,
            num_steps_sampled_before_learning_starts=args.learning_starts,
        )
        .reporting(min_sample_timesteps_per_iteration=args.steps_per_iter)
        .debugging(seed=args.seed)
    )
    if args.conduit:
        import conduit_rllib

        config = conduit_rllib.enable(config, overlap=args.overlap, g_del=args.g_del or None)
    return config.build_algo()


def main(argv: list[str] | None = None) -> list[dict]:
    import torch
    from conduit_rllib.local_ray import init_local_ray

    args = parse_args(argv)
    torch.set_num_threads(1)
    init_local_ray(ignore_reinit_error=True)
    algo = build(args)
    history = []
    try:
        for it in range(args.iters):
            t0 = time.perf_counter()
            result = algo.train()
            wall = time.perf_counter() - t0
            row = {
                "iteration": it,
                "env_steps": result["env_runners"].get("num_env_steps_sampled_lifetime"),
                "return_mean": result["env_runners"].get("episode_return_mean"),
                "wall_s": wall,
                "exposed_s": result.get("conduit", {}).get("exposed_s"),
            }
            history.append(row)
            print(
                " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                flush=True,
            )
    finally:
        algo.stop()
    return history


if __name__ == "__main__":
    main()
