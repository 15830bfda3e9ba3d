"""PPO's ingestion operator: GAE advantages and value targets for a whole batch of fragment steps."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from conduit import ColumnBatch, Operator

ValueFn = Callable[[torch.Tensor], torch.Tensor]


def segment_reverse_discounted_cumsum(x: torch.Tensor, seg_end: torch.Tensor, c: float) -> torch.Tensor:
    """``y[t] = sum_{k>=t, same segment} c^(k-t) x[k]`` for contiguous segments, without a loop per step.

    Segments are laid out as rows of a padded ``[S, T]`` matrix; along time the sum is a cumulative
    sum of ``c^t``-scaled values, done in blocks short enough for float64 to hold ``c^-t`` exactly
    enough (one block for any fragment shorter than ~9,000 steps at c = 0.94).
    """
    n = x.numel()
    if n == 0:
        return x.clone()
    lengths = torch.diff(torch.unique_consecutive(seg_end), prepend=torch.zeros(1, dtype=torch.int64))
    seg = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    local = torch.arange(n) - torch.repeat_interleave(seg_end.unique_consecutive() - lengths, lengths)
    t_max = int(lengths.max())
    pad = torch.zeros(lengths.numel(), t_max, dtype=torch.float64)
    pad[seg, local] = x.to(torch.float64)
    out = torch.zeros_like(pad)
    if c <= 0.0:
        out = pad
    else:
        block = t_max if c >= 1.0 else max(1, min(t_max, int(600.0 / -math.log(c))))
        carry = torch.zeros(pad.shape[0], dtype=torch.float64)
        for hi in range(t_max, 0, -block):
            lo = max(0, hi - block)
            scale = torch.full((hi - lo,), c, dtype=torch.float64).pow(
                torch.arange(hi - lo, dtype=torch.float64)
            )
            part = (pad[:, lo:hi] * scale).flip(1).cumsum(1).flip(1) / scale
            part = part + carry.unsqueeze(1) * (c * scale.flip(0))  # c^(hi-t) * y[hi]
            out[:, lo:hi] = part
            carry = part[:, 0]
    return out[seg, local].to(torch.float32)


def gae(batch: ColumnBatch, value_fn: ValueFn, gamma: float, lambda_: float) -> ColumnBatch:
    """Advantages and value targets per fragment, bootstrapping unfinished fragments from ``V(next_obs)``.

    Matches RLlib's ``GeneralAdvantageEstimation`` (with ``AddOneTsToEpisodesAndTruncate``): a
    terminated step has no bootstrap; a chunk cut by the sampler bootstraps from its last next
    observation; advantages never cross fragment boundaries. One value forward pass for the batch.
    """
    n = batch.size
    seg_end = batch["seg_end"]
    last = seg_end.unique_consecutive() - 1
    with torch.no_grad():
        values = value_fn(torch.cat([batch["obs"], batch["next_obs"].index_select(0, last)])).to(
            torch.float32
        )
    v, v_boot = values[:n], values[n:]
    next_v = torch.cat([v[1:], v.new_zeros(1)])
    next_v[last] = v_boot * (~batch["terminateds"].index_select(0, last)).to(torch.float32)
    delta = batch["rewards"] + gamma * next_v - v
    adv = segment_reverse_discounted_cumsum(delta, seg_end, gamma * lambda_)
    return ColumnBatch(
        {
            "obs": batch["obs"],
            "actions": batch["actions"],
            "action_logp": batch["action_logp"],
            "action_dist_inputs": batch["action_dist_inputs"],
            "advantages": adv,
            "value_targets": adv + v,
        }
    )


def gae_operator(value_fn: ValueFn, gamma: float, lambda_: float) -> Operator:
    return Operator("gae", lambda b: gae(b, value_fn, gamma, lambda_))


def normalize_advantages(batch: ColumnBatch) -> ColumnBatch:
    """RLlib's per-module normalisation over the whole train batch: ``(a - mean) / max(1e-4, std)``.

    ``std`` is the population standard deviation (numpy's default, which RLlib's connector uses).
    """
    adv = batch["advantages"]
    std = adv.std(correction=0) if adv.numel() > 1 else adv.new_ones(())
    return batch.with_columns(advantages=(adv - adv.mean()) / torch.clamp(std, min=1e-4))
