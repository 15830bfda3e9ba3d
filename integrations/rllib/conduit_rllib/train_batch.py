"""Delivered columns → what ``LearnerGroup.update`` takes (a MultiAgentBatch, or object refs per learner)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from conduit import ColumnBatch


def _fresh_attrs() -> dict[str, Any] | None:
    """The attributes ``SampleBatch.__init__`` sets on a plain batch of tensors (checked once)."""
    probe = SampleBatch({"x": torch.zeros(2)})
    attrs = dict(vars(probe))
    expected = {
        "time_major": None,
        "max_seq_len": None,
        "zero_padded": False,
        "_is_training": False,
        "num_grad_updates": None,
        "_slice_seq_lens_in_B": False,
        "get_interceptor": None,
        "count": 2,
    }
    mutable = {"accessed_keys", "added_keys", "deleted_keys", "intercepted_values", "_slice_map"}
    if set(attrs) != set(expected) | mutable or any(attrs[k] != v for k, v in expected.items()):
        return None  # another RLlib version: always take the constructor
    del expected["count"]
    return expected


_ATTRS = _fresh_attrs()


def to_sample_batch(batch: ColumnBatch, extra: Mapping[str, torch.Tensor] | None = None) -> SampleBatch:
    """A ``SampleBatch`` of ``batch``'s tensors (plus ``extra``), without a copy."""
    cols: dict[str, Any] = dict(batch.columns)
    if extra:
        cols.update(extra)
    return tensor_sample_batch(cols, batch.size)


def tensor_sample_batch(cols: dict[str, Any], count: int) -> SampleBatch:
    """A ``SampleBatch`` of ``count`` rows of fixed-shape tensors.

    Such columns need none of ``SampleBatch.__init__``'s conversions, so the batch gets the
    attributes that constructor would set (checked against it at import; else the constructor runs).
    """
    if _ATTRS is None or "seq_lens" in cols:
        return SampleBatch(cols)
    sb = dict.__new__(SampleBatch)
    dict.update(sb, cols)
    d = sb.__dict__
    d.update(_ATTRS)
    d["count"] = count
    d["accessed_keys"], d["added_keys"], d["deleted_keys"] = set(), set(), set()
    d["intercepted_values"], d["_slice_map"] = {}, []
    return sb


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
