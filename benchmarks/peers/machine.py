"""Facts about the machine and the software a run used."""

from __future__ import annotations

import os
import platform
from typing import Any


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ('unknown' where unavailable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages, or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def mem_total_gib() -> float | None:
    """Physical memory in GiB from /proc/meminfo."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """CPU model, core count, memory, load, and the main env's package versions."""
    import torch

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "mem_total_gib": mem_total_gib(),
        "python": platform.python_version(),
        "load_average_at_start": load_average(),
        "main_env": {"torch": torch.__version__, "num_threads": torch.get_num_threads()},
    }
    for mod in ("tensordict", "ray", "numpy"):
        try:
            info["main_env"][mod] = __import__(mod).__version__
        except ImportError:
            info["main_env"][mod] = None
    return info
