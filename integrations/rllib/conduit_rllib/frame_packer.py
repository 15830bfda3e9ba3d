"""Episode chunks → frames stored once, and step rows whose observations are frame references.

``FramePacker`` is ``TransitionPacker`` with one change: as a chunk is staged its new frames go to
the module's :class:`~conduit_rllib.frames.FrameStore` (one append per chunk) and the chunk's
observations become frame references ``[T + 1, F]``: the ids of the frames RLlib's ``FrameStacking``
stacks for that observation, oldest first, ``-1`` before the episode's first frame. The n-step
operator then carries references instead of frames, and the delivery operator
(:func:`~conduit_rllib.frames.frame_stack_operator`) turns them into stacks.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from conduit_rllib.compat import chunk_arrays
from conduit_rllib.fragments import TransitionPacker
from conduit_rllib.frames import FrameCodec, FrameStore, frame_shape

FRAME_HEADROOM = 0.25  # frames kept beyond one per transition: last observations, held-back steps


def frame_capacity(capacity: int, n_step: int, num_frames: int) -> int:
    """Frames a store keeps for a replay of ``capacity`` transitions: one per transition plus
    ``FRAME_HEADROOM`` for each episode's last observation and the steps still staged (enough while
    episodes average more than ``1 / FRAME_HEADROOM`` steps; a shortfall raises, never misdelivers)."""
    return capacity + int(capacity * FRAME_HEADROOM) + 64 * (n_step + num_frames)


class FramePacker(TransitionPacker):
    """Step rows for DQN's n-step operator with frame references as ``obs`` / ``next_obs``.

    Args:
        n_step: as ``TransitionPacker``.
        num_frames: frames per stacked observation (RLlib's ``FrameStacking(num_frames=...)``).
        capacity: frames the store keeps (:func:`frame_capacity`); the store is built on the first
            chunk (its frames give the shape and the codec).
    """

    def __init__(
        self,
        n_step: int,
        num_frames: int,
        capacity: int,
        max_pending: int = 100_000,
        memory_budget: int | None = None,
        disk_path: str | None = None,
    ) -> None:
        super().__init__(n_step, max_pending)
        self.num_frames = num_frames
        self.frame_capacity = capacity
        self.memory_budget, self.disk_path = memory_budget, disk_path
        self.store: FrameStore | None = None
        # per unfinished episode: the references of its latest observation [F]
        self._last: OrderedDict[Any, np.ndarray] = OrderedDict()

    def _arrays(self, ep: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, act, rew = chunk_arrays(ep)
        store = self.store
        if store is None:
            h, w = frame_shape(obs, "frame-once storage")
            store = self.store = self._new_store(h, w, FrameCodec.of(obs))
        last = self._last.pop(ep.id_, None)
        if last is None:  # the episode's first chunk we see: its first observation starts it
            first = store.append(obs)
            before = np.full(self.num_frames - 1, -1, dtype=np.int64)
            seq = np.concatenate([before, np.arange(first, first + len(obs), dtype=np.int64)])
        else:  # its first observation is the previous chunk's last
            first = store.append(obs[1:])
            seq = np.concatenate([last, np.arange(first, first + len(obs) - 1, dtype=np.int64)])
        refs = sliding_window_view(seq, self.num_frames)  # [T + 1, F], a view
        if not ep.is_done:
            self._last[ep.id_] = refs[-1].copy()
            while len(self._last) > self.max_pending:
                self._last.popitem(last=False)
        return np.ascontiguousarray(refs), act, rew

    def _new_store(self, h: int, w: int, codec: FrameCodec) -> FrameStore:
        return FrameStore(h, w, self.frame_capacity, codec, self.memory_budget, self.disk_path)

    def state_dict(self, frames: bool = True) -> dict[str, Any]:
        """The packer's state; with ``frames=False`` the frame store's shape and codec without its frames
        (saved apart, incrementally: ``FrameStore.checkpoint``)."""
        state = super().state_dict()
        state["frame_refs"] = dict(self._last)
        if self.store is not None:
            h, w = self.store.shape
            state["frame_store"] = {"shape": (h, w), "normalized": self.store.codec.normalized}
            if frames:
                state["frame_store"]["tensors"] = self.store.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the frames too if it holds them; else load them into :attr:`store`)."""
        super().load_state_dict(state)
        self._last = OrderedDict(state.get("frame_refs", {}))
        saved = state.get("frame_store")
        if saved is not None:
            h, w = saved["shape"]
            codec = FrameCodec(bool(saved["normalized"]))
            if self.store is None or self.store.shape != (h, w) or self.store.codec != codec:
                self.store = self._new_store(h, w, codec)
            if "tensors" in saved:
                self.store.load_state_dict(saved["tensors"])  # in place: delivery operators hold the store


__all__ = ["FRAME_HEADROOM", "FramePacker", "frame_capacity"]
