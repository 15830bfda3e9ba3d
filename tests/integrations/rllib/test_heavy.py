"""Multi-agent, remote env runners / learners, checkpoints and Tune (marked slow)."""

import conduit_rllib
import numpy as np
import pytest
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.long]
MA_ENV = "MultiAgentCartPole"


def _multi_agent(cfg):
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    from ray.tune.registry import register_env

    register_env(MA_ENV, lambda c: MultiAgentCartPole({"num_agents": 2}))
    return cfg.environment(MA_ENV).multi_agent(
        policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **k: f"p{aid}"
    )


def _dqn(**kw):
    return (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=kw.pop("runners", 0))
        .learners(num_learners=kw.pop("learners", 0))
        .training(train_batch_size=16, num_steps_sampled_before_learning_starts=32, **kw)
        .reporting(min_sample_timesteps_per_iteration=64)
    )


def _ppo(runners=0, learners=0):
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=runners)
        .learners(num_learners=learners)
        .training(train_batch_size=256, minibatch_size=64, num_epochs=2)
    )


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_multi_agent_two_policies(ray_local, algo):
    cfg = _multi_agent(_dqn() if algo == "dqn" else _ppo())
    a = conduit_rllib.enable(cfg).build_algo()
    try:
        for _ in range(2):
            r = a.train()
        assert {"p0", "p1"} <= set(r["learners"])
        assert set(a.conduit_path.conduits) == {"p0", "p1"}
    finally:
        a.stop()


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_remote_env_runners_and_learner(ray_local, algo):
    cfg = _dqn(runners=1, learners=1) if algo == "dqn" else _ppo(runners=1, learners=1)
    a = conduit_rllib.enable(cfg).build_algo()
    try:
        for _ in range(2):
            r = a.train()
        key = "qf_loss" if algo == "dqn" else "policy_loss"
        assert np.isfinite(r["learners"]["default_policy"][key])
        assert r["conduit"]["exposed_s"] > 0
        if algo == "ppo":  # the remote learner iterates Conduit's prepared minibatches
            from conduit_rllib.learner import ConduitLearnerMixin

            uses_mixin = [
                res.get()
                for res in a.learner_group.foreach_learner(
                    lambda learner: isinstance(learner, ConduitLearnerMixin)
                )
            ]
            assert uses_mixin == [True]
            assert r["conduit"]["op/ingest/gae_s"] > 0
    finally:
        a.stop()


def test_checkpoint_restores_buffer_priorities_and_counters(ray_local, tmp_path):
    a = conduit_rllib.enable(_dqn()).build_algo()
    try:
        a.train()
        a.train()
        path = a.save(str(tmp_path)).checkpoint.path
        buf = a.conduit_path.conduits["default_policy"].buffer
        before = (buf.inserted, buf.sampled, buf.sampler.state_dict())
    finally:
        a.stop()
    b = Algorithm.from_checkpoint(path)
    try:
        assert type(b).__name__ == "ConduitDQN"
        buf = b.conduit_path.conduits["default_policy"].buffer
        assert (buf.inserted, buf.sampled) == before[:2]
        after = buf.sampler.state_dict()
        for k, v in before[2].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, after[k]), k
        b.train()
    finally:
        b.stop()


def test_tuner(ray_local, tmp_path):
    from ray import tune

    cfg = conduit_rllib.enable(_dqn(), overlap="async")
    results = tune.Tuner(
        cfg.algo_class,
        param_space=cfg,
        run_config=tune.RunConfig(stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0),
    ).fit()
    res = results.get_best_result(metric="env_runners/num_env_steps_sampled_lifetime", mode="max")
    assert res.error is None
    assert "conduit" in res.metrics and res.metrics["conduit"]["exposed_s"] >= 0
