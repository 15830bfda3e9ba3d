"""Facts about the machine and the software a run used (the run's git commit, dirty flag and load
averages come from ``benchmarks/provenance.py``, which needs ``benchmarks/`` on ``sys.path``)."""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path
from typing import Any

from provenance import git

REPO = Path(__file__).resolve().parent.parent.parent


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


def conduit_source() -> dict[str, Any]:
    """Which Conduit code was measured: git HEAD, whether conduit/ differs from it, and a content hash."""
    digest = hashlib.sha256()
    for f in sorted((REPO / "conduit").rglob("*.py")):
        digest.update(f.relative_to(REPO).as_posix().encode())
        digest.update(f.read_bytes())

    status = git("status", "--porcelain", "--", "conduit")
    return {
        "git_head": git("rev-parse", "HEAD"),
        "conduit_dir_modified": None if status is None else bool(status),
        "conduit_py_sha256": digest.hexdigest()[:16],
    }


def machine_info() -> dict[str, Any]:
    """CPU model, core count, memory, and the main env's package versions."""
    import torch

    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "mem_total_gib": mem_total_gib(),
        "python": platform.python_version(),
        "main_env": {"torch": torch.__version__, "num_threads": torch.get_num_threads()},
        "conduit_source": conduit_source(),
    }
    for mod in ("tensordict", "ray", "numpy"):
        try:
            info["main_env"][mod] = __import__(mod).__version__
        except ImportError:
            info["main_env"][mod] = None
    return info
