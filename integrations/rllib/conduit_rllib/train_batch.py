"""Delivered columns → what ``LearnerGroup.update`` takes (a MultiAgentBatch, or object refs per learner)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from conduit import ColumnBatch
from conduit_rllib.compat import MultiAgentBatch, SampleBatch, tensor_sample_batch


def to_sample_batch(batch: ColumnBatch, extra: Mapping[str, torch.Tensor] | None = None) -> SampleBatch:
    """A ``SampleBatch`` of ``batch``'s tensors (plus ``extra``), without a copy."""
    cols: dict[str, Any] = dict(batch.columns)
    if extra:
        cols.update(extra)
    return tensor_sample_batch(cols, batch.size)


@dataclass
class LearnerInput:
    """Keyword arguments for ``learner_group.update`` plus what priority updates need later."""

    kwargs: dict[str, Any]
    deliveries: dict[str, Any] = field(default_factory=dict)


def learner_input(
    per_rank: list[dict[str, SampleBatch]],
    env_steps: int,
    remote: bool,
    make: Callable[[dict[str, SampleBatch], int], MultiAgentBatch] = MultiAgentBatch,
) -> dict[str, Any]:
    """``batch=`` for a local learner, ``batch_refs=`` (one ``ray.put`` per learner) for remote ones."""
    if not remote:
        return {"batch": make(per_rank[0], env_steps)}
    share = max(1, env_steps // len(per_rank))
    return {"batch_refs": [ray.put(make(p, share)) for p in per_rank]}
