"""Real RLlib iterations with Conduit on (num_env_runners=0, tiny batches)."""

import conduit_rllib
import numpy as np
import pytest
from benchmark_modules import cartpole_dqn
from ray.rllib.algorithms.ppo import PPOConfig

from conduit import ConfigError

pytestmark = pytest.mark.ray


dqn_config = cartpole_dqn  # (seed=0, **training); test_autotune builds with it too


def ppo_config(seed=0):
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size=256, minibatch_size=64, num_epochs=2)
        .debugging(seed=seed)
    )


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_dqn_trains_with_conduit(ray_local, overlap):
    algo = conduit_rllib.enable(dqn_config(n_step=3), overlap=overlap).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        m = result["conduit"]
        assert m["exposed_s"] > 0 and m["count/inserted"] > 0
        assert "op/ingest/nstep_s" in m and any(k.startswith("bytes/") for k in m)
        learner = result["learners"]["default_policy"]
        assert np.isfinite(learner["qf_loss"])
        assert algo.conduit_path.conduits["default_policy"].buffer.inserted > 64
    finally:
        algo.stop()


def _sync_run(seed):
    algo = conduit_rllib.enable(dqn_config(seed=seed), overlap="sync").build_algo()
    replay = algo.conduit_path
    slots, losses = [], []
    orig = replay.sample

    def recording(n):
        out = orig(n)
        slots.append(out.deliveries["default_policy"].slots.clone())
        return out

    replay.sample = recording
    try:
        for _ in range(2):
            losses.append(algo.train()["learners"]["default_policy"]["qf_loss"])
    finally:
        algo.stop()
    return slots, losses


def test_dqn_sync_learning_signal_is_reproducible(ray_local):
    """Same seed: the same sampled buffer slots and the same losses, iteration by iteration."""
    a_slots, a_loss = _sync_run(7)
    b_slots, b_loss = _sync_run(7)
    assert len(a_slots) == len(b_slots) > 0
    assert all(bool((x == y).all()) for x, y in zip(a_slots, b_slots))
    assert a_loss == b_loss


@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_ppo_trains_with_conduit(ray_local, overlap):
    algo = conduit_rllib.enable(ppo_config(), overlap=overlap).build_algo()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["conduit"]["op/ingest/gae_s"] > 0
        assert algo.conduit_path.conduits["default_policy"].scheduler_config.overlap == overlap  # applied
        # The learner iterated Conduit's prepared minibatches (not RLlib's slicing iterator): 256 rows,
        # minibatches of 64, 2 epochs, as many as RLlib makes over its padded batch (one masked step per
        # episode chunk, 1..32 chunks): ceil(2 * (256 + chunks) / 64) = 9.
        assert result["conduit"]["op/rllib/minibatch_calls"] == 9
        learner = result["learners"]["default_policy"]
        assert np.isfinite(learner["policy_loss"]) and np.isfinite(learner["vf_loss"])
    finally:
        algo.stop()


def test_ppo_refuses_a_knob_that_does_not_apply(ray_local):
    with pytest.raises(ConfigError, match="g_del=4 does not apply to PPO"):
        conduit_rllib.enable(ppo_config(), overlap="async", g_del=4).build_algo()
