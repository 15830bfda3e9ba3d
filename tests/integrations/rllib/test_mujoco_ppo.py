"""PPO on MuJoCo through ``conduit_rllib.enable`` (needs the ``mujoco`` extra): gymnasium's HalfCheetah-v5
and Meta-World's MT1 ``reach-v3`` (the benchmark's env creator, ``benchmarks/rllib_mujoco.py``).

Native RLlib and the plugin run side by side: equal work (both envs' episodes have a fixed length,
HalfCheetah 1,000 steps, MT1 500, and are only truncated, so both sides cut the same chunks and make
the same number of updates), finite losses, continuous actions stored as ``float32`` of the action
space's shape, and the value targets the plugin computed at ingestion equal to RLlib's own GAE
connector run on the same episodes with the same weights (across an MT1 truncation too).
"""

import copy
from importlib.util import find_spec

import conduit_rllib
import numpy as np
import pytest
import torch
from benchmark_modules import load
from conduit_rllib import onpolicy
from conduit_rllib.compat import local_learner
from conduit_rllib.gae import gae
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing

from conduit import Operator

pytest.importorskip("mujoco")
pytestmark = pytest.mark.ray
ENV = "HalfCheetah-v5"
MT1 = "metaworld:reach-v3"
MID = "default_policy"
needs_metaworld = pytest.mark.skipif(find_spec("metaworld") is None, reason="Meta-World not installed")


def halfcheetah_ppo(train_batch_size=256, minibatch_size=64, num_epochs=2, runners=0, seed=0, env=ENV):
    """The benchmark's config (``benchmarks/rllib_mujoco.py``), small: 32-unit MLPs, runners on half a CPU."""
    return load("rllib_mujoco").make_config(
        env,
        runners,
        train_batch_size,
        minibatch_size,
        num_epochs,
        seed,
        hiddens=[32, 32],
        cpus_per_runner=0.5,
    )


class _RLlibGAE:
    """Runs RLlib's own learner connector (its GAE included) on copies of the episodes the plugin ingests,
    just before the plugin does, so both see the same value-function weights."""

    def __init__(self, algo):
        self.targets: list[tuple[torch.Tensor, torch.Tensor]] = []  # (obs, value targets) of real rows
        learner, path = local_learner(algo.learner_group), algo.conduit_path
        add = path.add

        def recorded(episodes, version):
            batch = learner._learner_connector(
                rl_module=learner.module,
                batch={},
                episodes=[copy.deepcopy(e) for e in episodes],
                shared_data={},
                metrics=learner.metrics,
            )[MID]
            mask = batch[Columns.LOSS_MASK].bool().cpu()
            self.targets.append(
                (batch[Columns.OBS].cpu()[mask], batch[Postprocessing.VALUE_TARGETS].cpu()[mask])
            )
            return add(episodes, version)

        path.add = recorded


@pytest.fixture
def plugin_gae(monkeypatch):
    """What the plugin's GAE operator returned, batch by batch (the operator itself is the real one)."""
    seen = []

    def operator(value_fn, gamma, lambda_):
        def run(batch):
            out = gae(batch, value_fn, gamma, lambda_)
            seen.append(out)
            return out

        return Operator("gae", run)

    monkeypatch.setattr(onpolicy, "gae_operator", operator)
    return seen


def _train(algo, counter, iters):
    out = []
    for _ in range(iters):
        result = algo.train()
        out.append((result, counter.take(result)))
    return out


@needs_metaworld
def test_metaworld_mt1_env_through_the_registered_creator():
    """The creator RLlib's env runners call: MT1 reach-v3 with the goal observed and inside the observation
    space, float64 (39,) observations, float32 (4,) actions, 500-step episodes only truncated."""
    from ray.rllib.env.env_context import EnvContext
    from ray.tune.registry import ENV_CREATOR, _global_registry

    name, env_config = load("rllib_mujoco").rllib_env(MT1, seed=0)
    assert (name, env_config) == ("metaworld-mt1-reach-v3", {"seed": 0})
    env = _global_registry.get(ENV_CREATOR, name)(EnvContext(env_config, worker_index=0))
    try:
        space = env.observation_space
        assert (space.shape, space.dtype) == ((39,), np.float64)
        assert (env.action_space.shape, env.action_space.dtype) == ((4,), np.float32)
        assert np.all(space.high[36:] > space.low[36:])  # the goal's bounds, not the goal-hidden zeros
        goals = set()
        for episode in range(2):
            obs, _ = env.reset(seed=episode)
            assert space.contains(obs)
            goals.add(tuple(obs[36:]))
            for step in range(1, 501):
                obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                assert space.contains(obs) and np.isfinite(reward)
                assert not terminated and truncated == (step == 500)
        assert len(goals) == 2  # a goal position drawn per reset, and shown
    finally:
        env.close()


@pytest.mark.parametrize(
    "env, obs_dim, act_dim",
    [(ENV, 17, 6), pytest.param(MT1, 39, 4, marks=needs_metaworld)],
)
def test_mujoco_ppo_through_the_plugin(ray_local, plugin_gae, env, obs_dim, act_dim):
    timing = load("rllib_native_timing")
    native = halfcheetah_ppo(env=env).build_algo()
    conduit = conduit_rllib.enable(halfcheetah_ppo(env=env), overlap="sync").build_algo()
    try:
        reference = _RLlibGAE(conduit)
        runs = {
            "native": _train(native, timing.WorkCounter(native), 2),
            "conduit": _train(conduit, timing.WorkCounter(conduit), 2),
        }
        for (_, wn), (_, wc) in zip(runs["native"], runs["conduit"]):
            assert wn == wc  # env steps, gradient updates, module steps: iteration by iteration
            # HalfCheetah: 256 steps of a 1,000-step episode, one chunk RLlib pads by one step: ceil(2 * 257 / 64);
            # MT1's second iteration ends a 500-step episode: chunks of 244 and 12 steps, ceil(2 * 258 / 64)
            assert wc == {"env_steps_sampled": 256, "gradient_updates": 9, "module_steps_trained": 9 * 64}
        for system, iters in runs.items():
            for result, _ in iters:
                learner = result["learners"][MID]
                for key in ("policy_loss", "vf_loss", "entropy"):
                    assert np.isfinite(learner[key]), (system, key, learner[key])
        result = runs["conduit"][-1][0]
        assert (
            result["conduit"]["op/rllib/minibatch_calls"] == 9
        )  # the learner iterated Conduit's minibatches

        schema = conduit.conduit_path.conduits[MID].schema
        assert (schema["actions"].dtype, schema["actions"].shape) == (torch.float32, (act_dim,))
        assert (schema["action_logp"].dtype, schema["action_logp"].shape) == (torch.float32, ())
        assert (schema["action_dist_inputs"].dtype, schema["action_dist_inputs"].shape) == (
            torch.float32,
            (2 * act_dim,),
        )
        assert (schema["obs"].dtype, schema["obs"].shape) == (torch.float32, (obs_dim,))

        assert len(plugin_gae) == len(reference.targets) == 2
        for got, (obs, targets) in zip(plugin_gae, reference.targets):
            assert torch.equal(got["obs"], obs.to(torch.float32))  # the same rows in the same order
            np.testing.assert_allclose(got["value_targets"].numpy(), targets.numpy(), rtol=1e-4, atol=1e-4)
            assert float(got["advantages"].abs().sum()) > 0
            acts = got["actions"]
            assert acts.dtype == torch.float32 and tuple(acts.shape) == (256, act_dim)
            assert float(acts.std()) > 0  # sampled, not a constant
            if env == MT1:  # the goal is observed: not the goal-hidden zeros
                assert bool((got["obs"][:, 36:].abs().sum(dim=1) > 0).all())
    finally:
        native.stop()
        conduit.stop()


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["sync", "async"])
@pytest.mark.parametrize("env, episodes", [(ENV, 2), pytest.param(MT1, 4, marks=needs_metaworld)])
def test_mujoco_ppo_two_env_runners(ray_local, overlap, env, episodes):
    """2 remote env runners (MT1: its creator pickled to them), 2,000 steps per iteration (whole episodes on
    each runner: one of HalfCheetah's, two of MT1's), 4 epochs."""
    timing = load("rllib_native_timing")
    cfg = dict(train_batch_size=2000, minibatch_size=250, num_epochs=4, runners=2, env=env)
    native = halfcheetah_ppo(**cfg).build_algo()
    conduit = conduit_rllib.enable(halfcheetah_ppo(**cfg), overlap=overlap).build_algo()
    try:
        runs = {s: _train(a, timing.WorkCounter(a), 3) for s, a in (("native", native), ("conduit", conduit))}
        for (rn, wn), (rc, wc) in zip(runs["native"], runs["conduit"]):
            assert wn == wc
            # ceil(4 * 2002 / 250), MT1 ceil(4 * 2004 / 250): each chunk padded by one step
            assert wc["env_steps_sampled"] == 2000 and wc["gradient_updates"] == 33
            assert rc["conduit"]["op/ingest/gae_s"] > 0
            assert rc["conduit"]["op/rllib/minibatch_calls"] == 33
            for r in (rn, rc):
                assert np.isfinite(r["learners"][MID]["policy_loss"]) and np.isfinite(
                    r["learners"][MID]["vf_loss"]
                )
                assert r["env_runners"]["num_episodes"] == episodes  # each runner's 1,000 steps
    finally:
        native.stop()
        conduit.stop()


def test_benchmark_judges_targets_only_on_given_ratios():
    bench = load("rllib_mujoco")
    assert bench.targets_met({"ratio_exposed": 0.2, "ratio_wall": 1.1}) == {
        "ratio_exposed": True,
        "ratio_wall": False,
    }
    assert bench.targets_met({"ratio_exposed": None, "ratio_wall": None}) == {
        "ratio_exposed": None,
        "ratio_wall": None,
    }
