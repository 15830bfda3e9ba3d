"""Every error the plugin raises is a ConduitError subclass that names the problem."""

import conduit_rllib
import gymnasium as gym
import pytest
from conduit_rllib import (
    OldAPIStackError,
    ReplayConfigError,
    RLlibIntegrationError,
    UnsupportedAlgorithmError,
    UnsupportedSpaceError,
    errors,
)
from conduit_rllib.spaces import check_spaces, column_spec
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig

from conduit.errors import ConduitError


def test_hierarchy():
    """Every error class the plugin defines (errors.py) is a ConduitError, under RLlibIntegrationError,
    and exported by the package."""
    defined = [c for c in vars(errors).values() if isinstance(c, type) and c.__module__ == errors.__name__]
    assert len(defined) == 10
    for cls in defined:
        assert issubclass(cls, RLlibIntegrationError) and issubclass(cls, ConduitError)
        assert getattr(conduit_rllib, cls.__name__) is cls and cls.__name__ in conduit_rllib.__all__


def test_unsupported_algorithm_names_it_and_lists_supported():
    with pytest.raises(UnsupportedAlgorithmError, match=r"'APPO'.*supported: DQN, PPO"):
        conduit_rllib.enable(APPOConfig())


def test_old_api_stack():
    cfg = DQNConfig().api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
    with pytest.raises(OldAPIStackError, match="new API stack"):
        conduit_rllib.enable(cfg)


def test_replay_config_key_it_cannot_honour():
    cfg = DQNConfig().training(replay_buffer_config={"storage_location": "disk"})
    with pytest.raises(ReplayConfigError, match="storage_location"):
        conduit_rllib.enable(cfg)
    with pytest.raises(ReplayConfigError, match="n_step"):
        conduit_rllib.enable(DQNConfig().training(n_step=(2, 5)))
    with pytest.raises(ReplayConfigError, match="type"):
        conduit_rllib.enable(DQNConfig().training(replay_buffer_config={"type": "ReservoirReplayBuffer"}))
    with pytest.raises(ReplayConfigError, match="use_lstm"):
        conduit_rllib.enable(PPOConfig().rl_module(model_config={"use_lstm": True}))


def test_observation_space_it_cannot_store_names_it():
    space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})
    with pytest.raises(UnsupportedSpaceError, match=r"observation space of module 'p0' is Dict"):
        check_spaces({"p0": (space, gym.spaces.Discrete(2))}, discrete_actions=True)
    with pytest.raises(UnsupportedSpaceError, match="DQN needs Discrete"):
        check_spaces({"p0": (gym.spaces.Box(0, 1, (3,)), gym.spaces.Box(0, 1, (1,)))}, discrete_actions=True)
    assert column_spec(gym.spaces.Box(0, 1, (3, 2)), "x")[1] == (3, 2)


def test_enable_sets_class_and_knobs():
    cfg = conduit_rllib.enable(DQNConfig(), overlap="async", g_del=4)
    assert cfg.algo_class.__name__ == "ConduitDQN"
    assert cfg.conduit["overlap"] == "async" and cfg.conduit["g_del"] == 4
    with pytest.raises(ConduitError, match="overlap"):
        conduit_rllib.enable(DQNConfig(), overlap="sometimes")
