"""A tiny Atari DQN (ALE Qbert, RLlib's Atari wrappers, 4-frame stacking by connectors) through the plugin.

Slow: a few hundred env steps with a CNN on CPU. Its fast counterpart is ``test_atari_frames.py``
(Conduit's stacks against RLlib's connectors on recorded Qbert episodes).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ale_py")

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.long]

NUM_FRAMES = 4


def atari_dqn_config(env: str = "ale_py:ALE/Qbert-v5", seed: int = 0):
    """RLlib's Atari DQN setup (its Pong example's connectors and wrappers), scaled down for a CPU test."""
    import ale_py
    import gymnasium as gym
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
    from ray.rllib.connectors.learner.frame_stacking import FrameStackingLearner
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    from ray.tune.registry import register_env

    gym.register_envs(ale_py)
    register_env("conduit-atari", lambda cfg: wrap_atari_for_new_api_stack(gym.make(env, **cfg), dim=64))
    return (
        DQNConfig()
        .environment(
            "conduit-atari",
            env_config={"frameskip": 1, "full_action_space": False, "repeat_action_probability": 0.0},
            clip_rewards=True,
        )
        .env_runners(
            num_env_runners=0,
            rollout_fragment_length=4,
            # the env-to-module stacks see as far back as the learner's (RLlib's default keeps 1 step)
            episode_lookback_horizon=NUM_FRAMES - 1,
            env_to_module_connector=lambda e, s, d: FrameStackingEnvToModule(num_frames=NUM_FRAMES),
        )
        .training(
            learner_connector=lambda o, a: FrameStackingLearner(num_frames=NUM_FRAMES),
            n_step=3,
            train_batch_size=32,
            num_steps_sampled_before_learning_starts=64,
            replay_buffer_config={
                "type": "PrioritizedEpisodeReplayBuffer",
                "capacity": 2000,
                "alpha": 0.5,
                "beta": 0.4,
            },
        )
        .rl_module(
            model_config=DefaultModelConfig(
                conv_filters=[(16, 4, 2), (32, 4, 2), (64, 4, 2), (128, 4, 2)],
                conv_activation="relu",
                head_fcnet_hiddens=[64],
            )
        )
        .debugging(seed=seed)
    )


@pytest.mark.parametrize("overlap", ["sync", "async", "auto"])
def test_atari_dqn_trains_with_frames_stored_once(ray_local, overlap):
    import conduit_rllib

    algo = conduit_rllib.enable(atari_dqn_config(), overlap=overlap).build_algo()
    try:
        steps = 0
        while steps < 300:
            result = algo.train()
            steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
        assert np.isfinite(result["learners"]["default_policy"]["qf_loss"])
        replay = algo.conduit_path
        assert replay.frame_stack == NUM_FRAMES
        replay.settle()  # async: the frames handed over are stored by the ingestion worker
        store = replay.packers["default_policy"].store
        inserted = replay.conduits["default_policy"].buffer.inserted
        # one frame per env step, plus each episode's first observation
        assert steps <= store.appended <= steps + 64 and inserted > 200
        train = replay.sample(32)
        obs = train.kwargs["batch"].policy_batches["default_policy"]["obs"]
        assert tuple(obs.shape) == (32, 64, 64, NUM_FRAMES) and obs.dtype.is_floating_point
    finally:
        algo.stop()
