"""PPO on RLlib with Conduit's experience path (or RLlib's own, for comparison), in one file.

    python recipes/rllib_ppo.py --env CartPole-v1 --iters 20 [--no-conduit]

``conduit_rllib.enable`` moves GAE and value targets to ingestion (computed per env-runner fragment,
vectorised, with the weights the fragment was sampled with) and has Conduit prepare every epoch's
shuffled minibatches on the learner device, split over learners the way RLlib shards its batch.
The learner's update (loss, optimizer, KL and entropy schedules) is RLlib's own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

try:
    from rllib_common import build_algo, parse_args, train
except ImportError:  # loaded by file path (not run as a script): the recipes folder is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from rllib_common import build_algo, parse_args, train


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


def build(args: Args):  # noqa: ANN201
    from ray.rllib.algorithms.ppo import PPOConfig

    config = PPOConfig().training(
        train_batch_size=args.train_batch_size,
        minibatch_size=min(args.minibatch_size, args.train_batch_size),
        num_epochs=args.num_epochs,
    )
    return build_algo(config, args)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(Args, __doc__, argv)
    return train(lambda: build(args), args.iters)


if __name__ == "__main__":
    main()
