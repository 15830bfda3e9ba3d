"""A ``torch.cuda``-shaped device module backed by the CPU, for verl's platform layer."""

from __future__ import annotations

import types
from typing import Any

import torch


def _host_memory() -> tuple[int, int]:
    """Return (available, total) host memory in bytes."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except Exception:  # pragma: no cover - psutil is a ray dependency
        return 8 << 30, 16 << 30


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


class CPUDeviceModule(types.ModuleType):
    """Device module: ``torch.cpu`` plus the no-op / numeric calls verl makes on ``torch.cuda``."""

    def __init__(self) -> None:
        super().__init__("conduit_verl_cpu.device_module")
        self.set_device = _noop
        self.synchronize = _noop
        self.empty_cache = _noop
        self.ipc_collect = _noop
        self.reset_peak_memory_stats = _noop
        self.set_per_process_memory_fraction = _noop
        self.memory_allocated = _zero
        self.memory_reserved = _zero
        self.max_memory_allocated = _zero
        self.max_memory_reserved = _zero
        self.is_available = lambda: True
        self.is_initialized = lambda: True
        self.device_count = lambda: 1
        self.current_device = lambda: torch.device("cpu")
        self.get_device_name = lambda *_a, **_k: "cpu"
        self.mem_get_info = lambda *_a, **_k: _host_memory()
        self.get_rng_state = lambda *_a, **_k: torch.get_rng_state()
        self.set_rng_state = lambda state, *_a, **_k: torch.set_rng_state(state)
        self.manual_seed = lambda seed: torch.manual_seed(seed)
        self.manual_seed_all = lambda seed: torch.manual_seed(seed)

    def __getattr__(self, name: str) -> Any:
        """Fall back to ``torch.cpu`` (streams, events, amp)."""
        return getattr(torch.cpu, name)


device_module = CPUDeviceModule()
