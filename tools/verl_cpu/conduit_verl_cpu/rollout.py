"""The "hf" rollout for verl: a replica (``RolloutReplicaRegistry``) and an in-worker adapter.

- ``HFReplica`` launches one ``HFGenerationServer`` actor per replica (a ``PacedGenerationServer``
  when ``rollout.engine_kwargs.hf.paced`` is set: ``paced_server.py``); verl's load balancer and
  agent loop talk to it like to a vLLM server.
- ``HFRolloutAdapter`` is the ``BaseRollout`` built inside the actor worker (hybrid engine). On
  ``update_weights`` (sync trainer: after every step) it ships the actor's full weights to the server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from conduit_verl_cpu.hf_server import HFGenerationServer

logger = logging.getLogger(__name__)


def server_actor_name(replica_rank: int) -> str:
    """Ray name of the generation server of ``replica_rank`` (job-scoped namespace)."""
    return f"conduit_hf_server_{replica_rank}"


def _model_path(model_config: Any) -> str:
    """Local model dir from an ``HFModelConfig`` or the raw ``actor_rollout_ref.model`` DictConfig."""
    if hasattr(model_config, "get"):
        return str(model_config.get("local_path") or model_config.get("path"))
    return str(getattr(model_config, "local_path", None) or model_config.path)


def paced_settings(rollout_config: Any) -> dict[str, Any]:
    """``actor_rollout_ref.rollout.engine_kwargs.hf.paced`` as a dict (empty: not paced)."""
    engine = rollout_config.get("engine_kwargs") or {}
    paced = (engine.get("hf") or {}).get("paced") or {}
    return {str(k): v for k, v in paced.items()}


class HFReplica(RolloutReplica):
    """One CPU generation server per replica (hybrid mode: colocated with the actor worker)."""

    async def launch_servers(self) -> None:
        name = server_actor_name(self.replica_rank)
        if self.is_reward_model or self.is_teacher_model:
            name = f"{name}{'_reward' if self.is_reward_model else '_teacher'}{self.name_suffix}"
        kwargs: dict[str, Any] = dict(
            model_path=_model_path(self.model_config),
            response_length=self.config.response_length,
            prompt_length=self.config.prompt_length,
            seed=int(self.config.get("seed", 0) or 0),
        )
        server_cls: Any = ray.remote(HFGenerationServer)
        if pace := paced_settings(self.config):
            from conduit_verl_cpu.paced_server import PacedGenerationServer

            server_cls, kwargs["pace"] = ray.remote(PacedGenerationServer), pace
        options = {"name": name, "num_cpus": 0.1, "max_concurrency": self.max_concurrency}
        server: ray.actor.ActorHandle = server_cls.options(**options).remote(**kwargs)
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{name}.local"  # a routing key; there is no HTTP server

    def rollout_worker_use_gpu(self) -> bool:
        return False


async def _aiter(weights: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[Any]:
    if hasattr(weights, "__aiter__"):
        async for item in weights:  # type: ignore[union-attr]
            yield item
    else:
        for item in weights:  # type: ignore[union-attr]
            yield item


class HFRolloutAdapter(BaseRollout):
    """Lives in the hybrid actor worker; forwards weight updates to this replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        world *= self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self._has_server = rank % world == 0
        self._server: ray.actor.ActorHandle | None = None

    def _server_handle(self) -> ray.actor.ActorHandle:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        """Materialise the (collective) weight generator on every rank; rank 0 of the replica sends it."""
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"hf rollout supports wire_format='named_tensors' only, got {wire_format!r}"
            )
        state: dict[str, torch.Tensor] = {}
        async for name, tensor in _aiter(weights):
            if self._has_server:
                state[name] = tensor.detach().to("cpu", torch.float32).clone()
        if not self._has_server:
            return
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf rollout does not support LoRA adapters")
        await self._server_handle().load_weights.remote(state, kwargs.get("global_steps"))
