"""PPO's GAE in the streaming mode: per-piece GAE, whole-batch whitening.

verl's ``core_algos.compute_gae_advantage_return`` does two things: the GAE recursion (per
trajectory, so exact on any piece of the batch) and ``masked_whiten`` of the advantages over the
*whole batch's* response tokens (a batch statistic). The streaming mode runs verl's own
``_compute_advantage`` per piece with the whitening switched off (``deferred_whitening``: the
recursion below is verl's, line for line, minus the last step), then whitens every advantage once
over the whole batch (``whiten_advantages``) before the critic and actor updates. Returns
(advantages + values, before whitening) are per trajectory and need nothing more.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from conduit.errors import ConfigError
from conduit_verl import compat

GAE = "gae"


def uses_gae(config: Any) -> bool:
    """True when the trainer's advantage estimator is GAE (PPO with a critic)."""
    return str(config.algorithm.adv_estimator) == GAE


def check_streamable(config: Any) -> None:
    """GAE options that need the whole batch inside the advantage step cannot stream."""
    if uses_gae(config) and config.algorithm.get("use_pf_ppo", False):
        raise ConfigError(
            "algorithm.use_pf_ppo=True re-samples the whole batch by reward inside the advantage "
            "step; the conduit mode streams pieces of it. Use trainer.v1.conduit.overlap=sync."
        )


def gae_without_whitening(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: torch.Tensor,
    lam: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl 0.9.1 ``core_algos.compute_gae_advantage_return`` without its final ``masked_whiten``."""
    with torch.no_grad():
        nextvalues: Any = 0
        lastgaelam: Any = 0
        advantages_reversed = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam_ = delta + gamma * lam * lastgaelam
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
    return advantages, returns


@contextlib.contextmanager
def deferred_whitening() -> Iterator[None]:
    """Within the block, verl's GAE (looked up as ``core_algos.compute_gae_advantage_return`` by
    ``ray_trainer.compute_advantage``) skips the batch whitening. Driver process, one thread."""
    with compat.gae_function(gae_without_whitening):
        yield


def per_piece(method: Any) -> Any:
    """Wrap a trainer's ``_compute_advantage`` so that it leaves the whitening for later."""

    @functools.wraps(method)
    def compute(batch: Any, metrics: dict) -> Any:
        with deferred_whitening():
            return method(batch, metrics=metrics)

    return compute


def whiten_advantages(batch: Any) -> None:
    """Whiten the advantages of every sample of ``batch`` (a ``KVBatchMeta``) in TransferQueue.

    Same statistic as verl's sync step: ``masked_whiten`` over all response tokens of the batch
    (rows padded to the batch's longest response, the padding masked out).
    """
    from tensordict import TensorDict

    data = compat.tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages", "response_mask"]
    )
    nested_mask = data["response_mask"]
    padded = data.to_padded_tensor()
    adv = compat.masked_whiten(padded["advantages"], padded["response_mask"])
    out = TensorDict({"advantages": compat.response_to_nested(adv, nested_mask)}, batch_size=len(batch))
    compat.tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)
