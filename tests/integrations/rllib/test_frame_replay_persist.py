"""A frame-stacking replay's memory budget and its on-disk checkpoint: ``enable(memory_budget=...)`` reaches
the frame store's placement; the plugin's checkpoint (``disk_state`` → ``save_tree`` → ``load_tree``) saves
the frames apart and incrementally, and restores frames, frame references and priorities exactly."""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from conduit_rllib.common import FRAMES
from conduit_rllib.replay import ConduitReplay
from conduit_rllib.settings import ConduitSettings
from frame_replays import episode_chunk, frame_replay

from conduit.errors import ConfigError
from conduit.persist.tree import load_tree, save_tree

SPACE = gym.spaces.Box(0, 255, (64, 64, 1), np.uint8)
MID = "default_policy"


def chunks(rng: np.random.Generator, steps: int, start: int = 0):
    """Rounds of 8-step chunks of two interleaved episodes; each frame's pixels come from its episode and t."""
    running: list[list] = []
    made, n = 0, start
    while made < steps:
        while len(running) < 2:
            running.append([f"ep{n}", n, int(rng.integers(5, 60)), 0])
            n += 1
        out = []
        for ep in running:
            eid, k, length, t0 = ep
            t1 = min(length, t0 + 8)
            ts = np.arange(t0, t1 + 1)
            obs = ((k * 31 + ts[:, None, None] + np.arange(64)[None, :, None]) % 256).astype(np.uint8)
            obs = np.broadcast_to(obs[..., None], (len(ts), 64, 64, 1)).copy()
            actions, rewards = rng.integers(0, 4, t1 - t0), rng.random(t1 - t0).astype(np.float32)
            out.append(episode_chunk(eid, obs, actions, rewards, t1 == length, SPACE, t0))
            ep[3] = t1
            made += t1 - t0
        running = [ep for ep in running if ep[3] < ep[2]]
        yield out


def make_replay(capacity: int = 6000, **settings) -> ConduitReplay:
    return frame_replay(capacity, **settings)


def feed(replay: ConduitReplay, rng: np.random.Generator, steps: int) -> None:
    for round_ in chunks(
        rng, steps, start=replay.packers[MID].store.appended if MID in replay.packers else 0
    ):
        replay.add(round_, version=0)
    for i in range(3):  # priorities the restore must keep
        train = replay.sample(32)
        replay.update_priorities(train, {MID: np.linspace(0.1, 5.0, 32, dtype=np.float32) * (i + 1)})
    replay.flush()


def save(replay: ConduitReplay, directory, previous=None) -> None:
    state, buffers = replay.disk_state()
    save_tree(state, buffers, directory, previous, linked={n for n in buffers if n.startswith(FRAMES)})


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


def test_the_memory_budget_reaches_the_frame_store(tmp_path):
    rng = np.random.default_rng(0)
    small = make_replay(2000, memory_budget=1 << 20, disk_path=str(tmp_path))
    large = make_replay(2000, memory_budget=1 << 30)
    for r in (small, large):
        for round_ in chunks(rng, 200):
            r.add(round_, version=0)
    assert small.packers[MID].store.tier == "disk" and large.packers[MID].store.tier == "host"
    small.close()
    large.close()


def test_enable_takes_a_memory_budget():
    from conduit_rllib import enable
    from ray.rllib.algorithms.dqn import DQNConfig

    config = enable(DQNConfig().environment("CartPole-v1"), memory_budget=3 << 30, disk_path="/tmp/frames")
    settings = ConduitSettings.of(config)
    assert (settings.memory_budget, settings.disk_path) == (3 << 30, "/tmp/frames")
    with pytest.raises(ConfigError, match="memory_budget"):
        ConduitSettings(memory_budget=-1)


def test_on_disk_checkpoint_saves_frames_incrementally_and_restores_exactly(tmp_path):
    rng = np.random.default_rng(1)
    replay = make_replay()
    feed(replay, rng, 4000)  # ~4,100 frames: two full segments of 2,040 and a few in the third
    save(replay, tmp_path / "c1")
    feed(replay, rng, 150)
    save(replay, tmp_path / "c2", previous=tmp_path / "c1")

    frames1 = tmp_path / "c1" / "buffers" / (FRAMES + MID)
    frames2 = tmp_path / "c2" / "buffers" / (FRAMES + MID)
    old = {os.stat(p).st_ino for p in frames1.rglob("*") if p.is_file()}
    newest = max(p for p in frames2.iterdir() if p.name.startswith("ckpt-"))
    files = [p for p in newest.iterdir() if p.is_file()]
    written = sum(p.stat().st_size for p in files if p.stat().st_ino not in old)
    total = sum(p.stat().st_size for p in files)
    assert written < total / 2 and written <= 2 * (8 << 20) + (64 << 10)  # the new frames' segments only
    state_cdr = (tmp_path / "c2" / "state.cdr").stat().st_size
    assert state_cdr < 1 << 20  # the frames are not in the state record

    other = make_replay()
    other.load_state_dict(load_tree(tmp_path / "c2", other.buffer_named))
    a, b = replay.packers[MID], other.packers[MID]
    assert _equal(a.store.state_dict(), b.store.state_dict())  # frames, generations, count
    assert _equal(dict(a._last), dict(b._last))  # frame references of unfinished episodes
    ca, cb = replay.conduits[MID].buffer, other.conduits[MID].buffer
    assert _equal(ca.state_dict(), cb.state_dict())  # stored references, priorities, counters
    for r in (replay, other):  # the next chunks give both the same transitions
        feed(r, np.random.default_rng(7), 100)
    assert _equal(a.store.state_dict(), b.store.state_dict())
    assert _equal(ca.storage.state_dict(), cb.storage.state_dict())
    replay.close()
    other.close()
