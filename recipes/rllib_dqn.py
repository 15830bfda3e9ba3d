"""DQN on RLlib with Conduit's experience path (or RLlib's own, for comparison), in one file.

    python recipes/rllib_dqn.py --env CartPole-v1 --iters 20 [--no-conduit] [--overlap async]

Everything RLlib-specific stays RLlib's: the env runners, the Q-learner and its target network.
``conduit_rllib.enable`` swaps only the replay path: episodes are ingested as columns, n-step
returns are computed once at ingestion, and train batches are sampled (prioritized or uniform, as
``replay_buffer_config`` says) and built on the learner device ahead of the update.
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


def build(args: Args):  # noqa: ANN201
    from ray.rllib.algorithms.dqn import DQNConfig

    config = (
        DQNConfig()
        .training(
            train_batch_size=args.train_batch_size,
            n_step=args.n_step,
            num_steps_sampled_before_learning_starts=args.learning_starts,
        )
        .reporting(min_sample_timesteps_per_iteration=args.steps_per_iter)
    )
    return build_algo(config, args, overlap=args.overlap, g_del=args.g_del or None)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(Args, __doc__, argv)
    return train(lambda: build(args), args.iters)


if __name__ == "__main__":
    main()
