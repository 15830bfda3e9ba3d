"""The native RLlib cell of ``rllib_atari.py``: RLlib 2.60's ``PrioritizedEpisodeReplayBuffer`` holding
Atari observations the way native DQN must hold them.

RLlib's own ``FrameStackingLearner`` cannot run beside the prioritized episode buffer (it samples 1-step
episodes without lookback, on which ``FrameStacking`` fails), so native DQN stacks frames in the env
(``wrap_atari_for_new_api_stack(framestack=4)``): every step's observation is a float32 ``[H, W, 4]``
stack, stored per step in the episodes. A cell fills the buffer with the same stand-in episodes as
Conduit's cell (frames stacked in the env, ``EnvStacker``), then times what a DQN
update pays on the replay path: ``buffer.sample(32, n_step=3)`` -> a built ``DQNTorchLearner``'s learner
connector -> ``MultiAgentBatch`` -> ``update_priorities``. A capacity whose observations would not fit in
80% of the machine's available memory is refused before it is filled (the row says what it needs and
what the machine has) instead of driving the machine into swap or the OOM killer.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent / "peers")]
from atari_stream import latency, meminfo  # noqa: E402
from rllib_peer import sample_step  # noqa: E402

GAMMA, ALPHA = 0.99, 0.5  # BETA and the sampling step: peers/rllib_peer.py's


def obs_bytes(capacity: int, dim: int, num_frames: int) -> int:
    """Bytes of the stacked float32 observations ``capacity`` steps hold (one per step)."""
    return capacity * dim * dim * num_frames * 4


class EnvStacker:
    """What the frame-stacking env wrapper emits: each observation as its float32 stack ``[H, W, F]`` of
    the episode's last ``F`` frames (oldest first, zeros before the episode's first frame), continued
    across an episode's chunks (a chunk's first observation is the previous chunk's last)."""

    def __init__(self, num_frames: int) -> None:
        self.num_frames = num_frames
        self.tails: dict[str, np.ndarray] = {}  # per unfinished episode: the F - 1 frames before its last obs

    def __call__(self, chunks: list[Any]) -> Any:
        import gymnasium as gym
        from conduit_rllib.compat import SingleAgentEpisode

        (chunk,) = chunks
        f = self.num_frames
        obs = np.asarray(chunk.get_observations())[..., 0]  # [T + 1, H, W]
        prefix = self.tails.pop(chunk.id_, None)
        if prefix is None:
            prefix = np.zeros((f - 1, *obs.shape[1:]), obs.dtype)
        seq = np.concatenate([prefix, obs])
        if not chunk.is_terminated:
            self.tails[chunk.id_] = seq[-f:-1]
        stacks = np.stack([np.moveaxis(seq[i : i + f], 0, -1) for i in range(len(obs))])  # [T + 1, H, W, F]
        return SingleAgentEpisode(
            id_=chunk.id_,
            observations=list(stacks),
            actions=list(chunk.get_actions()),
            rewards=list(chunk.get_rewards()),
            terminated=chunk.is_terminated,
            observation_space=gym.spaces.Box(-1.0, 1.0, stacks.shape[1:], np.float32),
            t_started=chunk.t_started,
            len_lookback_buffer=0,
        ).to_numpy()


def learner(dim: int, num_frames: int) -> Any:
    """A built ``DQNTorchLearner`` for ``[dim, dim, F]`` float observations and 6 actions (its connector)."""
    import gymnasium as gym
    from ray.rllib.algorithms.dqn import DQNConfig

    cfg = (
        DQNConfig()
        .environment(
            observation_space=gym.spaces.Box(-1.0, 1.0, (dim, dim, num_frames), np.float32),
            action_space=gym.spaces.Discrete(6),
        )
        .training(gamma=GAMMA, n_step=3, replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer"})
    )
    return cfg.build_learner(env=None)


def native_cell(
    capacity: int,
    dim: int,
    rounds: int,
    batch: int,
    num_frames: int,
    fragments: Any,
    memory: Any,
    growth: Any,
) -> dict[str, Any]:
    """Fill RLlib's prioritized episode buffer to ``capacity`` steps from ``fragments`` (the Conduit cell's
    stand-in chunks), then time prioritized sample + learner connector + priority update at ``batch``."""
    need, have = obs_bytes(capacity, dim, num_frames), meminfo("MemAvailable")
    row: dict[str, Any] = {"system": "native", "capacity": capacity, "dim": dim, "frames_tier": "host"}
    if need > 0.8 * have:
        row["refused"] = (
            f"does not fit: float32 [{dim}, {dim}, {num_frames}] observations for {capacity:,} steps need "
            f"{need / 2**30:.1f} GiB, the machine has {have / 2**30:.1f} GiB available"
        )
        return row
    import torch
    from ray.rllib.utils.replay_buffers import PrioritizedEpisodeReplayBuffer

    torch.set_num_threads(1)
    mem0 = memory()
    lrn = learner(dim, num_frames)
    buf = PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=ALPHA)
    add_s, steps = 0.0, 0
    stack = EnvStacker(num_frames)
    for chunks in fragments(capacity, dim, seed=0):
        ep = stack(chunks)  # the env's work, not the buffer's: untimed
        t0 = time.perf_counter()
        buf.add([ep])
        add_s += time.perf_counter() - t0
        steps += len(ep)
    timed = latency(sample_step(buf, lrn, batch, True, np.random.default_rng(1), n_step=3), rounds)
    row.update(
        {
            "memory_budget": None,
            **growth(mem0),
            "disk_gib": 0.0,
            "frames_gib": round(need / 2**30, 3),
            "insert_steps_per_s": round(steps / add_s),
            **timed,
            "work": {
                "env_steps": steps,
                "inserted": buf.get_num_timesteps(),
                "samples": rounds,
                "updates": rounds,
            },
        }
    )
    return row


__all__ = ["native_cell"]
