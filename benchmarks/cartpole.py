"""DQN on CartPole at a small shape: the RLlib config the plugin's benchmarks and tests build.

One env runner in the driver; ``batch`` transitions per update, learning from ``learning_starts`` env
steps on, at least ``steps`` env steps per iteration; more ``training`` keys (``n_step``,
``replay_buffer_config``, ...) go to ``DQNConfig.training``. Benchmarks import it by name
(``benchmarks/`` on ``sys.path``); the RLlib tests through ``tests/integrations/rllib/benchmark_modules.py``.
"""

from __future__ import annotations

from typing import Any


def dqn_config(
    batch: int = 16, learning_starts: int = 32, steps: int = 64, seed: int = 0, **training: Any
) -> Any:
    """RLlib's ``DQNConfig`` for CartPole-v1 at this shape (plain RLlib: pass it to ``conduit_rllib.enable``)."""
    from ray.rllib.algorithms.dqn import DQNConfig

    return (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(
            train_batch_size=batch, num_steps_sampled_before_learning_starts=learning_starts, **training
        )
        .reporting(min_sample_timesteps_per_iteration=steps)
        .debugging(seed=seed)
    )
