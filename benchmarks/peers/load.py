"""Background CPU load for ``--load``: busy processes on the other cores, switched on and off per round.

A data plane runs next to busy learners and env runners, so a sampler whose threads wait for a busy
core stalls there. ``CpuLoad`` starts ``cores - 1`` pure-Python spin processes once, stopped
(SIGSTOP); :meth:`CpuLoad.on` resumes them (SIGCONT) for the loaded rounds of a cell and stops them
again after, so the loaded and idle rounds of a cell alternate on the same buffers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

SPIN = "while True:\n    pass\n"
SETTLE_S = 0.02  # let the scheduler place the resumed spinners before timing


class CpuLoad:
    """``processes`` spinning Python processes (default: one per core but one), paused between uses."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = max(1, (os.cpu_count() or 2) - 1) if processes is None else processes
        self._procs = [
            subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL)
            for _ in range(self.processes)
        ]
        self._signal(signal.SIGSTOP)

    def _signal(self, sig: signal.Signals) -> None:
        for p in self._procs:
            if p.poll() is None:
                os.kill(p.pid, sig)

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        """The spinners run inside this block, and are paused again when it exits."""
        self._signal(signal.SIGCONT)
        time.sleep(SETTLE_S)
        try:
            yield
        finally:
            self._signal(signal.SIGSTOP)

    def close(self) -> None:
        """End the spinners (the processes this object started, by pid)."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self._procs = []

    def __enter__(self) -> CpuLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _python_work() -> int:
    x = 0
    for i in range(20_000):
        x += i
    return x


def reference_slowdown(load: CpuLoad, rounds: int = 7, calls: int = 20) -> dict[str, Any]:
    """Loaded ÷ idle median time of a fixed single-threaded pure-Python loop, alternating rounds.

    The floor for any single-threaded call on this machine: about 1 where the other cores are idle
    otherwise, up to 2 where the benchmark's own core is shared with the spinners (oversubscribed VM,
    other users). A sampler's loaded ÷ idle above this floor is time spent waiting for busy cores.
    """
    idle, busy = [], []
    for _ in range(rounds):
        for state, out in ((False, idle), (True, busy)):
            with load.on() if state else contextlib.nullcontext():
                t0 = time.perf_counter()
                for _ in range(calls):
                    _python_work()
                out.append((time.perf_counter() - t0) / calls * 1e6)
    i, b = statistics.median(idle), statistics.median(busy)
    return {
        "workload": "pure-Python loop of 20k additions",
        "idle_us": i,
        "loaded_us": b,
        "loaded_over_idle": b / i,
    }
