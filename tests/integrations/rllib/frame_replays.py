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
