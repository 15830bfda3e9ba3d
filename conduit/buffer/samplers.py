"""Samplers pick which committed slots a read returns: uniform, FIFO (consume-once), prioritized.

A sampler sees slots only after the buffer committed them (``on_insert``), so it never returns data
that is still being written. All selection is vectorised over the batch.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import torch

from conduit.buffer.base import MAX_COUNT, Sampler, Storage
from conduit.buffer.sumtree import SumTree
from conduit.errors import CheckpointError, StaleDataError
from conduit.metrics import Metrics

log = logging.getLogger(__name__)


def _int_state(state: dict[str, object], keys: tuple[str, ...], owner: str) -> None:
    missing = [k for k in keys if isinstance(state.get(k), bool) or not isinstance(state.get(k), int)]
    if missing:
        raise CheckpointError(
            f"{owner} state lacks integer entries {missing}; got keys {sorted(map(str, state))}"
        )
    wrong = {k: state[k] for k in keys if not 0 <= state[k] <= MAX_COUNT}  # type: ignore[operator]
    if wrong:
        raise CheckpointError(f"{owner} state holds counts out of range: {str(wrong)[:120]}")


def _check_size(state: dict[str, object], inserted: int | None, capacity: int, owner: str) -> None:
    if inserted is not None and state["size"] != min(inserted, capacity):
        raise CheckpointError(
            f"{owner} state has size {state['size']}, but {inserted} items fill {min(inserted, capacity)} slots"
        )


def make_sum_tree(capacity: int, device: torch.device | str) -> SumTree:
    """The sum tree for a prioritized sampler: fused numba kernels on the CPU
    (:class:`~conduit.buffer.fused_sumtree.FusedSumTree`), this torch implementation on CUDA."""
    if torch.device(device).type == "cpu":
        from conduit.buffer.fused_sumtree import FusedSumTree  # imports numba: only when needed

        return FusedSumTree(capacity)
    return SumTree(capacity, device=device)


class UniformSampler(Sampler):
    """Each committed item with equal probability, with replacement."""

    kind = "uniform"

    def __init__(self, capacity: int, device: torch.device, generator: torch.Generator | None = None) -> None:
        self.capacity, self.device = capacity, device
        self.size = 0
        self.generator = generator

    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        self.size = min(total_inserted, self.capacity)

    def available(self) -> int:
        return self.size

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = torch.randint(0, self.size, (n,), generator=self.generator, device=self.device)
        return slots, None

    def state_dict(self, first_undelivered: int | None = None) -> dict[str, object]:
        return {"kind": "uniform", "size": self.size}

    def check_state(self, state: dict[str, object], inserted: int | None = None) -> None:
        _check_kind(state, "uniform")
        _int_state(state, ("size",), "uniform sampler")
        _check_size(state, inserted, self.capacity, "uniform sampler")

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.size = int(state["size"])  # type: ignore[call-overload]


def is_stale(versions: torch.Tensor, consumer_version: int, max_staleness: int) -> torch.Tensor:
    """The staleness rule of consume-once data (what :class:`FifoSampler` evicts by), as a mask.

    An item written by policy version ``v`` may be consumed by versions up to ``v + max_staleness``;
    ``True`` where ``versions`` are older than that allows for ``consumer_version``. Also used where
    items reach a consumer some other way (the verl integration's prompt groups), so one rule decides.
    """
    return versions + max_staleness < consumer_version


class FifoSampler(Sampler):
    """Consume-once, in commit order: every item is returned exactly once (on-policy).

    Writes never overwrite unconsumed items. With ``max_staleness``, an item written by policy
    version ``v`` may be consumed by versions up to ``v + max_staleness``. Versions never decrease in
    commit order (the runtime refuses a put older than the last), so stale items are always the
    oldest ones: ``on_stale="evict"`` drops them (counted as ``count/stale_evicted``, logged),
    ``on_stale="error"`` raises :class:`StaleDataError` before anything is consumed.
    """

    consumes = True
    kind = "fifo"

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        max_staleness: int | None = None,
        on_stale: str = "evict",
    ) -> None:
        self.capacity, self.device = capacity, device
        self.max_staleness, self.on_stale = max_staleness, on_stale
        self.head = 0  # items consumed (or evicted) so far
        self.tail = 0  # items committed so far
        # items sampled but not yet delivered, as [first item, count] runs in item order (hold/release):
        # their slots are not free yet, so a write can never overwrite an item that is still on its way
        self._held: deque[list[int]] = deque()
        self._versions: torch.Tensor | None = None
        self._metrics: Metrics | None = None

    def attach(self, storage: Storage, metrics: Metrics) -> None:
        self._versions, self._metrics = storage.version, metrics

    def on_insert(self, slots: torch.Tensor, total_inserted: int) -> None:
        self.tail = total_inserted

    def available(self) -> int:
        return self.tail - self.head

    def sample_blocker(self, n: int) -> str | None:
        if n > self.available():
            return f"requested {n} items but only {self.available()} unconsumed items are available"
        return None

    def insert_blocker(self, n: int) -> str | None:
        free = self.capacity - (self.tail - self._released())
        if n > free:
            return (
                f"only {free} free slots for {n} items: unconsumed on-policy items are never overwritten "
                "(nor sampled ones not yet delivered)"
            )
        return None

    def _released(self) -> int:
        """The first item whose slot is not free: the oldest held one, else the head."""
        return self._held[0][0] if self._held else self.head

    def hold(self, n: int) -> None:
        if n:
            self._held.append([self.head - n, n])

    def release(self, n: int) -> None:
        while n > 0 and self._held:
            run = self._held[0]
            k = min(n, run[1])
            run[0] += k
            run[1] -= k
            n -= k
            if run[1] == 0:
                self._held.popleft()

    def peek(self, n: int) -> torch.Tensor:
        """The next ``n`` slots, without consuming them."""
        return (self.head + torch.arange(n, device=self.device)) % self.capacity

    def before_sample(self, n: int, version: int | None) -> None:
        bound = self.max_staleness
        if bound is None or version is None or self.available() == 0:
            return
        assert self._versions is not None, "attach() was not called"
        versions = self._versions.index_select(0, self.peek(self.available()))
        stale = int(is_stale(versions, version, bound).sum())  # a prefix: versions never decrease
        if stale == 0:
            return
        if self.on_stale == "error":
            oldest = int(versions[0])
            raise StaleDataError(
                f"the next {n} items include version {oldest}, older than max_staleness={bound} allows "
                f"for consumer version {version}"
            )
        self.head += stale
        if self._metrics is not None:
            self._metrics.incr("stale_evicted", stale)
        log.warning("evicted %d stale item(s) (max_staleness=%d, consumer version %d)", stale, bound, version)

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = self.peek(n)
        self.head += n
        return slots, None

    def state_dict(self, first_undelivered: int | None = None) -> dict[str, object]:
        """Head and tail; items sampled but not yet delivered (from ``first_undelivered`` on) count as unconsumed."""
        head = self.head
        if first_undelivered is not None:
            back = (head - first_undelivered - 1) % self.capacity + 1  # 1..capacity logical steps back
            head -= back
        return {"kind": "fifo", "head": head, "tail": self.tail}

    def check_state(self, state: dict[str, object], inserted: int | None = None) -> None:
        _check_kind(state, "fifo")
        _int_state(state, ("head", "tail"), "fifo sampler")
        head, tail = state["head"], state["tail"]
        assert isinstance(head, int) and isinstance(tail, int)
        if inserted is not None and tail != inserted:
            raise CheckpointError(f"fifo state has tail {tail}, but {inserted} items were inserted")
        if not 0 <= tail - head <= self.capacity:
            raise CheckpointError(
                f"fifo state holds {tail - head} unconsumed items for capacity {self.capacity}"
            )

    def live(self, state: dict[str, object], inserted: int) -> int:
        """The unconsumed items (``tail - head``): the only ones a FIFO may still return."""
        return int(state["tail"]) - int(state["head"])  # type: ignore[call-overload]

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.head = int(state["head"])  # type: ignore[call-overload]
        self.tail = int(state["tail"])  # type: ignore[call-overload]
        self._held.clear()


class PrioritizedSampler(Sampler):
    """Proportional prioritized replay (Schaul et al. 2016).

    An item with priority ``p`` is drawn with probability ``P(i) = p_i^α / Σ_k p_k^α`` and carries the
    importance weight ``w_i = (N · P(i))^-β / max_k (N · P(k))^-β`` (normalised by the largest weight
    in the buffer, i.e. the one of the smallest priority). New items get the largest priority seen so
    far, so each is likely to be replayed at least once. On the CPU a sample and a priority update are
    one fused numba kernel call each (:class:`~conduit.buffer.fused_sumtree.FusedSumTree`); on CUDA
    the torch :class:`~conduit.buffer.sumtree.SumTree` runs them.
    """

    has_priorities = True
    kind = "prioritized"

    def __init__(
        self,
        capacity: int,
        device: torch.device,
        alpha: float,
        beta: float,
        eps: float,
        generator: torch.Generator | None = None,
    ) -> None:
        self.capacity, self.device = capacity, device
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.tree = make_sum_tree(capacity, device)
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
        return self.tree.sample_with_weights(n, self.beta, self.generator)

    def update_priorities(self, slots: torch.Tensor, priorities: torch.Tensor, live: torch.Tensor) -> None:
        """New priorities ``|p| + eps`` (checked finite by the buffer); where ``live`` is False the value is kept."""
        self.max_priority = self.tree.set_priorities(
            slots, priorities, live, self.alpha, self.eps, self.max_priority
        )

    def update_checked(
        self, slots: torch.Tensor, generations: torch.Tensor, stored: torch.Tensor, priorities: torch.Tensor,
        capacity: int, reject_nonfinite: bool,
    ) -> tuple[int, int, int, float, int] | None:  # fmt: skip
        """:meth:`Sampler.update_checked`: one kernel call on the fused CPU tree (None on other trees)."""
        return self.tree.update_checked(
            slots, generations, stored, priorities, capacity, reject_nonfinite, self.alpha, self.eps,
            self.max_priority,
        )  # fmt: skip

    def state_dict(self, first_undelivered: int | None = None) -> dict[str, object]:
        return {
            "kind": "prioritized",
            "tree": self.tree.state_dict(),
            "max_priority": float(self.max_priority),
            "size": self.size,
        }

    def check_state(self, state: dict[str, object], inserted: int | None = None) -> None:
        _check_kind(state, "prioritized")
        _int_state(state, ("size",), "prioritized sampler")
        _check_size(state, inserted, self.capacity, "prioritized sampler")
        tree = state.get("tree")
        if not isinstance(tree, dict) or set(tree) != {"priorities", "written"}:
            raise CheckpointError("prioritized sampler state lacks its sum tree ('priorities', 'written')")
        pri, written = tree["priorities"], tree["written"]
        for name, t in (("priorities", pri), ("written", written)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != (self.capacity,):
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise CheckpointError(f"prioritized state holds {got} {name} for capacity {self.capacity}")
        assert isinstance(pri, torch.Tensor) and isinstance(written, torch.Tensor)
        if not pri.dtype.is_floating_point or written.dtype != torch.bool:
            raise CheckpointError(f"prioritized state holds {pri.dtype} priorities and {written.dtype} flags")
        if not bool(((pri >= 0) & torch.isfinite(pri)).all()):
            raise CheckpointError("prioritized state holds negative or non-finite priorities")
        filled = torch.arange(self.capacity, device=written.device) < min(inserted or 0, self.capacity)
        if inserted is not None and not torch.equal(written, filled):
            raise CheckpointError(
                f"prioritized state marks {int(written.sum())} slots written; {inserted} items fill the first "
                f"{min(inserted, self.capacity)}"
            )
        if bool((pri.masked_select(~written) != 0).any()):
            raise CheckpointError("prioritized state gives priorities to slots never written")
        mp = state.get("max_priority")
        if not isinstance(mp, float) or not math.isfinite(mp) or mp <= 0:
            raise CheckpointError(f"prioritized state has max_priority {mp!r}")

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.tree.load_state_dict(state["tree"])  # type: ignore[arg-type]
        value = float(state["max_priority"])  # type: ignore[arg-type]
        self.max_priority = torch.tensor(value, dtype=torch.float64, device=self.device)
        self.size = int(state["size"])  # type: ignore[call-overload]


def _check_kind(state: dict[str, object], kind: str) -> None:
    if not isinstance(state, dict) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"the saved sampler is {str(got)[:40]!r}; this buffer's sampler is {kind!r}")


__all__ = ["FifoSampler", "PrioritizedSampler", "Sampler", "UniformSampler"]
