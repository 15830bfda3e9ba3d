"""``ConduitPPO``: RLlib's PPO with GAE at ingestion and minibatches prepared by Conduit.

The learner's update (loss, optimizer, KL and entropy schedules) is RLlib's own; it receives every
epoch's minibatches as one pre-ordered batch (``PreparedMinibatches``), so RLlib's learner connector
and per-epoch reshuffle are skipped. With the learner class ``enable()`` sets
(``ConduitLearnerMixin`` in front of RLlib's), ``Learner.update`` iterates that batch as ready-made
views instead of slicing it per minibatch; any other learner slices it in the same order. It holds as
many minibatches of ``minibatch_size`` rows as RLlib's own PPO makes on the same episodes
(``onpolicy.rllib_minibatches``: RLlib pads every episode chunk by one masked step), so an A/B
comparison does equal work.
"""

from __future__ import annotations

from typing import Any

import torch

from conduit_rllib.common import ConduitAlgorithmMixin
from conduit_rllib.compat import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    PPO,
    TIMERS,
    Columns,
    call_first_learner,
    learner_device,
    local_learner,
    module_spaces,
)
from conduit_rllib.onpolicy import ConduitOnPolicy
from conduit_rllib.validate import check_ppo_config


class _ValueFns:
    """``value_fns[mid](obs)``: the learner module's value estimates, computed where the module lives."""

    def __init__(self, learner_group: Any) -> None:
        self.learner_group = learner_group

    def __getitem__(self, mid: str) -> Any:
        lg = self.learner_group
        if lg.is_local:
            learner = local_learner(lg)
            module = learner.module[mid]

            def local(obs: torch.Tensor) -> torch.Tensor:
                return module.compute_values({Columns.OBS: obs.to(learner_device(learner))}).to("cpu")

            return local

        def remote(obs: torch.Tensor) -> torch.Tensor:
            arr = obs.numpy()

            def fn(learner: Any) -> Any:
                with torch.no_grad():
                    out = learner.module[mid].compute_values(
                        {Columns.OBS: torch.from_numpy(arr).to(learner_device(learner))}
                    )
                return out.cpu().numpy()

            return torch.tensor(call_first_learner(lg, fn))

        return remote


class ConduitPPO(ConduitAlgorithmMixin, PPO):
    """PPO whose experience path runs on Conduit. Use ``conduit_rllib.enable(config)`` or set ``algo_class``."""

    def setup(self, config: Any) -> None:
        check_ppo_config(config)
        super().setup(config)
        self._conduit_settings().scheduler(algo="ppo")  # a knob that does not apply to PPO raises here
        self._check_spaces(discrete_actions=False)
        self._onpolicy = onpolicy = ConduitOnPolicy(
            self._conduit_settings(),
            _ValueFns(self.learner_group),
            gamma=float(self.config.gamma),
            lambda_=float(self.config.lambda_),
            capacity=4 * int(self.config.total_train_batch_size) + 10_000,
            device=self._learner_device(),
            num_learners=self.config.num_learners,
            seed=self._conduit_seed(),
            action_spaces={mid: act for mid, (_, act) in module_spaces(self).items()},
        )
        self._start_conduit(onpolicy)

    def training_step(self) -> None:
        by = "max_agent_steps" if self.config.count_steps_by == "agent_steps" else "max_env_steps"
        episodes, env_runner_results = self._sample(**{by: self.config.total_train_batch_size})
        if not episodes:
            return
        self.metrics.aggregate(env_runner_results, key=ENV_RUNNER_RESULTS)

        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            self._onpolicy.add(episodes, version=self._policy_version)
            train = self._onpolicy.deliver(self.config.num_epochs, self.config.minibatch_size)
            learner_results = self.learner_group.update(
                **train.kwargs,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
                    ),
                    NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                        (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), default=0
                    ),
                },
                num_epochs=1,
                minibatch_size=train.deliveries["minibatch_size"],
                shuffle_batch_per_epoch=False,
            )
            self._policy_version += 1
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)

        self._sync_weights(learner_results)
