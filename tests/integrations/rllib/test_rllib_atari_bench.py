"""benchmarks/rllib_atari.py's judgement and native cell, without a full run: ratios only at equal work,
native refused (with what it needs) where it cannot fit, the env-side stacks RLlib's buffer accepts."""

from __future__ import annotations

import numpy as np
from benchmark_modules import load

atari = load("rllib_atari")
native = load("rllib_atari_native")

WORK = {"env_steps": 1000, "inserted": 1000, "samples": 300, "updates": 300}


def _row(system: str, tier: str = "host", p50: float = 1.0, **kw) -> dict:
    row = {"system": system, "capacity": 1000, "frames_tier": tier, "sample_update_p50_ms": p50}
    row |= {"sample_update_p99_ms": 2 * p50, "rss_gib": 1.0, "insert_steps_per_s": 100, "work": dict(WORK)}
    return row | kw


def test_ratios_at_equal_work_and_refused_otherwise() -> None:
    rows = [_row("conduit", p50=0.5), _row("conduit", "disk", p50=1.0), _row("native", p50=2.0)]
    r = atari.ratios(rows)
    assert r["sample_update_p50_ms/native_over_conduit/1000/frames_on_host"] == 4.0
    assert r["sample_update_p50_ms/native_over_conduit/1000/frames_on_disk"] == 2.0
    rows[2]["work"]["samples"] = 299
    r = atari.ratios(rows)
    assert "work differs" in r["refused/1000/frames_on_host"] and not any("/native_over_" in k for k in r)
    refused = {"system": "native", "capacity": 1000, "frames_tier": "host", "refused": "does not fit: x"}
    assert atari.ratios([rows[0], refused]) == {"refused/1000/frames_on_host": "native: does not fit: x"}


def test_native_refuses_a_capacity_that_does_not_fit() -> None:
    row = native.native_cell(10**9, 84, 1, 32, 4, atari.fragments, atari.memory, atari.memory_growth)
    assert row["system"] == "native" and "does not fit" in row["refused"] and "GiB" in row["refused"]


def test_env_stacks_continue_across_chunks_and_rllib_takes_them() -> None:
    from ray.rllib.utils.replay_buffers import PrioritizedEpisodeReplayBuffer

    stack = native.EnvStacker(4)
    buf = PrioritizedEpisodeReplayBuffer(capacity=10_000)
    frames = {}
    for chunks in atari.fragments(400, 8, seed=0):
        ep = stack(chunks)
        obs = np.asarray(ep.get_observations())
        assert obs.shape[1:] == (8, 8, 4) and obs.dtype == np.float32
        frames.setdefault(ep.id_, []).append(obs)
        buf.add([ep])  # RLlib checks that a chunk starts where the previous one ended
    first = next(iter(frames.values()))[0]
    assert np.all(first[0, ..., :3] == 0)  # zeros before the episode's first frame
    assert np.array_equal(first[1, ..., 2], first[0, ..., 3])  # the stack shifts by one frame per step
    assert buf.get_num_timesteps() >= 400
