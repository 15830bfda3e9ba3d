"""``enable(config)``: route an RLlib DQN or PPO config's experience path through Conduit."""

from __future__ import annotations

from typing import Any

from conduit_rllib.settings import ConduitSettings
from conduit_rllib.validate import algorithm_name, check_dqn_config, check_ppo_config


def enable(
    config: Any,
    *,
    overlap: str = "auto",
    depth: int | None = None,
    g_ing: int = 1,
    g_del: int | None = None,
    seed: int | None = None,
    stage_steps: int | None = None,
    pins: dict[str, str] | None = None,
    memory_budget: int | None = None,
    disk_path: str | None = None,
) -> Any:
    """Return ``config`` set up to run its algorithm with Conduit's experience path.

    ``overlap="auto"`` (the default) lets the core's cost model and tuner choose DQN's overlap,
    ``stage_steps``, ``g_del`` and ``depth`` after a short measured warm-up (any of them passed here
    stays pinned); the choice, its reason and its staleness are logged (``conduit.tuner``). Buffer
    columns are placed on memory tiers by Conduit's planner; ``pins={"obs": "disk"}`` keeps a column
    where you put it; ``memory_budget`` (bytes) caps the RAM a replay takes (frames past it go to the
    disk tier under ``disk_path``). See
    :class:`~conduit_rllib.settings.ConduitSettings` for every knob.

    Example:
        >>> config = DQNConfig().environment("CartPole-v1")
        >>> config = conduit_rllib.enable(config, overlap="async", g_del=4)
        >>> algo = config.build_algo()

    Raises:
        UnsupportedAlgorithmError: not DQN or PPO (the message lists the supported ones).
        OldAPIStackError: the config is on RLlib's old API stack.
        ReplayConfigError: a replay/training setting Conduit cannot honour (the message names the key).
    """
    from conduit_rllib.compat import store_settings
    from conduit_rllib.dqn import ConduitDQN
    from conduit_rllib.ppo import ConduitPPO

    name = algorithm_name(config)
    settings = ConduitSettings(
        overlap=overlap,
        depth=depth,
        g_ing=g_ing,
        g_del=g_del,
        seed=seed,
        stage_steps=stage_steps,
        pins={} if pins is None else pins,
        memory_budget=memory_budget,
        disk_path=disk_path,
    )
    if name == "DQN":
        check_dqn_config(config)
        config.algo_class = ConduitDQN
    else:
        check_ppo_config(config)
        config.algo_class = ConduitPPO
        from conduit_rllib.learner import learner_class_for

        if isinstance(config.learner_class, type):
            config.learners(learner_class=learner_class_for(config.learner_class))
    store_settings(config, settings.to_dict())
    return config
