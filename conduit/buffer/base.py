"""The three parts a buffer is composed of: storage, writer and sampler (TorchRL's composition).

``ExperienceBuffer(storage, sampler, writer=..., limiter=...)`` wires them together; ``build_buffer``
(:mod:`conduit.build_buffer`) builds the usual ones from a config. Every method here is called with the buffer's lock held, and
works on whole batches (slot tensors), never per item.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from conduit.batch import ColumnBatch
from conduit.errors import PriorityError
from conduit.metrics import Metrics
from conduit.schema import Schema

#: A saved count, position or generation above this is corrupt (int64 arithmetic on it stays exact).
MAX_COUNT = 1 << 62


class Storage(ABC):
    """Holds ``capacity`` items in slots on one tier, with a policy version and a generation per slot."""

    schema: Schema
    capacity: int
    tier: str
    device: torch.device
    generation: torch.Tensor  # [capacity] int64: global insert count at write time (0 = never written)
    version: torch.Tensor  # [capacity] int64: policy version that wrote the slot

    @abstractmethod
    def write(self, slots: torch.Tensor, batch: ColumnBatch, version: int, first_generation: int) -> None:
        """Write a validated ``batch`` into ``slots``."""

    @abstractmethod
    def read(self, slots: torch.Tensor, into: ColumnBatch | None = None) -> ColumnBatch:
        """Gather ``slots`` (into ``into``'s fixed-column tensors when given)."""

    def read_meta(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The generations and versions of ``slots``."""
        return self.generation.index_select(0, slots), self.version.index_select(0, slots)

    @abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def check_state(self, state: dict[str, torch.Tensor], inserted: int | None = None, live: int = 0) -> None:
        """Raise :class:`~conduit.errors.CheckpointError` if ``state`` does not fit, or (given ``inserted``)
        is not what ``inserted`` items written in order leave with the last ``live`` of them all
        present; changes nothing."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class Writer(ABC):
    """Assigns slots to incoming items and counts inserts."""

    capacity: int
    inserted: int

    @abstractmethod
    def check(self, n: int) -> None:
        """Raise before anything is written if ``n`` items cannot be written in one call."""

    @abstractmethod
    def reserve(self, n: int) -> torch.Tensor:
        """The slots for the next ``n`` items (after :meth:`check`)."""


class Sampler(ABC):
    """Chooses slots among committed items; it sees a slot only after the write committed it.

    A sampler also owns the rules that depend on *how* items are consumed: a consume-once sampler
    refuses writes that would overwrite unconsumed items (``insert_blocker``) and applies the staleness
    bound (``before_sample``).
    """

    consumes: bool = False  # True when sampled items leave the buffer (on-policy FIFO)
    has_priorities: bool = False

    def attach(self, storage: Storage, metrics: Metrics) -> None:
        """Called once by the buffer; samplers that read slot metadata keep what they need."""
        del storage, metrics

    @abstractmethod
    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        """Slots that were just committed (after ``total_inserted`` items in all)."""

    @abstractmethod
    def available(self) -> int:
        """Items a sample may return now."""

    def sample_blocker(self, n: int) -> str | None:
        """Why ``n`` items cannot be sampled now (None: they can)."""
        return "the buffer is empty" if self.available() == 0 else None

    def insert_blocker(self, n: int) -> str | None:
        """Why ``n`` items cannot be written now (None: they can)."""
        del n
        return None

    def before_sample(self, n: int, version: int | None) -> None:
        """Hook run before a sample for consumer ``version`` (the staleness bound lives here)."""
        del n, version

    @abstractmethod
    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``n`` slots and, for prioritized sampling, their importance weights."""

    def hold(self, n: int) -> None:
        """The ``n`` items just sampled are not delivered yet: their slots stay taken until
        :meth:`release` (a consume-once sampler; others ignore it)."""
        del n

    def release(self, n: int) -> None:
        """The oldest ``n`` held items were delivered: their slots may be written again."""
        del n

    def update_priorities(self, slots: torch.Tensor, priorities: torch.Tensor, live: torch.Tensor) -> None:
        raise PriorityError(f"{type(self).__name__} has no priorities; use sampler='prioritized'")

    def update_checked(
        self, slots: torch.Tensor, generations: torch.Tensor, stored: torch.Tensor, priorities: torch.Tensor,
        capacity: int, reject_nonfinite: bool,
    ) -> tuple[int, int, int, float, int] | None:  # fmt: skip
        """Check and apply a priority update in one pass, where the sampler has such a path:
        ``(bad slot index or -1, non-finite, negative, lowest negative, applied or -1 if a fault left
        everything unchanged)``. None: no such path here; the buffer checks and calls
        :meth:`update_priorities`."""
        del slots, generations, stored, priorities, capacity, reject_nonfinite
        return None

    def state_dict(self, first_undelivered: int | None = None) -> dict[str, object]:
        """The sampler's state; ``first_undelivered`` is the oldest slot sampled but not yet delivered."""
        del first_undelivered
        return {}

    def check_state(self, state: dict[str, object], inserted: int | None = None) -> None:
        """Raise :class:`~conduit.errors.CheckpointError` if ``state`` is not this sampler's (after
        ``inserted`` items, if given); changes nothing."""
        del state, inserted

    def live(self, state: dict[str, object], inserted: int) -> int:
        """How many of the last ``inserted`` items a sampler in (checked) ``state`` may still return:
        the storage must hold each of them."""
        del state
        return min(inserted, getattr(self, "capacity", inserted))

    def load_state_dict(self, state: dict[str, object]) -> None:
        del state
