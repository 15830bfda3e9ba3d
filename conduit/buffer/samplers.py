"""Samplers pick which committed slots a read returns: uniform, FIFO (consume-once), prioritized.

A sampler sees slots only after the buffer committed them (``on_insert``), so it never returns data
that is still being written. All selection is vectorised over the batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from conduit.buffer.sumtree import SumTree
from conduit.errors import ConduitError


class Sampler(ABC):
    """Chooses slots among committed items."""

    consumes: bool = False  # True when sampled items leave the buffer (on-policy FIFO)

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.device = device

    @abstractmethod
    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        """Slots that were just committed (after ``total_inserted`` items in all)."""

    @abstractmethod
    def available(self) -> int:
        """Items a sample may return now."""

    @abstractmethod
    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``n`` slots and, for prioritized sampling, their importance weights."""

    def update_priorities(
        self, slots: torch.Tensor, priorities: torch.Tensor, live: torch.Tensor | None = None
    ) -> None:
        raise ConduitError(f"{type(self).__name__} has no priorities; use sampler='prioritized'")

    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        del state


class UniformSampler(Sampler):
    """Each committed item with equal probability, with replacement."""

    def __init__(self, capacity: int, device: torch.device, generator: torch.Generator | None = None) -> None:
        super().__init__(capacity, device)
        self.size = 0
        self.generator = generator

    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        self.size = min(total_inserted, self.capacity)

    def available(self) -> int:
        return self.size

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = torch.randint(0, self.size, (n,), generator=self.generator, device=self.device)
        return slots, None

    def state_dict(self) -> dict[str, object]:
        return {"size": self.size}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.size = int(state["size"])  # type: ignore[call-overload]


class FifoSampler(Sampler):
    """Consume-once, in commit order: every item is returned exactly once (on-policy)."""

    consumes = True

    def __init__(self, capacity: int, device: torch.device) -> None:
        super().__init__(capacity, device)
        self.head = 0  # items consumed so far
        self.tail = 0  # items committed so far

    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        self.tail = total_inserted

    def available(self) -> int:
        return self.tail - self.head

    def peek(self, n: int) -> torch.Tensor:
        """The next ``n`` slots, without consuming them."""
        return (self.head + torch.arange(n, device=self.device)) % self.capacity

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = self.peek(n)
        self.head += n
        return slots, None

    def state_dict(self) -> dict[str, object]:
        return {"head": self.head, "tail": self.tail}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.head = int(state["head"])  # type: ignore[call-overload]
        self.tail = int(state["tail"])  # type: ignore[call-overload]


class PrioritizedSampler(Sampler):
    """Proportional prioritized replay (Schaul et al. 2016).

    An item with priority ``p`` is drawn with probability ``P(i) = p_i^α / Σ_k p_k^α`` and carries the
    importance weight ``w_i = (N · P(i))^-β / max_k (N · P(k))^-β`` (normalised by the largest weight
    in the buffer, i.e. the one of the smallest priority). New items get the largest priority seen so
    far, so each is likely to be replayed at least once.
    """

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        alpha: float,
        beta: float,
        eps: float,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(capacity, device)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.tree = SumTree(capacity, device=device)
        self.max_priority = torch.ones((), dtype=torch.float64, device=device)  # a tensor: no host sync
        self.size = 0
        self.generator = generator

    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        self.size = min(total_inserted, self.capacity)
        value = self.max_priority.pow(self.alpha).expand(slots.numel())
        self.tree.update_trusted(slots.to(self.device), value)

    def available(self) -> int:
        return self.size

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = self.tree.sample(n, generator=self.generator)
        # (N·P(i))^-β / (N·P_min)^-β = (p_i / p_min)^-β: the total cancels out.
        ratio = self.tree.leaf_values(slots).div_(self.tree.min_tensor())
        return slots, ratio.pow_(-self.beta).to(torch.float32)

    def update_priorities(
        self, slots: torch.Tensor, priorities: torch.Tensor, live: torch.Tensor | None = None
    ) -> None:
        """New priorities ``|p| + eps``; entries where ``live`` is False keep their current value."""
        p = priorities.detach().to(self.device, torch.float64).abs().add_(self.eps)
        if not bool(torch.isfinite(p).all()):
            raise ConduitError("priorities must be finite (got NaN or inf)")
        if live is not None:
            p = torch.where(live, p, 0.0)
        if slots.numel():
            self.max_priority = torch.maximum(self.max_priority, p.max())
        values = p.pow_(self.alpha)
        if live is not None:
            values = torch.where(live, values, self.tree.leaf_values(slots))
        self.tree.update_trusted(slots, values)

    def state_dict(self) -> dict[str, object]:
        return {"tree": self.tree.state_dict(), "max_priority": float(self.max_priority), "size": self.size}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.tree.load_state_dict(state["tree"])  # type: ignore[arg-type]
        value = float(state["max_priority"])  # type: ignore[arg-type]
        self.max_priority = torch.tensor(value, dtype=torch.float64, device=self.device)
        self.size = int(state["size"])  # type: ignore[call-overload]
