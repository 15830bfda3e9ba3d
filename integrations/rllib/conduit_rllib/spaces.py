"""Which gymnasium spaces Conduit stores as fixed-shape columns, and with which dtype."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from conduit_rllib.errors import UnsupportedSpaceError


def column_spec(space: gym.Space, what: str) -> tuple[torch.dtype, tuple[int, ...]]:
    """``(dtype, per-item shape)`` of the column holding values of ``space``.

    Raises:
        UnsupportedSpaceError: for nested or variable-size spaces (Dict, Tuple, Sequence, Text, Graph),
            naming ``what`` (e.g. ``"observation space of module 'p0'"``) and the space.
    """
    if isinstance(space, gym.spaces.Box):
        dtype = torch.float32 if np.issubdtype(space.dtype, np.floating) else torch.int64
        return dtype, tuple(int(s) for s in space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return torch.int64, ()
    if isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return torch.int64, tuple(int(s) for s in space.shape)
    raise UnsupportedSpaceError(
        f"{what} is {space!r}: Conduit stores fixed-shape columns and supports Box, Discrete, "
        "MultiDiscrete and MultiBinary spaces; flatten nested spaces (Dict, Tuple) with a "
        "FlattenObservations env-to-module connector or a gymnasium wrapper first"
    )


def check_spaces(spaces: dict[str, tuple[gym.Space, gym.Space]], discrete_actions: bool) -> None:
    """Validate every module's spaces (``{module_id: (obs, action)}``); ``discrete_actions`` for DQN."""
    for mid, (obs_space, act_space) in spaces.items():
        if obs_space is None:
            continue
        column_spec(obs_space, f"the observation space of module {mid!r}")
        if act_space is None:
            continue
        if discrete_actions and not isinstance(act_space, gym.spaces.Discrete):
            raise UnsupportedSpaceError(
                f"the action space of module {mid!r} is {act_space!r}; DQN needs Discrete"
            )
        column_spec(act_space, f"the action space of module {mid!r}")
