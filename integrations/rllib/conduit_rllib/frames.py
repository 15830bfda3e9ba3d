"""Frame-once storage for frame-stacked observations (Atari): each frame stored once, as uint8.

RLlib's frame stacking (``FrameStacking`` in RLlib's ``connectors/common/frame_stacking.py``, as the
env-to-module and the learner connector) keeps single frames ``[H, W, 1]`` in the episodes and builds
the stacked observation ``[H, W, F]`` (oldest frame first) from the last ``F`` observations; before
the episode's first observation it pads with ``fill=0.0`` in the frame's dtype
(``InfiniteLookbackBuffer.get(..., fill=0.0)``). Conduit stores each frame once in a
:class:`FrameStore` (a core buffer of uint8 frames, addressed by a global frame id) and
each observation is kept as ``F`` frame references (ids, ``-1`` before the episode's first frame), from
which the same stacks are built at delivery with one gather (:meth:`FrameStore.stacks`).

Frames from RLlib's Atari wrappers (``wrap_atari_for_new_api_stack``) are float32 ``u / 128 - 1`` for
integer ``u`` in 0..255 (``NormalizedImageEnv``); :class:`FrameCodec` stores ``u`` and decodes it
bit-exactly. uint8 frames are stored as they are.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from conduit import BufferConfig, Column, ColumnBatch, Operator, RateLimit, Schema
from conduit.build_buffer import build_buffer
from conduit.discovery import local_topology
from conduit.errors import ConduitError
from conduit.persist.checkpoint import CheckpointReport, load_checkpoint, save_checkpoint
from conduit.placer import Placer, Replan
from conduit.topology import Topology
from conduit_rllib.errors import FrameFormatError, FramesEvictedError
from conduit_rllib.frame_kernels import stack_frames, warm_stack_frames

log = logging.getLogger("conduit_rllib")
NORMALIZED_SCALE = 128.0  # RLlib's NormalizedImageEnv: x = u / 128 - 1
REPLAN_PARTS = 8  # the frame column is re-planned each time this share of its capacity is appended
REPLAN_MIN_FRAMES = 256  # ... and never more often than this many frames


def frame_schema(height: int, width: int) -> Schema:
    """The frame store's one column: uint8 frames ``[H, W]``."""
    return Schema([Column("frame", torch.uint8, (height, width))])


@dataclass(frozen=True)
class FrameCodec:
    """How a frame's values map to the uint8 code stored: ``x = u / 128 - 1`` (``normalized``) or ``x = u``."""

    normalized: bool

    @staticmethod
    def of(frames: np.ndarray) -> FrameCodec:
        """The codec for frames of ``frames.dtype`` (uint8, or RLlib's normalized float32).

        Raises:
            FrameFormatError: any other dtype.
        """
        if frames.dtype == np.uint8:
            return FrameCodec(normalized=False)
        if frames.dtype == np.float32:
            return FrameCodec(normalized=True)
        raise FrameFormatError(
            f"frames of dtype {frames.dtype} cannot be stored once as uint8: frame-once storage takes uint8 "
            "frames or RLlib's normalized float32 frames (u / 128 - 1, wrap_atari_for_new_api_stack)"
        )

    @property
    def dtype(self) -> torch.dtype:
        """The dtype delivered (the frames' own)."""
        return torch.float32 if self.normalized else torch.uint8

    @property
    def fill_code(self) -> int:
        """The code of RLlib's padding value 0.0."""
        return int(NORMALIZED_SCALE) if self.normalized else 0

    def check_dtype(self, frames: np.ndarray) -> None:
        """Refuses frames of a dtype other than the codec's (O(1): the values are checked by :meth:`encode`).

        Raises:
            FrameFormatError: naming both dtypes.
        """
        want = np.float32 if self.normalized else np.uint8
        if frames.dtype != want:
            raise FrameFormatError(
                f"frames of dtype {frames.dtype} where earlier frames were {np.dtype(want)}: one module's "
                "frames must keep one dtype"
            )

    def encode(self, frames: np.ndarray) -> np.ndarray:
        """uint8 codes of ``frames`` (vectorised); refuses frames the codes cannot give back exactly.

        Raises:
            FrameFormatError: a dtype other than the codec's, or float frames that are not ``u / 128 - 1``.
        """
        self.check_dtype(frames)
        if not self.normalized:
            return frames
        codes = np.rint((frames + np.float32(1.0)) * np.float32(NORMALIZED_SCALE))
        ok = (codes >= 0) & (codes <= 255)
        u = np.where(ok, codes, 0).astype(np.uint8)
        if not (ok.all() and np.array_equal(self.decode_np(u), frames)):
            raise FrameFormatError(
                "float32 frames that are not u / 128 - 1 for integer u in 0..255 (RLlib's "
                "NormalizedImageEnv) cannot be stored once as uint8 without changing them; use RLlib's "
                "Atari wrappers or uint8 frames"
            )
        return u

    def decode_np(self, codes: np.ndarray) -> np.ndarray:
        if not self.normalized:
            return codes
        return codes.astype(np.float32) / np.float32(NORMALIZED_SCALE) - np.float32(1.0)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The frames of uint8 ``codes`` (bit-identical to what was encoded)."""
        if not self.normalized:
            return codes
        return codes.to(torch.float32).div_(NORMALIZED_SCALE).sub_(1.0)

    def table(self) -> torch.Tensor:
        """``[257]``: the decoded value of each code, then of the padding (RLlib's 0.0)."""
        codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
        return torch.cat([self.decode(codes), self.decode(torch.tensor([self.fill_code], dtype=torch.uint8))])


def frame_shape(frames: np.ndarray, what: str) -> tuple[int, int]:
    """``(H, W)`` of frames ``[T, H, W, 1]`` (RLlib's frame stacking stacks along a last axis of 1).

    Raises:
        FrameFormatError: any other shape, naming ``what``.
    """
    if frames.ndim != 4 or frames.shape[-1] != 1:
        raise FrameFormatError(
            f"{what}: observations of shape {tuple(frames.shape[1:])}; frame-once storage takes single "
            "frames of shape (H, W, 1), as RLlib's FrameStacking connectors do"
        )
    return int(frames.shape[1]), int(frames.shape[2])


class FrameStore:
    """``capacity`` uint8 frames ``[H, W]`` in a ring, each with a global id (0, 1, 2, ... in append order).

    The ring is a core buffer (``build_buffer``, one ``frame`` column): the planner puts the column on
    host memory, or on the ``disk`` tier (memmap) when it does not fit ``memory_budget`` bytes of RAM
    (None: the machine's free memory), and re-plans every ``capacity // REPLAN_PARTS`` frames (at least
    ``REPLAN_MIN_FRAMES``) on a new
    reading of free memory (``reading``, default ``local_topology()``), migrating the column online
    (the core's migration: appends and reads go on during the copy). :meth:`checkpoint` saves it
    incrementally in the core's checkpoint format.

    A frame overwritten by a newer one is detected by its slot's generation (``id + 1``): reading it
    raises :class:`FramesEvictedError` instead of delivering another frame. An append clears its
    slots' generations before it writes their frames and a read checks them after it copied the frames,
    so a delivery thread reading while frames are appended never delivers a half-overwritten frame.
    """

    def __init__(
        self,
        height: int,
        width: int,
        capacity: int,
        codec: FrameCodec,
        memory_budget: int | None = None,
        disk_path: str | None = None,
        pins: dict[str, str] | None = None,
        reading: Callable[[], Topology] | None = None,
    ) -> None:
        self.shape = (height, width)
        self.codec = codec
        self.capacity = capacity
        config = BufferConfig(
            capacity=capacity,
            memory_budget=memory_budget,
            disk_path=disk_path,
            pins=pins or {},
            rate_limit=RateLimit(min_size=0),
        )
        self.reading = reading or local_topology
        self.buffer = build_buffer(config, frame_schema(height, width), topology=self.reading())
        self.storage: Any = self.buffer.storage
        self._replan_every = max(REPLAN_MIN_FRAMES, capacity // REPLAN_PARTS)
        self._next_replan = self._replan_every
        self._replanning: threading.Thread | None = None
        self._placing = threading.Lock()
        self.placement_errors: list[str] = []
        self._appended = 0
        self._table = codec.table()
        warm_stack_frames(codec.dtype)

    @property
    def appended(self) -> int:
        """Frames ever appended and written: the next frame's id. Set after each append's write (the
        buffer counts an append's slots before it writes them), so a reader never picks a frame being
        written."""
        return self._appended

    @property
    def tier(self) -> str:
        """The tier the frames are on now (``host``, ``shm``, ``disk``...)."""
        return str(self.storage.tiers["frame"])

    def check(self, frames: np.ndarray) -> None:
        """What :meth:`append` checks before it encodes: the frames' shape, count and dtype (O(1), no
        pass over the pixels; the values are checked when encoded).

        Raises:
            FrameFormatError: a shape other than the store's, more frames than it holds, or a dtype other
                than the codec's.
        """
        if frames.ndim != 4 or tuple(frames.shape[1:]) != (*self.shape, 1):
            raise FrameFormatError(
                f"a frame of shape {tuple(frames.shape[1:])} where this module's frames are {(*self.shape, 1)}"
            )
        if len(frames) > self.capacity:
            raise FrameFormatError(
                f"{len(frames)} frames in one append exceed the frame store's {self.capacity}"
            )
        self.codec.check_dtype(frames)

    def append(self, frames: np.ndarray) -> int:
        """Store ``frames`` ``[T, H, W, 1]`` (encoded); returns the id of the first (ids are consecutive).

        Raises:
            FrameFormatError: a shape other than the store's, a dtype other than the codec's, or values
                the codec cannot store exactly (nothing is appended then).
        """
        self.check(frames)
        n = len(frames)
        return self._write(
            torch.from_numpy(np.ascontiguousarray(self.codec.encode(frames)).reshape(n, *self.shape))
        )

    def append_padding(self, n: int) -> int:
        """Append ``n`` frames of the codec's padding code in place of frames that could not be stored, so
        the ids after them stay where their references put them; returns the first id."""
        return self._write(torch.full((n, *self.shape), self.codec.fill_code, dtype=torch.uint8))

    def _write(self, codes: torch.Tensor) -> int:
        n = len(codes)
        with self.buffer._cond:  # noqa: SLF001 - the generations cleared and the write as one step
            first = self.buffer.inserted
            slots = torch.arange(first, first + n, dtype=torch.int64) % self.capacity
            self.storage.generation.index_fill_(0, slots, 0)  # invalid while being overwritten
            self.buffer.extend(ColumnBatch.trusted({"frame": codes}, n))
            self._appended = first + n
        if first + n >= self._next_replan:
            self._next_replan = (first + n) // self._replan_every * self._replan_every + self._replan_every
            self._replan_async(f"{first + n} frames appended")
        return first

    # -- placement -------------------------------------------------------------------------------

    def replan(self, reason: str = "requested", memory_budget: int | None | str = "keep") -> Replan | None:
        """Plan the frame column again on a new reading of free memory (and ``memory_budget``, if given)
        and migrate it online if the plan is adopted; None when the placement is kept.

        Raises:
            PlacementCapacityError: no tier can hold the frames.
        """
        placer = self.buffer.placer
        if not isinstance(placer, Placer):
            return None  # pinned by hand
        with self._placing:  # one re-plan at a time (a background one may run)
            if memory_budget != "keep":
                placer.memory_budget = None if memory_budget is None else int(memory_budget)
            return placer.replan(self.reading(), reason)

    def _replan_async(self, reason: str) -> None:
        """:meth:`replan` on a background thread (one at a time): appends and reads go on during a move."""
        if self._replanning is not None and self._replanning.is_alive():
            return

        def run() -> None:
            try:
                self.replan(reason)
            except ConduitError as e:  # the current placement still holds every frame
                log.warning("frame store placement kept (%s): %s", reason, e)
                self.placement_errors.append(str(e))

        self._replanning = threading.Thread(target=run, name="conduit-frame-placement", daemon=True)
        self._replanning.start()

    def wait_placement(self, timeout: float | None = None) -> None:
        """Wait for a background re-plan (and its migration) to end."""
        if self._replanning is not None:
            self._replanning.join(timeout)

    # -- reading ---------------------------------------------------------------------------------

    def stacks(self, refs: torch.Tensor) -> torch.Tensor:
        """Stacked frames ``[B, H, W, F]`` of frame references ``refs`` ``[B, F]`` (oldest first), decoded;
        a reference ``-1`` (before the episode's first frame) gives the codec's padding (RLlib's
        ``fill=0.0``). One pass over the output (``frame_kernels.stack_frames``).

        Raises:
            FramesEvictedError: a frame referenced was overwritten (the frame store is too small).
        """
        b, f = refs.shape
        flat = refs.reshape(-1)
        pad = flat < 0
        ids = flat.clamp(min=0)
        slots = ids % self.capacity
        frames = stack_frames(
            self.storage.data["frame"].view(self.capacity, -1), slots.view(b, f), pad.view(b, f), self._table
        )
        gen = self.storage.generation.index_select(0, slots)  # after the copy (see the class docstring)
        stale = (gen != ids + 1) & ~pad
        if bool(stale.any()):
            raise FramesEvictedError(
                f"{int(stale.sum())} frame(s) of a sampled transition were overwritten in the frame store "
                f"({self.capacity} frames, {self.appended} appended): its capacity is too small for this "
                "run's episodes"
            )
        return frames.view(b, *self.shape, f)

    def nbytes(self) -> int:
        """Bytes the frames and their slots' bookkeeping occupy."""
        return int(self.storage.nbytes)

    # -- persistence -----------------------------------------------------------------------------

    def checkpoint(self, root: str | os.PathLike[str]) -> CheckpointReport:
        """A new checkpoint of the frames under directory ``root`` in the core's format (atomic, checksummed,
        no pickle): after the first, only the segments of slots written since the previous one are written;
        the others are hard-linked (``save_checkpoint(..., independent=False)``).

        Raises:
            CheckpointError: the save failed (it leaves nothing behind).
        """
        return save_checkpoint(self.buffer, root, independent=False)

    def restore(self, root: str | os.PathLike[str]) -> str:
        """Load the newest intact checkpoint under ``root`` (a torn one is skipped); returns its path.

        Raises:
            CheckpointError: none is intact or it does not fit this store (shape, capacity); the store
                is then unchanged.
        """
        path = load_checkpoint(self.buffer, root)
        self._appended = self.buffer.inserted
        return path

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or the ``buffer`` part of a checkpoint read), in place; a state of the
        ring before it was a core buffer (its tensors and ``appended``) is taken too.

        Raises:
            CheckpointError: the state does not fit this store; the store is then unchanged.
        """
        if "appended" in state:  # the earlier layout: the ring's tensors and the append count
            appended = int(state["appended"])
            storage = {k: v for k, v in state.items() if k != "appended"}
            sampler = {"kind": "uniform", "size": min(appended, self.capacity)}
            state = {"storage": storage, "sampler": sampler, "inserted": appended, "sampled": 0}
        self.buffer.load_state_dict(state)
        self._appended = self.buffer.inserted


def frame_stack_operator(store: FrameStore) -> Operator:
    """The delivery operator: ``obs`` / ``new_obs`` frame references ``[B, F]`` become RLlib's stacked
    observations ``[B, H, W, F]``."""

    def stack(batch: ColumnBatch) -> ColumnBatch:
        cols = dict(batch.columns)
        for name in ("obs", "new_obs"):
            ref = cols[name]
            assert isinstance(ref, torch.Tensor)
            cols[name] = store.stacks(ref)
        return ColumnBatch.trusted(cols, batch.size)

    return Operator("frame_stack", stack)


__all__ = ["REPLAN_PARTS", "FrameCodec", "FrameStore", "frame_schema", "frame_shape", "frame_stack_operator"]
