"""A 1M-transition frame-stacking replay on this machine (slow): 64x64 uint8 frames, each stored once, on
the disk tier under a 2 GiB RAM budget. Fills ``ConduitReplay`` (capacity 1,000,000, n-step 3, four
frames a stack) through ``add`` with episode chunks, then samples prioritized batches; the process's peak
resident memory must stay within 8 GiB. Prints the figures (run with ``-s``): fill time, steps per
second, peak and final RSS (anonymous / file-mapped), the frames' bytes on disk."""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from benchmark_modules import load
from frame_replays import episode_chunk, frame_replay

pytestmark = [pytest.mark.slow, pytest.mark.long]

CAPACITY = 1_000_000
DIM = int(os.environ.get("CONDUIT_FRAME_DIM", "64"))
BUDGET = 2 << 30
CHUNK, EPISODE = 250, 2_000  # steps per chunk, per episode (two episodes interleaved)
GiB = 2**30
memory = load("rllib_atari").memory  # this process's resident memory (rss, anon, file, peak)


def _rounds(steps: int):
    """Rounds of two interleaved episodes' chunks; frame pixel (y, x) at step t of episode k is (k*31+t+x)%256."""
    space = gym.spaces.Box(0, 255, (DIM, DIM, 1), np.uint8)
    row = np.arange(DIM, dtype=np.int64)[None, None, :, None]
    rng = np.random.default_rng(0)
    made = 0
    for k in range(0, 10**9, 2):
        for t0 in range(0, EPISODE, CHUNK):
            t1 = min(EPISODE, t0 + CHUNK)
            out = []
            for ep in (k, k + 1):
                ts = np.arange(t0, t1 + 1, dtype=np.int64)[:, None, None, None]
                obs = np.broadcast_to(
                    ((ep * 31 + ts + row) % 256).astype(np.uint8), (t1 - t0 + 1, DIM, DIM, 1)
                )
                actions, rewards = rng.integers(0, 6, t1 - t0), np.ones(t1 - t0, np.float32)
                out.append(episode_chunk(f"ep{ep}", obs, actions, rewards, t1 == EPISODE, space, t0))
            yield out
            made += 2 * (t1 - t0)
            if made >= steps:
                return


def test_a_million_transitions_of_frames_fit_in_8_gib_resident(tmp_path):
    torch.set_num_threads(1)
    replay = frame_replay(CAPACITY, gamma=0.99, memory_budget=BUDGET, disk_path=str(tmp_path))
    before = memory()
    t0 = time.perf_counter()
    steps = 0
    for round_ in _rounds(CAPACITY + 10_000):
        steps += replay.add(round_, version=0)
    replay.flush()
    fill_s = time.perf_counter() - t0
    after_fill = memory()
    store = replay.packers["default_policy"].store
    buffer = replay.conduits["default_policy"].buffer
    t1 = time.perf_counter()
    for i in range(200):
        train = replay.sample(32)
        sb = train.kwargs["batch"].policy_batches["default_policy"]
        obs = sb["obs"].to(torch.int64)  # [32, DIM, DIM, 4]: consecutive frames of one episode
        real, last = obs[:, 0, 0, :], obs[:, 0, 0, -1:]
        want = (last - torch.arange(3, -1, -1)) % 256  # frames t-3..t; zeros before an episode's start
        x5 = obs[:, 0, 5, :]
        assert bool(((real == want) | (real == 0)).all())
        assert bool(((x5 == (real + 5) % 256) | ((x5 == 0) & (real == 0))).all())  # one frame's pixels
        replay.update_priorities(train, {"default_policy": np.full(32, 1.0 + i % 7, np.float32)})
    sample_ms = (time.perf_counter() - t1) / 200 * 1e3
    end = memory()
    figures = {
        "frame_dim": DIM,
        "transitions": buffer.inserted,
        "frames_appended": store.appended,
        "frame_tier": store.tier,
        "frames_gib": store.nbytes() / GiB,
        "fill_s": fill_s,
        "steps_per_s": steps / fill_s,
        "sample_update_ms_per_batch": sample_ms,
        "rss_before_gib": before["rss"] / GiB,
        "rss_peak_gib": end["peak"] / GiB,
        "rss_after_fill_gib": after_fill["rss"] / GiB,
        "rss_anon_gib": end["anon"] / GiB,
        "rss_file_gib": end["file"] / GiB,
    }
    print(
        "\n" + "\n".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in figures.items())
    )
    assert buffer.inserted >= CAPACITY and store.tier == "disk"
    assert end["peak"] <= 8 * GiB, figures
    replay.close()
