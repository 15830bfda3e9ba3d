"""The frame-stacked prioritized ``ConduitReplay`` the frame tests build (4-frame stacks, n-step 3)."""

from __future__ import annotations

from typing import Any


def frame_replay(capacity: int, overlap: str = "sync", gamma: float = 0.9, **settings: Any):  # noqa: ANN201
    """A ``ConduitReplay`` over Atari-shaped frames: prioritized (alpha 0.6, beta 0.4), n-step 3, seed 0,
    CPU, no learners; ``settings`` go to ``ConduitSettings`` (e.g. ``memory_budget``, ``disk_path``)."""
    from conduit_rllib.replay import ConduitReplay
    from conduit_rllib.settings import ConduitSettings

    from conduit import BufferConfig

    return ConduitReplay(
        ConduitSettings(overlap=overlap, **settings),
        BufferConfig.prioritized_replay(capacity, alpha=0.6, beta=0.4),
        n_step=3,
        gamma=gamma,
        device="cpu",
        num_learners=0,
        seed=0,
        frame_stack=4,
    )


def episode_chunk(
    eid: str, frames: Any, actions: Any, rewards: Any, terminated: bool, space: Any, t_started: int = 0
):  # noqa: ANN201
    """Steps ``t_started``..``t_started + len(actions)`` of episode ``eid`` as the ``SingleAgentEpisode`` an
    env runner hands the replay (numpy form, no lookback): ``frames`` are its ``len(actions) + 1``
    observations in ``space``."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    return SingleAgentEpisode(
        id_=eid,
        observations=list(frames),
        actions=list(actions),
        rewards=list(rewards),
        terminated=terminated,
        observation_space=space,
        t_started=t_started,
        len_lookback_buffer=0,
    ).to_numpy()
