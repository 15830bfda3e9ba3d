"""verl platform for CPU-only machines (gloo collectives, a fake Ray "GPU" resource per worker)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from conduit_verl_cpu.device import device_module

PLATFORM_NAME = "cpu"


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """Runs verl's workers on the host CPU. Selected with ``VERL_PLATFORM=cpu``."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: CPU mode is opt-in through VERL_PLATFORM=cpu.
        return False

    def current_device(self) -> Any:  # verl calls model.to(current_device())
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # A fake "GPU" Ray resource (ray_init.num_gpus) gives each worker one slot.
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def rollout_env_vars(self) -> dict[str, str]:
        """Environment of verl's vLLM server actors (verl's hook, ``vLLMReplica.launch_servers``): with
        a core split (``--core-split``, S7) vLLM's OpenMP threads bound to vLLM's cores and the server
        process, so its EngineCore and Worker, pinned to them; the KV cache size in GiB."""
        from conduit_verl_cpu.vllm_cpu import AFFINITY_ENV, VLLM_CORES_ENV

        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        if cores := os.environ.get(VLLM_CORES_ENV):
            env.update({"VLLM_CPU_OMP_THREADS_BIND": cores, AFFINITY_ENV: cores})
        return env

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
