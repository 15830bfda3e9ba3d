"""DQN's ingestion operator: n-step returns and next observations for a whole batch of steps."""

from __future__ import annotations

import torch

from conduit import ColumnBatch, Operator


def nstep_transitions(batch: ColumnBatch, n_step: int, gamma: float) -> ColumnBatch:
    """Transitions with n-step returns from flat step rows (see ``TransitionPacker``).

    For row ``i`` in a segment ending at ``e``: ``k = min(n, e - i)``,
    ``rewards = sum_{j<k} gamma^j r[i+j]``, ``new_obs = next_obs[i+k-1]``,
    ``terminateds = terminated[i+k-1]`` and ``n_step = k``; rows with ``emit == False`` are lookahead
    only and are dropped. ``n_step`` vectorised ops; no Python per row.
    """
    n = batch.size
    rows = torch.arange(n)
    seg_end = batch["seg_end"]
    k = torch.clamp(seg_end - rows, max=n_step)
    rew = batch["rewards"]
    ret = torch.zeros(n, dtype=torch.float32)
    for j in range(n_step):
        idx = torch.clamp(rows + j, max=n - 1)
        ret += (gamma**j) * rew.index_select(0, idx) * (j < k)
    last = rows + k - 1
    out = ColumnBatch(
        {
            "obs": batch["obs"],
            "new_obs": batch["next_obs"].index_select(0, last),
            "actions": batch["actions"],
            "rewards": ret,
            "terminateds": batch["terminateds"].index_select(0, last),
            "n_step": k.to(torch.float32),
        }
    )
    keep = batch["emit"].nonzero().squeeze(1)
    return out if keep.numel() == n else out.index(keep)


def nstep_operator(n_step: int, gamma: float) -> Operator:
    return Operator("nstep", lambda b: nstep_transitions(b, n_step, gamma))
