"""Episode chunks → frames stored once, and step rows whose observations are frame references.

``FramePacker`` is ``TransitionPacker`` with one change: as a chunk is staged its new frames go to
the module's :class:`~conduit_rllib.frames.FrameStore` (one append per chunk) and the chunk's
observations become frame references ``[T + 1, F]``: the ids of the frames RLlib's ``FrameStacking``
stacks for that observation, oldest first, ``-1`` before the episode's first frame. The n-step
operator then carries references instead of frames, and the delivery operator
(:func:`~conduit_rllib.frames.frame_stack_operator`) turns them into stacks.

Under ``overlap="async"`` (``deferred``) staging does no pass over the pixels: a chunk's new frames get
their ids (the next ids in append order, so the references are known at once) and are queued as they
are; :func:`frame_ingest_operator`, the first ingestion operator of the module's Conduit, encodes and
appends everything queued, in order, on the Conduit's ingestion worker before that put's rows go on to
the n-step operator and the buffer. A transition is therefore inserted (sampleable) only after every
frame it references is in the store; the operator checks it and refuses rows that reference a frame
not stored.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from conduit import ColumnBatch, Operator
from conduit_rllib.compat import chunk_arrays
from conduit_rllib.errors import FrameFormatError, FrameStoreError
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
        deferred: queue each chunk's frames for :meth:`store_pending` (run by
            :func:`frame_ingest_operator` on the ingestion worker) instead of appending them while
            staging. Shapes and dtypes are still checked while staging; values when encoded.
    """

    def __init__(
        self,
        n_step: int,
        num_frames: int,
        capacity: int,
        max_pending: int = 100_000,
        memory_budget: int | None = None,
        disk_path: str | None = None,
        deferred: bool = False,
    ) -> None:
        super().__init__(n_step, max_pending)
        self.num_frames = num_frames
        self.frame_capacity = capacity
        self.memory_budget, self.disk_path = memory_budget, disk_path
        self.deferred = deferred
        self.store: FrameStore | None = None
        # per unfinished episode: the references of its latest observation [F]
        self._last: OrderedDict[Any, np.ndarray] = OrderedDict()
        # deferred: (first id, frames) handed out and not yet stored, in id order. The staging thread
        # appends on the right, store_pending pops on the left after the append (so an empty queue
        # means store.appended is the next id).
        self._pending: deque[tuple[int, np.ndarray]] = deque()
        self._storing = threading.Lock()  # one store_pending at a time (the worker, or a settle)
        self._bad: list[tuple[int, int, str]] = []  # [first, end) ids stored as padding, and why
        self._broken: str | None = None  # the store lost step with the ids handed out: why

    @property
    def pending_frames(self) -> int:
        """Frames handed out (referenced) and not yet stored."""
        return sum(len(f) for _, f in list(self._pending))

    def _arrays(self, ep: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs, act, rew = chunk_arrays(ep)
        store = self.store
        if store is None:
            h, w = frame_shape(obs, "frame-once storage")
            store = self.store = self._new_store(h, w, FrameCodec.of(obs))
        last = self._last.get(ep.id_)
        new = obs if last is None else obs[1:]  # a later chunk's first observation is the last one's
        first = self._take_ids(store, new)  # raises (shape, dtype) before any state changes
        if last is None:  # the episode's first chunk we see: its first observation starts it
            last = np.full(self.num_frames - 1, -1, dtype=np.int64)
        else:
            del self._last[ep.id_]
        seq = np.concatenate([last, np.arange(first, first + len(new), dtype=np.int64)])
        refs = sliding_window_view(seq, self.num_frames)  # [T + 1, F], a view
        if not ep.is_done:
            self._last[ep.id_] = refs[-1].copy()
            while len(self._last) > self.max_pending:
                self._last.popitem(last=False)
        return np.ascontiguousarray(refs), act, rew

    def _take_ids(self, store: FrameStore, frames: np.ndarray) -> int:
        """The id of ``frames``' first frame: appended now, or (``deferred``) queued for
        :meth:`store_pending` under the next ids (a reference to the chunk's array, no copy)."""
        if not self.deferred:
            return store.append(frames)
        if self._broken is not None:
            raise FrameStoreError(self._broken)
        store.check(frames)
        try:
            first, queued = self._pending[-1]
            nxt = first + len(queued)
        except IndexError:  # nothing queued: every id handed out is stored
            nxt = store.appended
        if len(frames):
            self._pending.append((nxt, frames))
        return nxt

    def store_pending(self) -> str | None:
        """Encode and append every queued frame, in id order (the ingestion worker's part of a deferred
        add). A chunk whose values the codec refuses is stored as padding, so the ids after it stay
        right, and remembered: rows that reference it are refused (:meth:`check_rows`). Returns why
        chunks were refused in this call (None: none were).

        Raises:
            FrameStoreError: an append failed otherwise (then, and from then on: the store may have lost
                step with the ids handed out).
        """
        refused: list[str] = []
        with self._storing:
            store = self.store
            if self._broken is not None:
                self._pending.clear()  # queued before staging saw the failure; their rows are refused
                raise FrameStoreError(self._broken)
            while self._pending:
                first, frames = self._pending[0]
                assert store is not None  # built with the first chunk, before its frames were queued
                try:
                    try:
                        got = store.append(frames)
                    except FrameFormatError as e:
                        got = store.append_padding(len(frames))
                        self._refuse(first, first + len(frames), str(e))
                        refused.append(f"frames {first}..{first + len(frames) - 1}: {e}")
                    if got != first:
                        raise RuntimeError(f"frames appended at id {got}, referenced as {first}")
                except Exception as e:  # noqa: BLE001 - kept: every later call raises it
                    self._broken = (
                        f"the frame store failed to store frames {first}..{first + len(frames) - 1} "
                        f"({e!r}); the references handed out may no longer match the frames stored, so "
                        "this module's transitions are refused from now on: rebuild the replay "
                        "(restore a checkpoint)"
                    )
                    self._pending.clear()  # their rows are refused: nothing waits for them
                    raise FrameStoreError(self._broken) from e
                self._pending.popleft()
        return "; ".join(refused) or None

    def _refuse(self, first: int, end: int, why: str) -> None:
        """Remember ids ``[first, end)`` as not stored (ranges long overwritten are forgotten)."""
        bad = self._bad
        if bad and bad[-1][1] == first:  # the same failure chunk after chunk: one range
            bad[-1] = (bad[-1][0], end, bad[-1][2])
        else:
            bad.append((first, end, why))
        assert self.store is not None
        oldest = self.store.appended - self.store.capacity
        self._bad = [b for b in bad if b[1] > oldest]

    def check_rows(self, batch: ColumnBatch, refused: str | None = None) -> None:
        """Refuse ``batch`` (step rows about to be ingested) if a frame it references is not stored: not
        appended yet (never, when the operator runs first) or refused by the codec; or if ``refused`` (this
        ingestion's :meth:`store_pending` refused frames, reported here once).

        Raises:
            FrameFormatError: naming the frames and why the codec refused them.
            FrameStoreError: a reference past the frames stored, or the store is broken.
        """
        if self._broken is not None:
            raise FrameStoreError(self._broken)
        if not batch.size:
            return
        obs, nxt = batch["obs"], batch["next_obs"]
        assert self.store is not None and isinstance(obs, torch.Tensor) and isinstance(nxt, torch.Tensor)
        refs = torch.cat([obs, nxt], 1)
        newest = int(refs.max())
        if newest >= self.store.appended:
            raise FrameStoreError(
                f"step rows reference frame {newest} while {self.store.appended} frames are stored: a "
                "transition is never stored before its frames"
            )
        hits = [b for b in self._bad if bool(((refs >= b[0]) & (refs < b[1])).any())]
        if hits:
            first, end, why = hits[0]
            raise FrameFormatError(
                f"these step rows use frames {first}..{end - 1}, which could not be stored ({why}); "
                "they were kept as padding and are never delivered"
            )
        if refused is not None:
            raise FrameFormatError(f"frames could not be stored: {refused}")

    def _new_store(self, h: int, w: int, codec: FrameCodec) -> FrameStore:
        return FrameStore(h, w, self.frame_capacity, codec, self.memory_budget, self.disk_path)

    def state_dict(self, frames: bool = True) -> dict[str, Any]:
        """The packer's state; with ``frames=False`` the frame store's shape and codec without its frames
        (saved apart, incrementally: ``FrameStore.checkpoint``)."""
        self.store_pending()  # the ids referenced are stored (a replay settles first: then nothing is)
        state = super().state_dict()
        state["frame_refs"] = dict(self._last)
        state["frames_refused"] = list(self._bad)
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
        self._bad = [(int(a), int(b), str(w)) for a, b, w in state.get("frames_refused", [])]
        self._pending.clear()
        self._broken = None
        saved = state.get("frame_store")
        if saved is not None:
            h, w = saved["shape"]
            codec = FrameCodec(bool(saved["normalized"]))
            if self.store is None or self.store.shape != (h, w) or self.store.codec != codec:
                self.store = self._new_store(h, w, codec)
            if "tensors" in saved:
                self.store.load_state_dict(saved["tensors"])  # in place: delivery operators hold the store


def frame_ingest_operator(module: str, packer: FramePacker) -> Operator:
    """The first ingestion operator of a frame-stacking module: stores the frames queued so far (a
    deferred add's encode and append, on the ingestion worker under ``async``), then passes the step rows
    on only if every frame they reference is stored (:meth:`FramePacker.check_rows`); the errors name
    ``module``."""

    def store_frames(batch: ColumnBatch) -> ColumnBatch:
        try:
            packer.check_rows(batch, packer.store_pending())
        except (FrameFormatError, FrameStoreError) as e:
            raise type(e)(f"module {module!r}: {e}") from e
        return batch

    return Operator("frames", store_frames)


__all__ = ["FRAME_HEADROOM", "FramePacker", "frame_capacity", "frame_ingest_operator"]
