"""RLlib's buffers are placed by Conduit's planner by default, and a user pins a column by hand."""

import conduit_rllib
import pytest
from benchmark_modules import cartpole_dqn
from ray.rllib.algorithms.ppo import PPOConfig

from conduit import ConfigError

pytestmark = pytest.mark.ray


def test_dqn_buffer_is_planned_and_a_pinned_column_stays_put(ray_local):
    algo = conduit_rllib.enable(cartpole_dqn(), overlap="sync", pins={"obs": "disk"}).build_algo()
    try:
        algo.train()
        buf = algo.conduit_path.conduits["default_policy"].buffer
        assert buf.placer is not None  # planned (tier="auto"), re-planned as it changes
        assert buf.storage.tiers["obs"] == "disk"
        assert len(buf.storage.tiers) > 1  # every column has a tier: planned, or pinned
        assert buf.inserted > 0
    finally:
        algo.stop()


def test_ppo_buffer_honours_pins(ray_local):
    cfg = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
        .debugging(seed=0)
    )
    algo = conduit_rllib.enable(cfg, overlap="sync", pins={"advantages": "shm"}).build_algo()
    try:
        algo.train()
        buf = algo.conduit_path.conduits["default_policy"].buffer
        assert buf.storage.tiers["advantages"] == "shm" and buf.placer is not None
    finally:
        algo.stop()


def test_bad_pins_are_named():
    with pytest.raises(ConfigError, match="pins must map"):
        conduit_rllib.enable(cartpole_dqn(), pins={"obs": "moon"}).build_algo()
    with pytest.raises(ConfigError, match="pins must map"):
        conduit_rllib.enable(cartpole_dqn(), pins=["obs"])  # type: ignore[arg-type]
