"""PPO on RLlib with Conduit's experience path (or RLlib's own, for comparison), in one file.

    python recipes/rllib_ppo.py --env CartPole-v1 --iters 20 [--no-conduit]

``conduit_rllib.enable`` moves GAE and value targets to ingestion (computed per env-runner fragment,
vectorised, with the weights the fragment was sampled with) and has Conduit prepare every epoch's
shuffled minibatches on the learner device, split over learners the way RLlib shards its batch.
The learner's update (loss, optimizer, KL and entropy schedules) is RLlib's own.
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
    train_batch_size: int = 4000
    """env steps sampled per iteration"""
    minibatch_size: int = 128
    """rows per SGD minibatch"""
    num_epochs: int = 30
    """passes over each iteration's batch"""
    iters: int = 20
    """training iterations"""
    conduit: bool = True
    """route the experience path through Conduit (False: RLlib's learner connector + minibatch iterator)"""
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
    from ray.rllib.algorithms.ppo import PPOConfig

    config = (
        PPOConfig()
        .environment(args.env)
        .env_runners(num_env_runners=0)
        .training(
            train_batch_size=args.train_batch_size,
            minibatch_size=min(args.minibatch_size, args.train_batch_size),
            num_epochs=args.num_epochs,
        )
        .debugging(seed=args.seed)
    )
    if args.conduit:
        import conduit_rllib

        config = conduit_rllib.enable(config)
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
