"""Conduit for RLlib: DQN and PPO with their experience path on Conduit, switched on with one line.

Example:
    >>> import conduit_rllib
    >>> config = conduit_rllib.enable(DQNConfig().environment("CartPole-v1"))
    >>> algo = config.build_algo()
    >>> algo.train()["conduit"]["exposed_s"]
"""

from conduit_rllib.enable import enable
from conduit_rllib.errors import (
    ActionFormatError,
    FrameFormatError,
    FramesEvictedError,
    FrameStoreError,
    OldAPIStackError,
    ReplayConfigError,
    RLlibIntegrationError,
    RLlibVersionError,
    UnsupportedAlgorithmError,
    UnsupportedSpaceError,
)
from conduit_rllib.settings import ConduitSettings


def __getattr__(name: str) -> object:
    # The algorithm classes import ray.rllib; load them only when asked for.
    if name == "ConduitDQN":
        from conduit_rllib.dqn import ConduitDQN

        return ConduitDQN
    if name == "ConduitPPO":
        from conduit_rllib.ppo import ConduitPPO

        return ConduitPPO
    raise AttributeError(name)


__all__ = [
    "ActionFormatError",
    "ConduitDQN",
    "ConduitPPO",
    "ConduitSettings",
    "FrameFormatError",
    "FrameStoreError",
    "FramesEvictedError",
    "OldAPIStackError",
    "RLlibIntegrationError",
    "RLlibVersionError",
    "ReplayConfigError",
    "UnsupportedAlgorithmError",
    "UnsupportedSpaceError",
    "enable",
]
