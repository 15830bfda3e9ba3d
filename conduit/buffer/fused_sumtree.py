"""The sum tree on CPU with fused kernels: one compiled call per sample, one per priority update.

A torch implementation of prioritized sampling is ~50 tiny ops per sample + update, each paying
the dispatcher's few microseconds, and torch may split an op across threads that then wait for a
busy core. Here each call is one single-threaded numba kernel over the same flat buffers as the
reference :class:`~conduit.buffer.sumtree.SumTree` (which stays the implementation for CUDA and the
one the tests compare against). The kernels are loaded (or compiled once and cached on disk) when
the first tree is built, not in the first ``sample()``.
"""

from __future__ import annotations

import numpy as np
import torch

from conduit.buffer import priority_kernels
from conduit.buffer import sumtree_kernels as kernels
from conduit.buffer.sumtree import SumTree
from conduit.errors import ConfigError

__all__ = ["FusedSumTree"]


class FusedSumTree(SumTree):
    """:class:`SumTree` for float64 leaves on the CPU, with every hot method one numba kernel call.

    Calls must not overlap (the kernels share a scratch buffer and release the GIL); the buffer's
    lock serialises them.
    """

    def __init__(self, capacity: int, arity: int = 32) -> None:
        super().__init__(capacity, device="cpu", arity=arity, dtype=torch.float64)
        kernels.warm()
        self._np_vals, self._np_mins = self._vals.numpy(), self._mins.numpy()
        self._np_vstart = torch.tensor(self._vstart, dtype=torch.int64).numpy()
        self._np_mstart = torch.tensor(self._mstart, dtype=torch.int64).numpy()
        self._np_rows = torch.tensor(self._rows, dtype=torch.int64).numpy()
        # what every kernel that writes the tree takes first: sums, mins, level starts, rows, arity
        self._tree = (
            self._np_vals,
            self._np_mins,
            self._np_vstart,
            self._np_mstart,
            self._np_rows,
            self._arity,
        )
        self._np_cs = torch.zeros(self._rows[-1] + 1, dtype=torch.float64).numpy()  # top prefix scratch
        self._no_weights = np.empty(0, dtype=np.float32)

    def update_trusted(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """:meth:`SumTree.update_trusted` in one kernel call (slots int64, values float64, on the CPU)."""
        if slots.numel():
            kernels.update(
                *self._tree,
                slots.contiguous().numpy(),
                values.contiguous().numpy(),
            )

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """:meth:`SumTree.load_state_dict`, with inner nodes recomputed the way :meth:`update_trusted` does."""
        super().load_state_dict(state)
        args = self._tree
        kernels.rebuild(*args)

    def find(self, targets: torch.Tensor) -> torch.Tensor:
        """:meth:`SumTree.find` in one kernel call."""
        t = targets.to(dtype=torch.float64).reshape(-1).nan_to_num(0.0).contiguous()
        out = torch.empty(t.numel(), dtype=torch.int64)
        kernels.find(
            self._np_vals, self._np_vstart, self._np_rows, self._arity, self._np_cs, t.numpy(), out.numpy()
        )
        return out.reshape(targets.shape)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`SumTree.sample` in one kernel call (the same uniform draws from ``generator``)."""
        return self._sample(n, None, generator)[0]

    def sample_with_weights(
        self, n: int, beta: float, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`SumTree.sample_with_weights` in one kernel call."""
        slots, weights = self._sample(n, beta, generator)
        assert weights is not None
        return slots, weights

    def _sample(
        self, n: int, beta: float | None, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"SumTree.sample n must be an int >= 0, got {n!r}")
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        slots = np.empty(n, dtype=np.int64)
        weights = self._no_weights if beta is None else np.empty(n, dtype=np.float32)
        kernels.sample(
            *self._tree,
            self._np_cs,
            u.numpy(),
            0.0 if beta is None else float(beta),
            slots,
            weights,
        )
        return torch.from_numpy(slots), None if beta is None else torch.from_numpy(weights)

    def set_priorities(
        self, slots: torch.Tensor, priorities: torch.Tensor, live: torch.Tensor,
        alpha: float, eps: float, max_priority: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """:meth:`SumTree.set_priorities` in one kernel call; ``max_priority`` is raised in place."""
        if slots.numel():
            kernels.set_priorities(
                *self._tree,
                slots.contiguous().numpy(),
                priorities.detach().to(torch.float64).contiguous().numpy(),
                live.contiguous().numpy(),
                float(alpha),
                float(eps),
                max_priority.view(1).numpy(),
            )
        return max_priority

    def update_checked(
        self, slots: torch.Tensor, generations: torch.Tensor, stored: torch.Tensor, priorities: torch.Tensor,
        capacity: int, reject_nonfinite: bool, alpha: float, eps: float, max_priority: torch.Tensor,
    ) -> tuple[int, int, int, float, int] | None:  # fmt: skip
        """:func:`~conduit.buffer.priority_kernels.checked_update` on this tree when every tensor is a
        contiguous CPU tensor (``stored`` may be a strided column); None otherwise."""
        if not priority_kernels.fusable(slots, generations, priorities) or stored.device.type != "cpu":
            return None
        return priority_kernels.checked_update(
            self._tree, slots, generations, stored.numpy(), priorities, capacity, reject_nonfinite, alpha, eps,
            max_priority.view(1).numpy(),
        )  # fmt: skip
