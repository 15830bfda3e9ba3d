"""Continuous (Box) actions through PPO's experience path, on real RLlib episode chunks (no Ray).

The plugin infers its columns from the first packed batch and checks the action columns against the
module's action space; a batch that does not fit raises ``ActionFormatError`` (or the core's
``NonFiniteError`` for NaN actions) naming the column, before anything is stored.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conduit_rllib import ActionFormatError, ConduitSettings, RLlibIntegrationError
from conduit_rllib.onpolicy import ConduitOnPolicy
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from conduit import ConduitError, NonFiniteError

OBS, ACT = 17, 6  # HalfCheetah's observation and action sizes
BOX = gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32)


def _chunks(rng, lengths, act_shape=(ACT,), act_dtype=np.float32, logp_shape=(), nan_at=None):
    """Episode chunks as an env runner returns them: float64 observations (MuJoCo's), Gaussian actions."""
    out = []
    for i, T in enumerate(lengths):
        ep = SingleAgentEpisode()
        ep.add_env_reset(observation=rng.standard_normal(OBS))
        for t in range(T):
            act = rng.standard_normal(act_shape).astype(act_dtype)
            if nan_at == (i, t):
                act[0] = np.nan
            ep.add_env_step(
                rng.standard_normal(OBS),
                act,
                float(rng.standard_normal()),
                truncated=t == T - 1 and i == 0,
                extra_model_outputs={
                    Columns.ACTION_LOGP: np.asarray(rng.standard_normal(logp_shape), np.float32),
                    Columns.ACTION_DIST_INPUTS: rng.standard_normal(2 * ACT).astype(np.float32),
                },
            )
        out.append(ep.to_numpy())
    return out


def _path(space=BOX):
    w = torch.linspace(-1, 1, OBS)
    return ConduitOnPolicy(
        ConduitSettings(overlap="sync"),
        {"default_policy": lambda o: o @ w},
        gamma=0.99,
        lambda_=0.95,
        capacity=10_000,
        device="cpu",
        num_learners=0,
        seed=0,
        action_spaces={"default_policy": space},
    )


def test_box_actions_are_stored_and_delivered_with_their_shape_and_dtype():
    path = _path()
    try:
        path.add(_chunks(np.random.default_rng(0), [40, 25]), version=0)
        c = path.conduits["default_policy"]
        put = {col.name: (col.dtype, col.shape) for col in c.schema}
        assert put["actions"] == (torch.float32, (ACT,))
        assert put["action_logp"] == (torch.float32, ())
        assert put["action_dist_inputs"] == (torch.float32, (2 * ACT,))
        assert put["obs"] == (
            torch.float32,
            (OBS,),
        )  # MuJoCo's float64 observations, as RLlib's learner sees them
        assert c.schema["actions"].check_finite and c.schema["rewards"].check_finite
        train = path.deliver(num_epochs=2, minibatch_size=16)
        sb = train.kwargs["batch"].policy_batches["default_policy"]
        # RLlib's count: ceil(2 * (65 rows + 2 chunks) / 16) = 9 minibatches of 16 real rows
        assert train.deliveries["num_minibatches"] == 9 and len(sb) == 9 * 16
        assert sb[Columns.ACTIONS].dtype == torch.float32 and tuple(sb[Columns.ACTIONS].shape) == (144, ACT)
        assert tuple(sb[Columns.ACTION_LOGP].shape) == (144,)
        assert tuple(sb[Columns.ACTION_DIST_INPUTS].shape) == (144, 2 * ACT)
        assert torch.isfinite(sb["advantages"]).all() and torch.isfinite(sb["value_targets"]).all()
    finally:
        path.close()


@pytest.mark.parametrize(
    ("kw", "space", "match"),
    [
        (
            {"act_shape": (ACT - 1,)},
            BOX,
            r"column 'actions' holds torch.float32 of per-step shape \(5,\).*\(6,\)",
        ),
        ({"act_dtype": np.int64}, BOX, r"column 'actions' holds torch.int64 .* needs torch.float32"),
        ({}, gym.spaces.Discrete(4), r"column 'actions' holds torch.float32 of per-step shape \(6,\)"),
        ({"logp_shape": (ACT,)}, BOX, r"column 'action_logp' has per-step shape \(6,\); PPO needs one"),
    ],
)
def test_actions_that_do_not_fit_raise_action_format_error_naming_the_column(kw, space, match):
    path = _path(space)
    try:
        with pytest.raises(ActionFormatError, match=match) as err:
            path.add(_chunks(np.random.default_rng(1), [10], **kw), version=0)
        assert isinstance(err.value, RLlibIntegrationError) and isinstance(err.value, ConduitError)
        assert "module 'default_policy'" in str(err.value)
        assert path.pending == {}  # nothing counted for delivery
    finally:
        path.close()


def test_nan_actions_are_refused_naming_the_column():
    path = _path()
    try:
        rng = np.random.default_rng(2)
        path.add(_chunks(rng, [10]), version=0)  # a good batch first: the schema exists
        with pytest.raises(NonFiniteError, match=r"'actions': 1"):
            path.add(_chunks(rng, [10, 10], nan_at=(1, 3)), version=1)
    finally:
        path.close()
