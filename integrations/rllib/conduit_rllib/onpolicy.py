"""PPO's experience path on Conduit: fragments in (GAE at ingestion), epoch minibatch sequences out."""

from __future__ import annotations

import math
from typing import Any

import torch

from conduit import BufferConfig, ColumnBatch, Conduit, Operator
from conduit_rllib.common import ModuleConduits
from conduit_rllib.fragments import FragmentPacker, by_module
from conduit_rllib.gae import ValueFn, gae_operator, normalize_advantages
from conduit_rllib.learner import PreparedMinibatches
from conduit_rllib.ppo_schema import ppo_schemas
from conduit_rllib.settings import ConduitSettings
from conduit_rllib.train_batch import LearnerInput, learner_input, to_sample_batch


def rllib_minibatches(
    rows: dict[str, int], chunks: dict[str, int], num_epochs: int, minibatch_size: int, ranks: int = 1
) -> int:
    """Gradient updates (per learner) RLlib's own PPO makes on these episodes.

    One learner: RLlib's learner connector appends one masked step to every episode chunk, and its
    ``MiniBatchCyclicIterator`` cycles ``minibatch_size``-row slices until every module's padded batch
    is covered ``num_epochs`` times: ``max ceil(epochs * (rows + chunks) / minibatch)``. Conduit delivers
    that many ``minibatch_size``-row minibatches, all of real rows (so a little over ``num_epochs``
    passes over them). Several learners: RLlib fixes every learner's count in advance as
    ``int(epochs * max rows / (learners * minibatch))`` (``TrainingData._compute_num_total_minibatches``,
    unpadded), falling back to covering each learner's (padded) share when that is 0.
    """
    if ranks > 1:
        fixed = num_epochs * max(rows.values()) // (ranks * minibatch_size)
        if fixed > 0:
            return fixed
    return max(
        math.ceil(num_epochs * -(-(n + chunks.get(mid, 0)) // ranks) / minibatch_size)
        for mid, n in rows.items()
    )


class ConduitOnPolicy(ModuleConduits):
    """One FIFO (consume-once) Conduit per module; every iteration's batch is delivered exactly once.

    ``action_spaces`` (``{module_id: space}``): each module's first batch is checked against it
    (``ppo_schema.check_action_columns``); Discrete and Box actions alike.
    """

    def __init__(
        self,
        settings: ConduitSettings,
        value_fns: dict[str, ValueFn] | Any,
        gamma: float,
        lambda_: float,
        capacity: int,
        device: torch.device | str,
        num_learners: int,
        seed: int | None,
        action_spaces: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(settings, device, num_learners, seed)
        self.value_fns = value_fns
        self.action_spaces = action_spaces or {}  # per module: its first batch is checked against it
        self.gamma, self.lambda_ = gamma, lambda_
        self.capacity = capacity
        self.pending: dict[str, int] = {}
        self.chunks: dict[str, int] = {}  # episode chunks per module (RLlib pads each by one row)
        self.packer = FragmentPacker()
        self.version = 0
        self._shuffle_states: dict[str, torch.Tensor] = {}  # restored before the module's Conduit exists

    def _conduit(self, mid: str, sample: ColumnBatch) -> Conduit:
        c = self.conduits.get(mid)
        if c is None:
            put, stored = ppo_schemas(sample, self.action_spaces.get(mid), mid)
            c = Conduit(
                put,
                BufferConfig.on_policy(self.capacity, timeout_s=600.0, pins=self.settings.pins),
                self.settings.scheduler(algo="ppo"),
                ingest=[gae_operator(self.value_fns[mid], self.gamma, self.lambda_)],
                deliver=[Operator("normalize_advantages", normalize_advantages)],
                device=self.device,
                ranks=self.ranks,
                stored_schema=stored,
                seed=self.seed,
                metrics=self.metrics,
            )
            if mid in self._shuffle_states:
                c.shuffle_generator.set_state(self._shuffle_states.pop(mid))
            self.conduits[mid] = c
        return c

    def add(self, episodes: list[Any], version: int) -> None:
        """Ingest an iteration's fragments (weights are frozen while they were sampled)."""
        with self.metrics.span("rllib/add", exposed=True):
            for mid, chunks in sorted(by_module(episodes).items()):
                batch = self.packer.pack(chunks)
                if batch is None:
                    continue
                self._conduit(mid, batch).put(batch, version=version)
                self.pending[mid] = self.pending.get(mid, 0) + batch.size
                self.chunks[mid] = self.chunks.get(mid, 0) + len(chunks)
            self.version = version

    def deliver(self, num_epochs: int, minibatch_size: int | None) -> LearnerInput:
        """Each learner's rows in minibatch order, on the learner device: RLlib's number of updates.

        Each module's Conduit delivers its iteration once, through its prefetcher
        (``Conduit.get_epochs``): rows split over learners in contiguous shards (as RLlib's
        ``ShardBatchIterator``), a fresh permutation per epoch. Every learner and module gets the same
        number of minibatches (:func:`rllib_minibatches`), so multi-learner updates stay in step and the
        update does the work RLlib's own PPO would do on the same episodes.
        """
        with self.metrics.span("rllib/deliver", exposed=True):
            ranks = self.ranks
            padded = {mid: -(-(n + self.chunks.get(mid, 0)) // ranks) for mid, n in self.pending.items()}
            mb = minibatch_size or max(padded.values())  # RLlib: the whole (padded) batch per update
            k = rllib_minibatches(self.pending, self.chunks, num_epochs, mb, ranks)
            per_rank: list[dict[str, Any]] = [{} for _ in range(ranks)]
            steps = 0
            for mid, n in sorted(self.pending.items()):
                d = self.conduits[mid].get_epochs(
                    n, num_epochs=num_epochs, minibatch_size=mb, num_minibatches=k, version=self.version
                )
                for r, part in enumerate(d.parts):
                    per_rank[r][mid] = to_sample_batch(part.batch)
                steps += n
            self.pending.clear()
            self.chunks.clear()
            metrics = None if self.num_learners > 0 else self.metrics

            def make(batches: dict[str, Any], env_steps: int) -> PreparedMinibatches:
                return PreparedMinibatches(batches, env_steps, mb, metrics)

            kwargs = learner_input(per_rank, steps, remote=self.num_learners > 0, make=make)
            return LearnerInput(kwargs, {"minibatch_size": mb, "num_minibatches": k})

    def state_dict(self) -> dict[str, Any]:
        """The epoch shuffle's position per module (the on-policy buffers are empty between iterations)."""
        states = {mid: c.shuffle_generator.get_state() for mid, c in self.conduits.items()}
        return {"shuffle": {**self._shuffle_states, **states}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for mid, gen in state.get("shuffle", {}).items():
            if mid in self.conduits:
                self.conduits[mid].shuffle_generator.set_state(gen)
            else:
                self._shuffle_states[mid] = gen
