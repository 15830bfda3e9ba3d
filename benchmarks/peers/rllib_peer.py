"""RLlib's side of the benchmark: the replay path a DQN learner pays for (ray 2.60, new API stack).

Insert: ``buffer.add([episode])`` of one finished ``SingleAgentEpisode`` holding ``B`` transitions into a
full buffer (the buffer deep-copies it and evicts the oldest episodes).
Sample: what ``DQN._training_step_new_api_stack`` + ``Learner`` run per update:
``buffer.sample(num_items=B, n_step=1, ..., sample_episodes=True)`` -> the DQN learner connector
pipeline (the one a real ``DQNTorchLearner`` builds) -> ``MultiAgentBatch`` of torch tensors ->
``buffer.update_priorities(td_errors)`` (prioritized) — the priority update runs only for
``PrioritizedEpisodeReplayBuffer``, the uniform case uses ``EpisodeReplayBuffer``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from harness import ALPHA, BETA, N_PRIORITY_SETS, Cell, System, work_record

PREFILL_EPISODE_LEN = 200
GAMMA = 0.99


def _spaces(dim: int) -> tuple[Any, Any]:
    import gymnasium as gym

    return gym.spaces.Box(-10.0, 10.0, (dim,), np.float32), gym.spaces.Discrete(2)


def _episode(length: int, dim: int, rng: np.random.Generator) -> Any:
    """A finished (terminated) numpy episode of ``length`` transitions with ``dim``-float observations."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    obs_space, act_space = _spaces(dim)
    return SingleAgentEpisode(
        observations=list(rng.standard_normal((length + 1, dim), dtype=np.float32)),
        actions=list(rng.integers(0, 2, length)),
        rewards=list(rng.standard_normal(length).astype(np.float32)),
        observation_space=obs_space,
        action_space=act_space,
        terminated=True,
        len_lookback_buffer=0,
    ).to_numpy()


def _make_learner(dim: int, sampler: str) -> Any:
    """A built ``DQNTorchLearner`` for a ``dim``-float observation, 2-action problem."""
    from ray.rllib.algorithms.dqn import DQNConfig

    obs_space, act_space = _spaces(dim)
    buffer_type = "PrioritizedEpisodeReplayBuffer" if sampler == "prioritized" else "EpisodeReplayBuffer"
    cfg = (
        DQNConfig()
        .environment(observation_space=obs_space, action_space=act_space)
        .training(
            gamma=GAMMA, n_step=1, replay_buffer_config={"type": buffer_type, "alpha": ALPHA, "beta": BETA}
        )
    )
    return cfg.build_learner(env=None)


def _make_buffer(sampler: str, dim: int, capacity: int, rng: np.random.Generator) -> Any:
    from ray.rllib.utils.replay_buffers import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer

    if sampler == "prioritized":
        buf: Any = PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=ALPHA)
    else:
        buf = EpisodeReplayBuffer(capacity=capacity)
    while buf.get_num_timesteps() + PREFILL_EPISODE_LEN <= capacity:
        buf.add([_episode(PREFILL_EPISODE_LEN, dim, rng)])
    return buf


class DQNCellSystem(System):
    """A system on RLlib's DQN cells: one finished episode in (insert), one DQN train batch out (sample);
    the work records are RLlib's (:func:`episode_work`, :func:`train_batch_work`)."""

    def __init__(self, dims: Iterable[int], batches: Iterable[int], seed: int) -> None:
        super().__init__()
        self._dims, self._batches = set(dims), set(batches)
        self._rng = np.random.default_rng(seed)
        self._buf: Any = None

    def supports(self, cell: Cell) -> bool:
        return cell.dim in self._dims and cell.batch in self._batches

    def measure(self, cell: Cell, payload: object) -> dict[str, Any]:
        if cell.op == "insert":
            return episode_work(payload)
        return train_batch_work(payload, cell.sampler == "prioritized")

    def close(self) -> None:
        super().close()
        self._buf = None


class RLlibSystem(DQNCellSystem):
    """A full RLlib episode buffer plus a built DQN learner's connector pipeline, for small cells only."""

    name = "rllib"

    def __init__(self, dims: Iterable[int], batches: Iterable[int]) -> None:
        super().__init__(dims, batches, seed=0)
        logging.getLogger("ray").setLevel(logging.ERROR)
        self._learner: Any = None

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        self._learner = _make_learner(dim, sampler)
        self._buf = _make_buffer(sampler, dim, capacity, self._rng)

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        if cell.op == "insert":
            return _insert_fn(self._buf, _episode(cell.batch, cell.dim, self._rng))
        return sample_step(self._buf, self._learner, cell.batch, cell.sampler == "prioritized", self._rng)

    def close(self) -> None:
        super().close()
        self._learner = None


def episode_work(episode: Any) -> dict[str, Any]:
    """The work record of inserting one finished ``SingleAgentEpisode`` (its numpy arrays)."""
    arrays = {
        "observations": episode.get_observations(),
        "actions": episode.get_actions(),
        "rewards": episode.get_rewards(),
    }
    return work_record(
        len(episode), {k: int(np.asarray(v).nbytes) for k, v in arrays.items()}, False, "buffer"
    )


def train_batch_work(batch: Any, priority_update: bool) -> dict[str, Any]:
    """The work record of a delivered ``MultiAgentBatch`` of torch tensors (every module's columns)."""
    cols: dict[str, int] = {}
    rows = 0
    for sb in batch.policy_batches.values():
        rows += len(sb)
        for k, v in sb.items():
            cols[k] = cols.get(k, 0) + v.numel() * v.element_size()
    return work_record(rows, cols, priority_update, "buffer")


def _insert_fn(buf: Any, template: Any) -> Callable[[], Any]:
    def step() -> Any:
        template.id_ = uuid.uuid4().hex  # a new episode each call; add() deep-copies it
        buf.add([template])
        return template

    return step


def sample_step(
    buf: Any, learner: Any, batch: int, prioritized: bool, rng: np.random.Generator, n_step: int = 1
) -> Callable[[], Any]:
    """One DQN update's replay path as a call: sample ``batch`` items (``n_step`` returns), run
    ``learner``'s connector into a ``MultiAgentBatch``, and (prioritized) update their priorities."""
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    prio_sets = [(rng.random(batch) * 2 + 1e-3).astype(np.float32) for _ in range(N_PRIORITY_SETS)]
    k = [0]

    def step() -> Any:
        episodes = buf.sample(
            num_items=batch,
            n_step=n_step,
            batch_length_T=0,
            lookback=0,
            min_batch_length_T=0,
            gamma=GAMMA,
            beta=BETA if prioritized else 0.0,
            sample_episodes=True,
        )
        data = learner._learner_connector(
            rl_module=learner.module, batch={}, episodes=episodes, shared_data={}, metrics=learner.metrics
        )
        out = MultiAgentBatch(
            {mid: SampleBatch(cols) for mid, cols in data.items()}, env_steps=sum(len(e) for e in episodes)
        )
        if prioritized:
            buf.update_priorities(prio_sets[k[0] % N_PRIORITY_SETS])
            k[0] += 1
        return out

    return step
