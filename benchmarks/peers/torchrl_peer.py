"""TorchRL's side of the benchmark; runs inside the TorchRL venv (see ``envs/setup_torchrl.sh``).

``ReplayBuffer(LazyTensorStorage(capacity), PrioritizedSampler | RandomSampler)`` over a TensorDict with
one ``obs`` column. Prioritized sample cells time ``sample`` followed by ``update_priority`` with new
priorities, the cost a DQN learner pays per step.

Serves the :class:`harness.System` calls over stdin/stdout, one JSON object per line, so the parent can
interleave TorchRL's rounds with the other systems': requests ``{"call": "open"|"prepare"|"round"|
"work"|"close"|"info"|"exit", ...}``, replies ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``.
Usage: ``python torchrl_peer.py [--threads N]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
from harness import ALPHA, BETA, N_PRIORITY_SETS, Cell, System, prefill, work_record


class TorchRLSystem(System):
    """A full TorchRL ``ReplayBuffer`` with one ``obs`` float32 column."""

    name = "torchrl"

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, ReplayBuffer

        smp = PrioritizedSampler(capacity, ALPHA, BETA) if sampler == "prioritized" else RandomSampler()
        self._rb: Any = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=smp)
        prefill(lambda n: self._rb.extend(TensorDict({"obs": torch.randn(n, dim)}, batch_size=[n])), capacity)

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        from tensordict import TensorDict

        rb = self._rb
        if cell.op == "insert":
            src = torch.randn(cell.batch, cell.dim)

            def insert() -> Any:
                td = TensorDict({"obs": src}, batch_size=[cell.batch])
                rb.extend(td)
                return td

            return insert
        if cell.sampler != "prioritized":
            return lambda: rb.sample(cell.batch)
        prio_sets = [torch.rand(cell.batch) * 2 + 1e-3 for _ in range(N_PRIORITY_SETS)]
        k = [0]

        def sample_and_update() -> Any:
            td, info = rb.sample(cell.batch, return_info=True)
            rb.update_priority(info["index"], prio_sets[k[0] % N_PRIORITY_SETS])
            k[0] += 1
            return td

        return sample_and_update

    def measure(self, cell: Cell, payload: Any) -> dict[str, Any]:
        leaves = {
            ".".join(k) if isinstance(k, tuple) else k: v.numel() * v.element_size()
            for k, v in payload.items(include_nested=True, leaves_only=True)
        }
        prioritized = cell.op == "sample" and cell.sampler == "prioritized"
        return work_record(int(payload.batch_size[0]), leaves, prioritized, "buffer")

    def close(self) -> None:
        super().close()
        self._rb = None


def versions() -> dict[str, Any]:
    """Versions and thread count of this venv."""
    import os

    import tensordict
    import torchrl

    rebuilt = os.path.join(os.path.dirname(torchrl.__file__), "_torchrl_rebuilt.txt")
    extension = "prebuilt (the release's wheel)"
    if os.path.exists(rebuilt):
        with open(rebuilt) as f:
            extension = f.read().strip()
    return {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "num_threads": torch.get_num_threads(),
        "torchrl_extension": extension,
    }


def handle(system: TorchRLSystem, req: dict[str, Any]) -> Any:
    """Apply one request to ``system``; return its JSON-able result."""
    call = req["call"]
    if call == "open":
        return system.open(req["sampler"], req["dim"], req["capacity"])
    if call == "prepare":
        return system.prepare(Cell.from_dict(req["cell"]), req["warmup"])
    if call == "round":
        return list(system.round(req["seconds"]))
    if call == "work":
        return system.work(Cell.from_dict(req["cell"]))
    if call == "close":
        return system.close()
    if call == "info":
        return versions()
    raise ValueError(f"unknown call {call!r}")


def main() -> None:
    """Serve requests from stdin until ``exit`` or end of input."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import torchrl  # noqa: F401  (import once, before the first timed call; it resets its logger level)

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    system = TorchRLSystem()
    for line in sys.stdin:
        req = json.loads(line)
        if req["call"] == "exit":
            break
        try:
            reply: dict[str, Any] = {"ok": True, "result": handle(system, req)}
        except Exception:  # noqa: BLE001 — report to the parent instead of dying silently
            reply = {"ok": False, "error": traceback.format_exc()[-1500:]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
