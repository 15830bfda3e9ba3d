"""``ConduitDQN``: RLlib's DQN with its replay path (buffer, sampling, learner connector) on Conduit.

Only ``training_step`` changes, and only in where experience goes: sampling from env runners,
the learner update, target-network updates and weight sync are RLlib's own calls, in RLlib's order.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from conduit import BufferConfig
from conduit_rllib.common import ConduitAlgorithmMixin
from conduit_rllib.compat import (
    DQN,
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    REPLAY_BUFFER_SAMPLE_TIMER,
    REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
    TIMERS,
    DQNConfig,
    calculate_rr_weights,
    learner_frame_stack,
    pop_td_errors,
)
from conduit_rllib.replay import ConduitReplay
from conduit_rllib.validate import check_dqn_config

log = logging.getLogger(__name__)


def buffer_config(config: DQNConfig) -> BufferConfig:
    """RLlib's ``replay_buffer_config`` as a Conduit ``BufferConfig`` (validated by ``check_dqn_config``)."""
    rb = config.replay_buffer_config
    kind = rb["type"] if isinstance(rb["type"], str) else rb["type"].__name__
    capacity = int(rb.get("capacity", 50_000))
    if "Prioritized" not in kind:
        return BufferConfig.uniform_replay(capacity, timeout_s=600.0)
    return BufferConfig.prioritized_replay(
        capacity,
        alpha=float(rb.get("alpha", 0.6)),
        beta=float(rb.get("beta", 0.4)),
        priority_eps=float(rb.get("epsilon", 1e-6)),
        timeout_s=600.0,
    )


class ConduitDQN(ConduitAlgorithmMixin, DQN):
    """DQN whose replay path runs on Conduit. Use ``conduit_rllib.enable(config)`` or set ``algo_class``."""

    def setup(self, config: Any) -> None:
        check_dqn_config(config)
        super().setup(config)
        self._check_spaces(discrete_actions=True)
        frame_stack = learner_frame_stack(self.config, self)
        if frame_stack is not None and self.config.episode_lookback_horizon < frame_stack - 1:
            log.warning(
                "frame stacking over %d frames with episode_lookback_horizon=%d: RLlib's env-to-module "
                "stacks zero-fill the frames older than the lookback at every fragment boundary, while "
                "Conduit trains on the episode's true stacks; set "
                "config.env_runners(episode_lookback_horizon=%d) to act on the same stacks",
                frame_stack,
                self.config.episode_lookback_horizon,
                frame_stack - 1,
            )
        self._replay = replay = ConduitReplay(
            self._conduit_settings(),
            buffer_config(self.config),
            n_step=int(self.config.n_step),
            gamma=float(self.config.gamma),
            device=self._learner_device(),
            num_learners=self.config.num_learners,
            seed=self._conduit_seed(),
            frame_stack=frame_stack,
        )
        self._start_conduit(replay)

    def training_step(self) -> None:
        store_weight, train_weight = calculate_rr_weights(self.config)
        sampling_s, learning_s, env_steps = 0.0, 0.0, 0  # the producer's and consumer's compute (auto)
        for _ in range(store_weight):
            t0 = time.perf_counter()
            episodes, env_runner_results = self._sample()
            sampling_s += time.perf_counter() - t0
            self.metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)
            with self.metrics.log_time((TIMERS, REPLAY_BUFFER_ADD_DATA_TIMER)):
                env_steps += self._replay.add(episodes, version=self._policy_version)

        if self._sampled_ts() < self.config.num_steps_sampled_before_learning_starts:
            return
        if not self._replay.ready():
            return
        for _ in range(train_weight):
            with self.metrics.log_time((TIMERS, REPLAY_BUFFER_SAMPLE_TIMER)):
                train = self._replay.sample(self.config.total_train_batch_size)
            t0 = time.perf_counter()
            with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
                learner_results = self.learner_group.update(**train.kwargs, timesteps=self._timesteps())
                self._policy_version += 1
                td_errors = pop_td_errors(learner_results)
                self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
            learning_s += time.perf_counter() - t0
            with self.metrics.log_time((TIMERS, REPLAY_BUFFER_UPDATE_PRIOS_TIMER)):
                self._replay.update_priorities(train, td_errors)

        self._sync_weights(learner_results)
        self._replay.end_step(
            sampling_s, learning_s, env_steps, train_weight, self.config.total_train_batch_size
        )

    def _sampled_ts(self) -> int:
        if self.config.count_steps_by == "agent_steps":
            return sum(
                self.metrics.peek((ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME), default={}).values()
            )
        return self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)

    def _timesteps(self) -> dict[str, Any]:
        return {
            NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
            ),
            NUM_AGENT_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                (ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME)
            ),
        }


__all__ = ["ConduitDQN", "buffer_config"]
