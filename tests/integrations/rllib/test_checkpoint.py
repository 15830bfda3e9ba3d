"""algo.save()/restore() keep Conduit's replay buffer exactly, beside RLlib's files in Conduit's safe
format (occupied slots only, no pickle), and a save killed at any moment leaves a loadable checkpoint."""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import conduit_rllib
import pytest
import torch
from ray.rllib.algorithms.dqn import DQNConfig

pytestmark = pytest.mark.ray


def dqn(capacity: int = 100_000):
    config = (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(
            train_batch_size=16,
            num_steps_sampled_before_learning_starts=32,
            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": capacity},
        )
        .reporting(min_sample_timesteps_per_iteration=64)
        .debugging(seed=0)
    )
    return conduit_rllib.enable(config, overlap="sync").build_algo()


def buffer_state(algo) -> dict:
    return algo.conduit_path.conduits["default_policy"].state_dict()["buffer"]


def test_save_restore_keeps_the_buffer_exactly_and_small(ray_local, tmp_path: Path) -> None:
    algo = dqn()
    try:
        for _ in range(2):
            algo.train()
        algo.save(str(tmp_path / "ck"))
        algo.save(str(tmp_path / "ck"))  # over an existing checkpoint
        saved = buffer_state(algo)
    finally:
        algo.stop()
    files = {
        p.relative_to(tmp_path / "ck").as_posix(): p.stat().st_size
        for p in (tmp_path / "ck").rglob("*")
        if p.is_file()
    }
    with open(tmp_path / "ck" / "algorithm_state.pkl", "rb") as f:
        assert "conduit" not in pickle.load(f)  # the buffer is not in the pickle
    conduit_bytes = sum(v for k, v in files.items() if k.startswith("conduit/"))
    assert conduit_bytes < 2_000_000, files  # occupied slots only (capacity 100k would be ~4 MB)
    fresh = dqn()
    try:
        fresh.restore(str(tmp_path / "ck"))
        got = buffer_state(fresh)
        assert got["inserted"] == saved["inserted"] > 0 and got["sampled"] == saved["sampled"]
        for k, v in saved["storage"].items():
            assert torch.equal(v, got["storage"][k]), k
        assert torch.equal(saved["sampler"]["tree"]["priorities"], got["sampler"]["tree"]["priorities"])
        assert saved["sampler"]["max_priority"] == got["sampler"]["max_priority"]
        fresh.train()  # and it trains on (puts go on from the saved policy version)

    finally:
        fresh.stop()


CHILD = textwrap.dedent(
    """
    import os, sys, ray, torch
    sys.path.insert(0, {tests!r})
    torch.set_num_threads(1)
    ray.init(address={address!r}, log_to_driver=False)
    from test_checkpoint import dqn
    algo = dqn()
    if os.path.isdir({path!r}):
        algo.restore({path!r})  # go on from the last checkpoint
    print("READY", flush=True)
    while True:
        algo.train()
        algo.save({path!r})
        print("SAVED", flush=True)
    """
)


def test_a_save_killed_at_any_moment_leaves_a_loadable_checkpoint(ray_local, tmp_path: Path) -> None:
    import ray

    path = str(tmp_path / "ck")
    script = CHILD.format(
        tests=str(Path(__file__).parent), path=path, address=ray.get_runtime_context().gcs_address
    )
    rng = random.Random(0)
    algo = dqn()
    seen = []
    try:
        for _ in range(5):
            child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
            try:
                assert child.stdout is not None and child.stdout.readline().startswith("READY")
                assert child.stdout.readline().startswith("SAVED")  # then kill during the next train/save
                time.sleep(rng.uniform(0.0, 2.0))
                os.kill(child.pid, signal.SIGKILL)
            finally:
                child.kill()
                child.wait()
            algo.restore(path)  # the old or the new checkpoint, never a torn one
            seen.append(buffer_state(algo)["inserted"])
    finally:
        algo.stop()
    assert len(seen) == 5 and all(a < b for a, b in zip(seen, seen[1:])) and seen[0] > 0, seen
