"""A checkpoint engine for verl's ``separate_async`` trainer on CPU: the weights through a Ray actor.

verl's ``separate_async`` trainer keeps its rollout on resources of its own and syncs the trainer's
weights to it after every step through a ``CheckpointEngine`` other than ``naive`` (verl ships GPU
transports: nccl, nixl, mooncake). This one, ``cpu_ray``, registered when verl imports this module
(``rollout.checkpoint_engine.custom_backend_module``), hands the full state dict through a named Ray
actor: the trainer's rank 0 puts each version, every rollout worker waits for the next one and reads
it. Measurement harness only: a copy through Ray's object store, no collective.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from conduit_verl_cpu.rollout import _aiter

BACKEND = "cpu_ray"
BOX_NAME = "conduit_cpu_weight_box"


class WeightBox:
    """The latest weights and their sequence number; ``get(after)`` waits for a newer one."""

    def __init__(self) -> None:
        self.seq = 0
        self.state: dict[str, torch.Tensor] = {}
        self.cond = asyncio.Condition()

    async def put(self, state: dict[str, torch.Tensor]) -> int:
        async with self.cond:
            self.seq += 1
            self.state = state
            self.cond.notify_all()
            return self.seq

    async def get(self, after: int) -> tuple[int, dict[str, torch.Tensor]]:
        async with self.cond:
            await self.cond.wait_for(lambda: self.seq > after)
            return self.seq, self.state


_handle: Any = None


def _box() -> Any:
    """The run's weight box (created by whoever asks first; detached, so it lives as long as the
    run's own Ray cluster, whichever worker created it)."""
    global _handle
    if _handle is None:
        options = {"name": BOX_NAME, "get_if_exists": True, "lifetime": "detached", "num_cpus": 0}
        _handle = ray.remote(WeightBox).options(**options, max_concurrency=64).remote()
    return _handle


@CheckpointEngineRegistry.register(BACKEND)
class RayObjectCheckpointEngine(CheckpointEngine):
    """Trainer side (``is_master``: rank 0 of the actor group) puts, rollout side gets."""

    def __init__(self, bucket_size: int = 0, is_master: bool = False, **_kwargs: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.seen = 0  # the last version this rollout worker received

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        return (
            {"role": ["actor"] * actor_wg_world_size},
            {"role": ["rollout"] * rollout_world_size},
        )

    def init_process_group(self, **kwargs: Any) -> None:
        return None

    def finalize(self) -> None:
        return None

    @torch.no_grad()
    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
        """Every actor rank runs the (collective) generator; rank 0 keeps a CPU copy and puts it."""
        state: dict[str, torch.Tensor] = {}
        async for name, tensor in _aiter(weights):
            if self.is_master:
                state[name] = tensor.detach().to("cpu").clone()
        if self.is_master:
            await _box().put.remote(state)
        return {}

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        self.seen, state = await _box().get.remote(self.seen)
        for name, tensor in state.items():
            yield name, tensor
