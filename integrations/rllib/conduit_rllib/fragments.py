"""Env-runner episodes → flat step columns, one ColumnBatch per module.

This is the only place with Python work per *fragment* (one call per episode chunk, never per step):
each chunk's arrays are read once and concatenated column by column.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

from conduit import ColumnBatch

DEFAULT_MODULE = "default_policy"


def by_module(episodes: Iterable[Any]) -> dict[str, list[Any]]:
    """Single-agent episode chunks grouped by the module that acted in them."""
    out: dict[str, list[Any]] = defaultdict(list)
    for ep in episodes:
        if isinstance(ep, MultiAgentEpisode):
            for sa in ep.agent_episodes.values():
                if len(sa) > 0:
                    out[sa.module_id].append(sa)
        elif len(ep) > 0:
            out[ep.module_id or DEFAULT_MODULE].append(ep)
    return out


def _segment_ends(lengths: list[int]) -> torch.Tensor:
    """Per row: the (exclusive) end index of its segment in the flat batch."""
    lens = torch.tensor(lengths, dtype=torch.int64)
    return torch.repeat_interleave(torch.cumsum(lens, 0), lens)


def _last_of_segment(lengths: list[int], flags: list[bool]) -> torch.Tensor:
    """Per row: True on the last row of a segment whose flag is set."""
    out = torch.zeros(sum(lengths), dtype=torch.bool)
    ends = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0) - 1
    out[ends[torch.tensor(flags, dtype=torch.bool)]] = True
    return out


class TransitionPacker:
    """Step columns for DQN's n-step ingestion operator.

    With ``n_step > 1`` the last ``n_step - 1`` steps of an unfinished episode are held back until its
    next chunk arrives, so every stored transition gets its full n-step return (RLlib's episode buffer
    truncates n at the tail of an unfinished episode instead). Rows: ``obs``, ``next_obs`` (one step),
    ``actions``, ``rewards`` (one step), ``terminateds`` (one step), ``seg_end`` and ``emit``.
    """

    def __init__(self, n_step: int, max_pending: int = 100_000) -> None:
        self.n_step = n_step
        self.max_pending = max_pending
        self._carry: OrderedDict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()

    def pack(self, chunks: list[Any]) -> ColumnBatch | None:
        obs_l, act_l, rew_l, lengths, emits, terms = [], [], [], [], [], []
        hold = self.n_step - 1
        for ep in chunks:
            obs, act, rew = ep.get_observations(), ep.get_actions(), ep.get_rewards()
            carry = self._carry.pop(ep.id_, None) if hold else None
            if carry is not None:
                obs = np.concatenate([carry[0][:-1], obs])
                act, rew = np.concatenate([carry[1], act]), np.concatenate([carry[2], rew])
            n = len(act)
            kept = n if ep.is_done else max(0, n - hold)
            if not ep.is_done and hold:
                k = min(hold, n)
                self._carry[ep.id_] = (obs[-(k + 1) :], act[-k:], rew[-k:])
                while len(self._carry) > self.max_pending:
                    self._carry.popitem(last=False)
            obs_l.append(obs)
            act_l.append(act)
            rew_l.append(rew)
            lengths.append(n)
            emits.append(kept)
            terms.append(bool(ep.is_terminated))
        if not lengths or sum(emits) == 0:
            return None
        lens = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lens)
        local = np.arange(ends[-1]) - np.repeat(ends - lens, lens)
        term = np.zeros(ends[-1], dtype=bool)
        term[ends[np.asarray(terms, dtype=bool)] - 1] = True
        obs_all = obs_l[0] if len(obs_l) == 1 else None
        return ColumnBatch(
            {
                "obs": _as_column(
                    obs_all[:-1] if obs_all is not None else np.concatenate([o[:-1] for o in obs_l])
                ),
                "next_obs": _as_column(
                    obs_all[1:] if obs_all is not None else np.concatenate([o[1:] for o in obs_l])
                ),
                "actions": torch.from_numpy(np.concatenate(act_l).astype(np.int64, copy=False)),
                "rewards": torch.from_numpy(np.concatenate(rew_l).astype(np.float32, copy=False)),
                "terminateds": torch.from_numpy(term),
                "seg_end": torch.from_numpy(np.repeat(ends, lens)),
                "emit": torch.from_numpy(local < np.repeat(np.asarray(emits, dtype=np.int64), lens)),
            }
        )

    def state_dict(self) -> dict[str, Any]:
        return {"carry": dict(self._carry)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._carry = OrderedDict(state.get("carry", {}))


class FragmentPacker:
    """Step columns for PPO's GAE ingestion operator (one segment per episode chunk).

    Rows: ``obs``, ``next_obs``, ``actions``, ``action_logp``, ``action_dist_inputs``, ``rewards``,
    ``terminateds`` (True on the last step of a terminated chunk) and ``seg_end``.
    """

    def pack(self, chunks: list[Any]) -> ColumnBatch | None:
        if not chunks:
            return None
        obs_l, act_l, rew_l, logp_l, dist_l, lengths, terms = [], [], [], [], [], [], []
        for ep in chunks:
            obs = ep.get_observations()
            obs_l.append(obs)
            act_l.append(ep.get_actions())
            rew_l.append(ep.get_rewards())
            logp_l.append(ep.get_extra_model_outputs(Columns.ACTION_LOGP))
            dist_l.append(ep.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS))
            lengths.append(len(obs) - 1)
            terms.append(bool(ep.is_terminated))
        actions = torch.from_numpy(np.concatenate(act_l))
        return ColumnBatch(
            {
                "obs": _float_or_long(torch.from_numpy(np.concatenate([o[:-1] for o in obs_l]))),
                "next_obs": _float_or_long(torch.from_numpy(np.concatenate([o[1:] for o in obs_l]))),
                "actions": actions.to(torch.float32 if actions.is_floating_point() else torch.int64),
                "action_logp": torch.from_numpy(np.concatenate(logp_l)).to(torch.float32),
                "action_dist_inputs": torch.from_numpy(np.concatenate(dist_l)).to(torch.float32),
                "rewards": torch.from_numpy(np.concatenate(rew_l)).to(torch.float32),
                "terminateds": _last_of_segment(lengths, terms),
                "seg_end": _segment_ends(lengths),
            }
        )


def _as_column(a: np.ndarray) -> torch.Tensor:
    """float32 for float observations, int64 otherwise (one conversion, no copy when already right)."""
    dtype = np.float32 if np.issubdtype(a.dtype, np.floating) else np.int64
    return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))


def _float_or_long(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32) if t.is_floating_point() else t.to(torch.int64)


def iter_chunks(grouped: dict[str, list[Any]]) -> Iterator[tuple[str, list[Any]]]:
    return iter(sorted(grouped.items()))
