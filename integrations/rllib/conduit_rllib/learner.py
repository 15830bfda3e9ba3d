"""PPO's prepared minibatches, handed to RLlib's own ``Learner.update`` loop as ready-made views.

Conduit delivers every epoch's minibatches as one batch already in minibatch order
(``PreparedMinibatches``). A learner with ``ConduitLearnerMixin`` iterates it as views — one
``torch.split`` per column for the whole update and a few attribute writes per minibatch — instead of
RLlib's ``MiniBatchCyclicIterator``, which slices a ``SampleBatch`` per minibatch. Everything else in
``update`` (``_update``, metrics, ``after_gradient_based_update``) stays RLlib's. A learner without the
mixin still gets the same minibatches in the same order: the batch is a plain ``MultiAgentBatch`` to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from conduit_rllib.compat import (
    LearnerIteratorHook,
    MultiAgentBatch,
    PPOTorchLearner,
    learner_device,
    tensor_sample_batch,
)


class PreparedMinibatches(MultiAgentBatch):
    """Every minibatch of an update, concatenated in order (``minibatch_size`` rows each, per module).

    ``metrics`` (local learners only; never pickled) times each minibatch's preparation as exposed.
    """

    metrics: Any = None

    def __init__(
        self, policy_batches: dict[str, Any], env_steps: int, minibatch_size: int, metrics: Any = None
    ):
        super().__init__(policy_batches, env_steps)
        self.minibatch_size = minibatch_size
        self.metrics = metrics

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("metrics", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def num_minibatches(self) -> int:
        return min(len(b) for b in self.policy_batches.values()) // self.minibatch_size

    def minibatches(self, device: torch.device | str | None = None) -> Iterator[MultiAgentBatch]:
        """The minibatches in order, as views of this batch's tensors (moved to ``device`` once)."""
        mb, n = self.minibatch_size, self.num_minibatches()
        splits = {
            mid: {
                k: torch.split(v if device is None else v.to(device, non_blocking=True), mb)
                for k, v in sb.items()
            }
            for mid, sb in self.policy_batches.items()
        }
        metrics = self.metrics
        for i in range(n):
            if metrics is None:
                yield _minibatch(splits, i, mb)
            else:
                with metrics.span("rllib/minibatch", exposed=True):
                    out = _minibatch(splits, i, mb)
                yield out


def _minibatch(splits: dict[str, dict[str, tuple[torch.Tensor, ...]]], i: int, mb: int) -> MultiAgentBatch:
    return MultiAgentBatch(
        {
            mid: tensor_sample_batch({k: parts[i] for k, parts in cols.items()}, mb)
            for mid, cols in splits.items()
        },
        mb,
    )


class ConduitLearnerMixin(LearnerIteratorHook):
    """Put before an RLlib ``Learner`` class: iterates ``PreparedMinibatches`` as ready-made views."""

    def conduit_minibatches(self, batch: Any) -> Any:
        if not isinstance(batch, PreparedMinibatches):
            return None
        for mid in list(batch.policy_batches):
            if not self.should_module_be_updated(mid, batch):  # type: ignore[attr-defined]
                del batch.policy_batches[mid]
        if not batch.policy_batches:
            return {}
        if any(self.module[mid].is_stateful() for mid in batch.policy_batches):  # type: ignore[attr-defined]
            return None
        return batch.minibatches(learner_device(self))


def learner_class_for(base: type) -> type:
    """``base`` with ``ConduitLearnerMixin`` in front (``base`` itself if it already has it)."""
    if issubclass(base, ConduitLearnerMixin):
        return base
    if base is PPOTorchLearner:
        return ConduitPPOTorchLearner
    return type(f"Conduit{base.__name__}", (ConduitLearnerMixin, base), {})


class ConduitPPOTorchLearner(ConduitLearnerMixin, PPOTorchLearner):  # type: ignore[misc]
    """RLlib's PPO torch learner, iterating Conduit's prepared minibatches as views."""


__all__ = ["ConduitLearnerMixin", "ConduitPPOTorchLearner", "PreparedMinibatches", "learner_class_for"]
