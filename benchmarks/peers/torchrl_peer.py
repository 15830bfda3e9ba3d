"""TorchRL's side of the benchmark; runs inside the TorchRL venv (see ``envs/setup_torchrl.sh``).

``ReplayBuffer(LazyTensorStorage(capacity), PrioritizedSampler | RandomSampler)`` over a TensorDict with
one ``obs`` column. Prioritized cells time ``sample`` followed by ``update_priority`` with new
priorities, the cost a DQN learner pays per step.

Usage: ``python torchrl_peer.py --cells JSON --timing JSON``; prints one JSON object per line:
``{"row": {...}}`` for each finished cell, then ``{"info": {...}}`` with versions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from harness import ALPHA, BETA, Cell, Timing, group_by_buffer, make_row, time_call

PREFILL_CHUNK = 8192
N_PRIORITY_SETS = 16


def _make_buffer(sampler: str, dim: int, capacity: int) -> Any:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, ReplayBuffer

    smp = PrioritizedSampler(capacity, ALPHA, BETA) if sampler == "prioritized" else RandomSampler()
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=smp)
    filled = 0
    while filled < capacity:
        n = min(PREFILL_CHUNK, capacity - filled)
        rb.extend(TensorDict({"obs": torch.randn(n, dim)}, batch_size=[n]))
        filled += n
    return rb


def _insert_fn(rb: Any, src: torch.Tensor) -> Callable[[], None]:
    from tensordict import TensorDict

    b = src.shape[0]

    def step() -> None:
        rb.extend(TensorDict({"obs": src}, batch_size=[b]))

    return step


def _sample_fn(rb: Any, batch: int, prioritized: bool) -> Callable[[], None]:
    prio_sets = [torch.rand(batch) * 2 + 1e-3 for _ in range(N_PRIORITY_SETS)]
    k = [0]

    def sample_only() -> None:
        rb.sample(batch)

    def sample_and_update() -> None:
        _, info = rb.sample(batch, return_info=True)
        rb.update_priority(info["index"], prio_sets[k[0] % N_PRIORITY_SETS])
        k[0] += 1

    return sample_and_update if prioritized else sample_only


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Run the given cells and stream the rows as JSON lines."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cells", required=True, help="JSON list of cell dicts")
    ap.add_argument("--timing", required=True, help="JSON Timing dict")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cells = [Cell.from_dict(d) for d in json.loads(args.cells)]
    timing = Timing(**json.loads(args.timing))

    import tensordict
    import torchrl

    logging.getLogger("torchrl").setLevel(logging.WARNING)

    for (sampler, dim, cap), group in group_by_buffer(cells).items():
        rb = _make_buffer(sampler, dim, cap)
        for cell in sorted(group, key=lambda c: c.op == "insert"):
            if cell.op == "insert":
                fn = _insert_fn(rb, torch.randn(cell.batch, dim))
            else:
                fn = _sample_fn(rb, cell.batch, sampler == "prioritized")
            _emit({"row": make_row(cell, "torchrl", time_call(fn, timing))})
        del rb
    _emit(
        {
            "info": {
                "torch": torch.__version__,
                "torchrl": torchrl.__version__,
                "tensordict": tensordict.__version__,
                "num_threads": torch.get_num_threads(),
            }
        }
    )


if __name__ == "__main__":
    main()
