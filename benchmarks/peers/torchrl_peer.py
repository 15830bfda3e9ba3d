"""TorchRL's side of the benchmark; runs inside the TorchRL venv (see ``envs/setup_torchrl.sh``).

``ReplayBuffer(LazyTensorStorage(capacity), PrioritizedSampler | RandomSampler)`` over a TensorDict with
one ``obs`` column. Prioritized sample cells time ``sample`` followed by ``update_priority`` with new
priorities, the cost a DQN learner pays per step.

Serves the :class:`harness.System` calls through ``child.serve`` (one JSON line each way), so the
parent can interleave TorchRL's rounds with the other systems': requests ``{"cmd": "open"|"prepare"|
"round"|"work"|"close"|"info"|"exit", ...}``, replies ``{"result": ...}`` or ``{"error", "traceback"}``.
Usage: ``python torchrl_peer.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from child import protocol_reply, serve
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


def handle(system: TorchRLSystem, req: dict[str, Any]) -> dict[str, Any]:
    """Apply one request to ``system``; its reply, ``{"result": ...}``."""
    call = req["cmd"]
    if call == "open":
        result: Any = system.open(req["sampler"], req["dim"], req["capacity"])
    elif call == "prepare":
        result = system.prepare(Cell.from_dict(req["cell"]), req["warmup"])
    elif call == "round":
        result = list(system.round(req["seconds"]))
    elif call == "work":
        result = system.work(Cell.from_dict(req["cell"]))
    elif call == "close":
        result = system.close()
    elif call == "info":
        result = versions()
    else:
        raise ValueError(f"unknown call {call!r}")
    return {"result": result}


def main() -> None:
    """Serve requests from stdin until ``exit`` or end of input."""
    reply = protocol_reply()  # stdout carries the protocol only; TorchRL's prints go to the log
    import torchrl  # noqa: F401  (import once, before the first timed call; it resets its logger level)

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    system = TorchRLSystem()
    serve(reply, lambda req: handle(system, req))


if __name__ == "__main__":
    main()
