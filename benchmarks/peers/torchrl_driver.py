"""Run TorchRL in its own venv: check/build the venv, and proxy :class:`harness.System` calls to it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from child import Child
from harness import Cell, System

PEERS_DIR = Path(__file__).resolve().parent
REPO = PEERS_DIR.parent.parent
DEFAULT_PYTHON = REPO / ".venv-torchrl" / "bin" / "python"
SETUP_SCRIPT = PEERS_DIR.parent / "envs" / "setup_torchrl.sh"


def ensure_env(python: Path, build: bool) -> str | None:
    """None if ``python`` can run TorchRL's prioritized sampler, else why not (building the venv if asked)."""
    if build and python == DEFAULT_PYTHON:
        print(f"building the TorchRL venv with {SETUP_SCRIPT} (minutes) ...", flush=True)
        proc = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True)
        if proc.returncode != 0:
            return f"{SETUP_SCRIPT} failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}"
    if not python.exists():
        return f"TorchRL venv not found at {python}; create it with: bash {SETUP_SCRIPT}"
    probe = "from torchrl.data import PrioritizedSampler; PrioritizedSampler(8, 0.6, 0.4)"
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"TorchRL venv at {python} cannot build a PrioritizedSampler: {proc.stderr.strip()[-800:]}"
    return None


class RemoteTorchRL(System):
    """Proxy for ``torchrl_peer.TorchRLSystem`` living in a subprocess of the TorchRL venv (``child.Child``)."""

    name = "torchrl"
    TIMEOUT_S = 600.0  # a prefill of the largest cell's buffer takes the longest

    def __init__(self, python: Path) -> None:
        super().__init__()
        cmd = [str(python), str(PEERS_DIR / "torchrl_peer.py")]
        env = dict(os.environ, PYTHONPATH=str(PEERS_DIR))
        log = Path(tempfile.mkstemp(prefix="torchrl_peer_", suffix=".log")[1])
        self._child = Child("torchrl", cmd, log, env, PEERS_DIR)

    def _call(self, call: str, **kw: Any) -> Any:
        reply = self._child.call({"cmd": call, **kw}, self.TIMEOUT_S)
        if "error" in reply:
            raise RuntimeError(
                f"torchrl peer failed on {call!r}: {reply['error']}\n{reply.get('traceback', '')}"
            )
        return reply["result"]

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        self._call("open", sampler=sampler, dim=dim, capacity=capacity)

    def prepare(self, cell: Cell, warmup: int) -> None:
        self._call("prepare", cell=cell.to_dict(), warmup=warmup)

    def round(self, seconds: float) -> tuple[float, int]:
        elapsed, calls = self._call("round", seconds=seconds)
        return float(elapsed), int(calls)

    def work(self, cell: Cell) -> dict[str, Any]:
        return dict(self._call("work", cell=cell.to_dict()))

    def close(self) -> None:
        self._call("close")

    def info(self) -> dict[str, Any]:
        """Versions reported by the TorchRL venv."""
        return dict(self._call("info"))

    def shutdown(self) -> None:
        """Stop the subprocess."""
        self._child.close(wait_s=10)
