"""The verl CPU harness run the way the end-to-end tests run it: ``python -m conduit_verl_cpu.run`` in a
subprocess, checked to exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run_harness(work: Path, *args: str, timeout: float = 840) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the harness with ``--work-dir work`` and ``args`` (its flags and hydra overrides); assert it
    exited 0, with the last 4,000 characters of its output as the message. Returns the process and that
    tail (for later messages)."""
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--work-dir", str(work), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    return proc, tail
