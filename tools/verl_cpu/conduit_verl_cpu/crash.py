"""What crash tests and benchmarks of the CPU harness share: killing a run, comparing responses."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher started with ``start_new_session=True`` and every process of its session
    (Ray and every worker it started), by the session's id."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ps = subprocess.run(["ps", "-o", "pid=", "-s", str(proc.pid)], capture_output=True, text=True)
        left = ps.stdout.split()
        if not left:
            return
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def responses_checksum(responses: list[list[int]]) -> str:
    """Checksum of a group's responses (token ids), whatever their order."""
    return hashlib.sha256(json.dumps(sorted(responses)).encode()).hexdigest()
