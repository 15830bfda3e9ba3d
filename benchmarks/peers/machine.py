"""The CPU's model name (the rest of a run's ``machine`` record: ``script.machine``; its git commit,
dirty flag and load averages: ``provenance.py``). Standard library only."""

from __future__ import annotations

import platform


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
