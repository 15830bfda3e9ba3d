"""A k-ary sum tree (plus a parallel min tree) for proportional prioritized replay.

Everything is vectorised in torch on the storage's device; the only Python loops run over tree levels.
Each level is a ``[rows, arity + 1]`` tensor whose column 0 is a constant 0 (sum tree) or +inf (min
tree), so the cumsum of a gathered row is directly the table of exclusive prefixes a descent needs.
Entry ``(r, j)`` of a level is the total of row ``r * arity + j`` of the level below.

TIMINGS
"""

from __future__ import annotations

import math

import torch

from conduit.errors import ConduitError, ConfigError, ShapeError

__all__ = ["SumTree"]


class SumTree:
    """Sum and min of non-negative leaf priorities, with prefix-sum search and stratified sampling."""

    def __init__(
        self,
        capacity: int,
        device: torch.device | str = "cpu",
        arity: int = 64,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"SumTree capacity must be an int >= 1, got {capacity!r}")
        if isinstance(arity, bool) or not isinstance(arity, int) or arity < 2:
            raise ConfigError(f"SumTree arity must be an int >= 2, got {arity!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError(f"SumTree dtype must be a floating-point torch.dtype, got {dtype!r}")
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"SumTree device {device!r} is not a valid torch device") from exc
        self._capacity = capacity
        self._arity = arity
        self._dtype = dtype
        self._device = dev
        rows = [math.ceil(capacity / arity)]
        while rows[0] > 1:
            rows.insert(0, math.ceil(rows[0] / arity))
        self._rows = rows
        # Flat storage per level (top first); the final element is a scratch slot that swallows the
        # losing writes of duplicate slots in update(), so the level views below never see it.
        self._sum = [torch.zeros(r * (arity + 1) + 1, dtype=dtype, device=dev) for r in rows]
        self._min = [torch.full((r * (arity + 1) + 1,), math.inf, dtype=dtype, device=dev) for r in rows]
        self._sum2d = [s[:-1].view(r, arity + 1) for s, r in zip(self._sum, rows)]
        self._min2d = [m[:-1].view(r, arity + 1) for m, r in zip(self._min, rows)]
        self._scratch = rows[-1] * (arity + 1)
        # Last-writer-wins bookkeeping: the call-global sequence number of each slot's latest write.
        self._seq = 0
        self._last = torch.full((capacity,), -1, dtype=torch.int64, device=dev)
        self._neg_inf = torch.tensor(-math.inf, dtype=dtype, device=dev)
        self._ranges: dict[int, torch.Tensor] = {}

    @property
    def capacity(self) -> int:
        """Number of leaves."""
        return self._capacity

    def _check_slots(self, slots: torch.Tensor) -> torch.Tensor:
        slots = slots.to(device=self._device, dtype=torch.int64).reshape(-1)
        if slots.numel():
            lo, hi = torch.aminmax(slots)
            if lo.item() < 0 or hi.item() >= self._capacity:
                raise ConduitError(f"SumTree slots must lie in [0, {self._capacity}), got [{lo}, {hi}]")
        return slots

    def _leaf_index(self, slots: torch.Tensor) -> torch.Tensor:
        # Flat position of leaf `slot` in the bottom level: row * (arity + 1) + col + 1.
        return torch.floor_divide(slots, self._arity).add_(slots).add_(1)

    def update(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaf ``slots[i]`` to ``values[i]``; for a repeated slot the last occurrence wins."""
        if slots.numel() != values.numel():
            raise ShapeError(f"SumTree.update got {slots.numel()} slots but {values.numel()} values")
        slots = self._check_slots(slots)
        n = slots.numel()
        if n == 0:
            return
        values = values.to(device=self._device, dtype=self._dtype).reshape(-1)
        lo, hi = torch.aminmax(values)
        if not (lo.item() >= 0 and hi.item() < math.inf):
            raise ConduitError("SumTree priorities must be finite and >= 0")
        # Dedupe without a sort or a sync: stamp each write with a global sequence number, keep the
        # max stamp per slot (scatter amax is deterministic), and send every losing write to scratch.
        seq = torch.arange(self._seq, self._seq + n, device=self._device)
        self._seq += n
        self._last.scatter_reduce_(0, slots, seq, "amax")
        lost = self._last.index_select(0, slots).ne(seq)
        idx = self._leaf_index(slots).masked_fill_(lost, self._scratch)
        self._sum[-1].index_copy_(0, idx, values)
        self._min[-1].index_copy_(0, idx, values)
        # Recompute each touched ancestor from its children (duplicate rows write identical values).
        node = slots
        for d in range(len(self._rows) - 1, 0, -1):
            row = torch.floor_divide(node, self._arity)
            dest = self._leaf_index(row)
            self._sum[d - 1].index_copy_(0, dest, self._sum2d[d].index_select(0, row).sum(1))
            self._min[d - 1].index_copy_(0, dest, self._min2d[d].index_select(0, row).amin(1))
            node = row

    def get(self, slots: torch.Tensor) -> torch.Tensor:
        """Leaf values at ``slots`` (same shape as ``slots``)."""
        flat = self._check_slots(slots)
        return self._sum[-1].index_select(0, self._leaf_index(flat)).reshape(slots.shape)

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self._sum2d[0].sum().item())

    def min(self) -> float:
        """Minimum over leaves that were ever written (``inf`` if none)."""
        return float(self._min2d[0].amin().item())

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """Leaf ``i`` with ``prefix(i) <= t < prefix(i) + value(i)`` per target (clamped into [0, total)).

        Never returns a zero-valued leaf while ``total() > 0``; with an all-zero tree the result is 0s.
        """
        shape = targets.shape
        t = targets.to(device=self._device, dtype=self._dtype).reshape(-1)
        cs = self._sum2d[0][0].cumsum(0)
        t = torch.clamp(t, 0.0, torch.nextafter(cs[-1], self._neg_inf))
        child = torch.searchsorted(cs, t, right=True).sub_(1)
        t = t - cs.index_select(0, child)
        node = child
        for d in range(1, len(self._rows)):
            cs = self._sum2d[d].index_select(0, node).cumsum_(1)
            t = torch.minimum(t, torch.nextafter(cs[:, -1], self._neg_inf), out=t).unsqueeze_(1)
            child = torch.searchsorted(cs, t, right=True).sub_(1)
            t = t.sub_(cs.gather(1, child)).squeeze_(1)
            node = child.squeeze_(1).add_(node, alpha=self._arity)
        return node.reshape(shape)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Stratified proportional sample: one uniform target in each of ``n`` equal segments of [0, total)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"SumTree.sample n must be an int >= 0, got {n!r}")
        ar = self._ranges.get(n)
        if ar is None:
            ar = self._ranges[n] = torch.arange(n, dtype=self._dtype, device=self._device)
        u = torch.rand(n, generator=generator, dtype=self._dtype, device=self._device)
        return self.find(u.add_(ar).mul_(self._sum2d[0].sum() / n))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Leaf priorities and the written mask (enough to rebuild every internal node)."""
        leaves = self._sum2d[-1][:, 1:].reshape(-1)[: self._capacity].clone()
        written = self._min2d[-1][:, 1:].reshape(-1)[: self._capacity] < math.inf
        return {"priorities": leaves, "written": written}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore from :meth:`state_dict` (the whole tree is rebuilt from the leaves)."""
        pri, written = state["priorities"], state["written"]
        if pri.shape != (self._capacity,) or written.shape != (self._capacity,):
            raise ShapeError(f"SumTree state for capacity {pri.shape} does not match {self._capacity}")
        pri = pri.to(device=self._device, dtype=self._dtype)
        written = written.to(device=self._device, dtype=torch.bool)
        if pri.numel() and not bool(((pri >= 0) & (pri < math.inf)).all()):
            raise ConduitError("SumTree state holds priorities that are negative or not finite")
        pad = torch.nn.functional.pad
        s = pad(pri, (0, self._rows[-1] * self._arity - self._capacity))
        m = pad(torch.where(written, pri, math.inf), (0, s.numel() - self._capacity), value=math.inf)
        for d in range(len(self._rows) - 1, -1, -1):
            self._sum2d[d][:, 1:].copy_(s.view(-1, self._arity))
            self._min2d[d][:, 1:].copy_(m.view(-1, self._arity))
            if d:
                extra = self._rows[d - 1] * self._arity - self._rows[d]
                s = pad(self._sum2d[d].sum(1), (0, extra))
                m = pad(self._min2d[d].amin(1), (0, extra), value=math.inf)
        self._last.fill_(-1)
        self._seq = 0
