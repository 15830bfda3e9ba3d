"""Writers assign slots to incoming items: a ring (oldest overwritten) or whole groups at once."""

from __future__ import annotations

import torch

from conduit.buffer.base import Writer
from conduit.errors import CapacityError, ShapeError


class RingWriter(Writer):
    """Slots in insertion order, wrapping around: the oldest items are overwritten (off-policy)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.device = device
        self.inserted = 0

    def check(self, n: int) -> None:
        """Raise before anything is written if ``n`` items cannot be written in one call."""
        if n > self.capacity:
            raise CapacityError(
                f"a write of {n} items exceeds the buffer capacity of {self.capacity} items; split it or raise capacity"
            )

    def reserve(self, n: int) -> torch.Tensor:
        """The slots for the next ``n`` items (call :meth:`check` first)."""
        slots = (self.inserted + torch.arange(n, device=self.device)) % self.capacity
        self.inserted += n
        return slots


class GroupedWriter(RingWriter):
    """Like the ring, but items come in groups of ``group_size`` that land atomically or not at all.

    A GRPO group of n responses to one prompt is the unit of advantage computation; a write whose
    size is not a multiple of the group size is refused whole, before anything is written.
    """

    def __init__(self, capacity: int, device: torch.device, group_size: int) -> None:
        super().__init__(capacity, device)
        if capacity < group_size:
            raise CapacityError(f"capacity {capacity} cannot hold one group of {group_size} items")
        self.group_size = group_size

    def check(self, n: int) -> None:
        if n % self.group_size:
            raise ShapeError(
                f"grouped writer: {n} items is not a whole number of groups of {self.group_size}; "
                f"the last group has {n % self.group_size} items"
            )
        super().check(n)
