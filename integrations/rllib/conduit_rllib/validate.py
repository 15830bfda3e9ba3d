"""Checks run by ``enable()`` and again in the algorithms' ``setup``: fail early, name the problem."""

from __future__ import annotations

from typing import Any

from conduit_rllib.errors import OldAPIStackError, ReplayConfigError, UnsupportedAlgorithmError

SUPPORTED = ("DQN", "PPO")
REPLAY_TYPES = (
    "EpisodeReplayBuffer",
    "PrioritizedEpisodeReplayBuffer",
    "MultiAgentEpisodeReplayBuffer",
    "MultiAgentPrioritizedEpisodeReplayBuffer",
)
# Keys of replay_buffer_config the Conduit path honours (or that do not change what is sampled).
REPLAY_KEYS = {"type", "capacity", "alpha", "beta", "epsilon", "metrics_num_episodes_for_smoothing"}


def algorithm_name(config: Any) -> str:
    """``"DQN"`` or ``"PPO"`` for a config of (a subclass of) those algorithms, else raise."""
    from conduit_rllib.compat import DQN, PPO

    algo = config.algo_class
    name = algo if isinstance(algo, str) else getattr(algo, "__name__", repr(algo))
    if isinstance(algo, type):
        if issubclass(algo, DQN):
            return "DQN"
        if issubclass(algo, PPO):
            return "PPO"
    elif name in SUPPORTED:
        return name
    raise UnsupportedAlgorithmError(
        f"conduit_rllib does not support algorithm {name!r}; supported: {', '.join(SUPPORTED)}"
    )


def check_api_stack(config: Any) -> None:
    if not (config.enable_rl_module_and_learner and config.enable_env_runner_and_connector_v2):
        raise OldAPIStackError(
            "conduit_rllib needs RLlib's new API stack (RLModule, Learner, EnvRunner, ConnectorV2); "
            "this config has enable_rl_module_and_learner="
            f"{config.enable_rl_module_and_learner}, enable_env_runner_and_connector_v2="
            f"{config.enable_env_runner_and_connector_v2}. Remove config.api_stack(...False...)."
        )


def check_dqn_config(config: Any) -> None:
    """Raise ``ReplayConfigError`` naming the first replay/training key the Conduit path cannot honour."""
    check_api_stack(config)
    rb = dict(config.replay_buffer_config or {})
    kind = rb.get("type")
    kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", repr(kind))
    if kind_name.rsplit(".", 1)[-1] not in REPLAY_TYPES:
        raise ReplayConfigError(
            f"replay_buffer_config['type']={kind_name!r} cannot be honoured: Conduit replaces RLlib's "
            f"episode replay buffers ({', '.join(REPLAY_TYPES)}) with uniform or prioritized sampling"
        )
    for key in sorted(set(rb) - REPLAY_KEYS):
        raise ReplayConfigError(
            f"replay_buffer_config[{key!r}] cannot be honoured by Conduit's replay path; "
            f"supported keys: {sorted(REPLAY_KEYS)}"
        )
    if isinstance(config.n_step, list | tuple):
        raise ReplayConfigError(
            f"n_step={tuple(config.n_step)!r} (a random range) cannot be honoured: Conduit computes n-step "
            "returns once at ingestion, so n_step must be a fixed int"
        )
    if config.burn_in_len:
        raise ReplayConfigError(
            f"burn_in_len={config.burn_in_len} cannot be honoured: Conduit stores single transitions"
        )
    if config.model_config.get("use_lstm"):
        raise ReplayConfigError(
            "model_config['use_lstm'] cannot be honoured: Conduit's DQN path stores single transitions"
        )


def check_ppo_config(config: Any) -> None:
    check_api_stack(config)
    if config.model_config.get("use_lstm") or config.model_config.get("use_attention"):
        raise ReplayConfigError(
            "model_config['use_lstm'] cannot be honoured: Conduit's PPO path stores single steps, not sequences"
        )
