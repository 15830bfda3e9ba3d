"""Real process kills during ``algo.train()`` with the Conduit plugin on: SIGKILL of a remote env
runner's worker process (RLlib's fault tolerance restarts it or carries on without it, or train()
fails clearly) and of the remote learner's (RLlib 2.60 has no learner restarts: a clear error).

In every case the Conduit buffer stays exact: it holds exactly the env steps RLlib counts as
sampled, each once (slot generations 1..inserted, none lost or repeated). Worker processes are
found in Ray's actor table and matched against the pids the actors report themselves.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import conduit_rllib
import numpy as np
import pytest
import ray
import torch
from ray.rllib.algorithms.dqn import DQNConfig

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


def dqn(runners: int, learners: int = 0, **fault_tolerance: bool) -> DQNConfig:
    return (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=runners, num_cpus_per_env_runner=0.5)
        .learners(num_learners=learners)
        .training(train_batch_size=16, num_steps_sampled_before_learning_starts=32)
        .reporting(min_sample_timesteps_per_iteration=64)
        .fault_tolerance(**fault_tolerance)
        .debugging(seed=0)
    )


def worker_pids(reported: list[int], class_part: str) -> list[int]:
    """``reported`` (pids the actors gave) checked against Ray's actor table: live actors of that class."""
    table = {
        int(a["Pid"])
        for a in ray._private.state.actors().values()  # noqa: SLF001 - Ray's GCS actor table
        if a["State"] == "ALIVE" and class_part in a["ActorClassName"]
    }
    assert reported and set(reported) <= table, (reported, table)
    return reported


def env_runner_pids(algo) -> list[int]:
    return worker_pids(
        algo.env_runner_group.foreach_env_runner(lambda r: os.getpid(), local_env_runner=False), "EnvRunner"
    )


def learner_pids(algo) -> list[int]:
    reported = [r.get() for r in algo.learner_group.foreach_learner(lambda learner: os.getpid())]
    return worker_pids(reported, "_WrappedExecutable")  # how Ray names RLlib's learner actors


def assert_buffer_exact(algo, sampled: float) -> None:
    buffer = algo.conduit_path.conduits["default_policy"].buffer
    assert buffer.inserted == int(sampled), "the buffer lost or repeated env steps"
    gen = buffer.storage.generation
    assert torch.equal(gen[gen > 0].sort().values, torch.arange(1, buffer.inserted + 1))


def kill_soon(pid: int, delay_s: float = 0.05) -> threading.Thread:
    """SIGKILL ``pid`` from another thread ``delay_s`` from now (while the caller is in train())."""
    thread = threading.Timer(delay_s, os.kill, (pid, signal.SIGKILL))
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("setting", "healthy_after"),
    [
        # ~20-30 s each (RLlib restarts a worker process); the default suite's counterpart is
        # test_a_killed_env_runner_without_fault_tolerance_is_a_clear_error (the same kill, the buffer exact)
        pytest.param({"restart_failed_env_runners": True}, 2, id="restart", marks=pytest.mark.slow),
        pytest.param(
            {"restart_failed_env_runners": False, "ignore_env_runner_failures": True},
            1,
            id="ignore",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_killed_env_runner_is_survived_and_the_buffer_stays_exact(
    ray_local, setting, healthy_after
) -> None:
    algo = conduit_rllib.enable(dqn(2, **setting), overlap="sync").build_algo()
    try:
        result = algo.train()
        assert_buffer_exact(algo, result["env_runners"]["num_env_steps_sampled_lifetime"])
        killer = kill_soon(env_runner_pids(algo)[0])
        for _ in range(4):
            result = algo.train()
            assert_buffer_exact(algo, result["env_runners"]["num_env_steps_sampled_lifetime"])
        killer.join()
        group = algo.env_runner_group
        assert group.num_healthy_remote_workers() == healthy_after
        assert group.num_remote_worker_restarts() == (1 if healthy_after == 2 else 0)
        assert np.isfinite(result["learners"]["default_policy"]["qf_loss"])
    finally:
        algo.stop()


def test_a_killed_env_runner_without_fault_tolerance_is_a_clear_error(ray_local) -> None:
    algo = conduit_rllib.enable(dqn(2, restart_failed_env_runners=False), overlap="sync").build_algo()
    try:
        sampled = algo.train()["env_runners"]["num_env_steps_sampled_lifetime"]
        pid = env_runner_pids(algo)[0]
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.RayActorError, match="actor died") as err:
            for _ in range(3):
                sampled = algo.train()["env_runners"]["num_env_steps_sampled_lifetime"]
        assert time.monotonic() - t0 < 60
        assert "EnvRunner" in str(err.value) and str(pid) in str(err.value)  # names the process
        assert_buffer_exact(algo, sampled)  # nothing half-written by the failed iteration
    finally:
        algo.stop()


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["sync", "async"])
def test_a_killed_remote_learner_is_a_clear_error(ray_local, overlap) -> None:
    algo = conduit_rllib.enable(dqn(1, learners=1), overlap=overlap).build_algo()
    try:
        algo.train()
        killer = kill_soon(learner_pids(algo)[0])
        t0 = time.monotonic()
        with pytest.raises(ray.exceptions.RayActorError, match="actor died"):
            for _ in range(20):
                algo.train()
        killer.join()
        assert time.monotonic() - t0 < 60
    finally:
        t0 = time.monotonic()
        algo.stop()  # Conduit's workers stop too: no hang after the failure
        assert time.monotonic() - t0 < 60
    path = algo.conduit_path.conduits["default_policy"]
    assert path.buffer.inserted > 0 and path.buffer.inserted == int(path.buffer.storage.generation.max())
