"""Env-runner episodes → flat step columns, one ColumnBatch per module.

This is the only place with Python work per *fragment* (one call per episode chunk, never per step):
each chunk's arrays are read once and concatenated column by column.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from conduit import ColumnBatch
from conduit_rllib.compat import Columns, MultiAgentEpisode, chunk_arrays

DEFAULT_MODULE = "default_policy"


def by_module(episodes: list[Any]) -> dict[str, list[Any]]:
    """Single-agent episode chunks grouped by the module that acted in them (sorted by module id)."""
    if len(episodes) == 1 and not isinstance(episodes[0], MultiAgentEpisode):
        ep = episodes[0]
        return {ep.module_id or DEFAULT_MODULE: [ep]} if len(ep) > 0 else {}
    out: dict[str, list[Any]] = defaultdict(list)
    for ep in episodes:
        if isinstance(ep, MultiAgentEpisode):
            for sa in ep.agent_episodes.values():
                if len(sa) > 0:
                    out[sa.module_id].append(sa)
        elif len(ep) > 0:
            out[ep.module_id or DEFAULT_MODULE].append(ep)
    return dict(sorted(out.items())) if len(out) > 1 else out


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


class _Segment:
    """Steps of one episode staged since the last pack (plus the held-back tail of earlier chunks)."""

    __slots__ = ("acts", "done", "obs", "rews", "steps", "terminated")

    def __init__(self, obs: np.ndarray, act: np.ndarray, rew: np.ndarray) -> None:
        self.obs, self.acts, self.rews = [obs], [act], [rew]
        self.steps = len(act)
        self.done = self.terminated = False


class TransitionPacker:
    """Step columns for DQN's n-step ingestion operator, staged chunk by chunk and packed in one go.

    ``stage(chunks)`` costs a few attribute reads per episode chunk (no numpy work); ``pack()`` turns
    everything staged into one ``ColumnBatch`` with one ``np.concatenate`` per column and index
    arithmetic (no Python per step). Consecutive chunks of one episode are joined into one segment.
    With ``n_step > 1`` the last ``n_step - 1`` steps of an unfinished episode are held back until its
    next chunk arrives, so every stored transition gets its full n-step return (RLlib's episode buffer
    truncates n at the tail of an unfinished episode instead). Rows: ``obs``, ``next_obs`` (one step),
    ``actions``, ``rewards`` (one step), ``terminateds`` (one step), ``seg_end`` and ``emit``.
    """

    def __init__(self, n_step: int, max_pending: int = 100_000) -> None:
        self.n_step = n_step
        self.hold = n_step - 1
        self.max_pending = max_pending
        self._segs: OrderedDict[Any, _Segment] = OrderedDict()
        self.staged = 0  # steps staged since the last pack

    def stage(self, chunks: Iterable[Any]) -> int:
        """Remember ``chunks`` (finalized episode chunks, in sampling order); returns the steps added."""
        added = 0
        segs = self._segs
        for ep in chunks:
            obs, act, rew = self._arrays(ep)
            seg = segs.get(ep.id_)
            if seg is None or seg.done:
                seg = segs[ep.id_] = _Segment(obs, act, rew)
            else:
                seg.obs.append(obs[1:])
                seg.acts.append(act)
                seg.rews.append(rew)
                seg.steps += len(act)
            if ep.is_done:
                seg.done = True
                seg.terminated = bool(ep.is_terminated)
            added += len(act)
        self.staged += added
        return added

    def _arrays(self, ep: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(observations, actions, rewards)`` of a chunk (``FramePacker`` stores frames, returns references)."""
        return chunk_arrays(ep)

    def pack(self, chunks: Iterable[Any] = ()) -> ColumnBatch | None:
        """Stage ``chunks``, then everything staged as one batch of step rows (``None``: nothing to emit)."""
        self.stage(chunks)
        self.staged = 0
        hold = self.hold
        packed: list[_Segment] = []
        emits: list[int] = []
        carry: OrderedDict[Any, _Segment] = OrderedDict()
        for key, seg in self._segs.items():
            emit = seg.steps if seg.done else max(0, seg.steps - hold)
            if emit > 0:
                packed.append(seg)
                emits.append(emit)
                if not seg.done:  # its next segment starts with the steps held back
                    carry[key] = _tail(seg, seg.steps - emit)
            elif not seg.done:
                carry[key] = seg
        if not packed:
            self._segs = carry
            self._evict()
            return None
        obs_all = np.concatenate([o for seg in packed for o in seg.obs])
        act_all = np.concatenate([a for seg in packed for a in seg.acts])
        rew_all = np.concatenate([r for seg in packed for r in seg.rews])
        lens = np.fromiter((seg.steps for seg in packed), dtype=np.int64, count=len(packed))
        ends = np.cumsum(lens)
        total = int(ends[-1])
        seg_of = np.repeat(np.arange(len(packed)), lens)
        row = np.arange(total) + seg_of  # each segment has one more observation than steps
        local = np.arange(total) - (ends - lens)[seg_of]
        term = np.zeros(total, dtype=bool)
        term_segs = np.fromiter((seg.terminated for seg in packed), dtype=bool, count=len(packed))
        term[ends[term_segs] - 1] = True
        self._segs = carry
        self._evict()
        return ColumnBatch(
            {
                "obs": _as_column(obs_all[row]),
                "next_obs": _as_column(obs_all[row + 1]),
                "actions": torch.from_numpy(act_all.astype(np.int64, copy=False)),
                "rewards": torch.from_numpy(rew_all.astype(np.float32, copy=False)),
                "terminateds": torch.from_numpy(term),
                "seg_end": torch.from_numpy(np.repeat(ends, lens)),
                "emit": torch.from_numpy(local < np.repeat(np.asarray(emits, dtype=np.int64), lens)),
            }
        )

    def _evict(self) -> None:
        while len(self._segs) > self.max_pending:
            self._segs.popitem(last=False)

    def state_dict(self) -> dict[str, Any]:
        """Staged and held-back steps per episode (pack first to store only the held-back tails)."""
        return {
            "segments": {
                key: (
                    np.concatenate(s.obs),
                    np.concatenate(s.acts),
                    np.concatenate(s.rews),
                    s.done,
                    s.terminated,
                )
                for key, s in self._segs.items()
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._segs = OrderedDict()
        for key, (obs, act, rew, done, terminated) in state.get("segments", {}).items():
            seg = _Segment(obs, act, rew)
            seg.done, seg.terminated = done, terminated
            self._segs[key] = seg


def _tail(seg: _Segment, k: int) -> _Segment:
    """The last ``k`` steps of ``seg`` and their ``k + 1`` observations, as a new segment."""
    if k == 0:
        last = seg.obs[-1][-1:] if len(seg.obs[-1]) else np.concatenate(seg.obs)[-1:]
        return _Segment(last, seg.acts[0][:0], seg.rews[0][:0])
    obs, act, rew = np.concatenate(seg.obs), np.concatenate(seg.acts), np.concatenate(seg.rews)
    return _Segment(obs[-(k + 1) :], act[-k:], rew[-k:])


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
