"""Run TorchRL in its own venv: check/build the venv, and proxy :class:`harness.System` calls to it."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

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
    """Proxy for ``torchrl_peer.TorchRLSystem`` living in a subprocess of the TorchRL venv."""

    name = "torchrl"

    def __init__(self, python: Path, threads: int | None) -> None:
        super().__init__()
        cmd = [str(python), str(PEERS_DIR / "torchrl_peer.py")] + (
            ["--threads", str(threads)] if threads else []
        )
        env = dict(os.environ, PYTHONPATH=str(PEERS_DIR))
        self._stderr = tempfile.TemporaryFile(mode="w+")  # a file, so a chatty peer can never block on a pipe
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env
        )

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().strip()[-800:]

    def _call(self, call: str, **kw: Any) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(json.dumps({"call": call, **kw}) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise RuntimeError(f"torchrl peer exited ({self._proc.wait()}): {self._stderr_tail()}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"torchrl peer failed on {call!r}: {reply['error']}")
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
        if self._proc.poll() is None and self._proc.stdin is not None:
            try:
                self._proc.stdin.write(json.dumps({"call": "exit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._proc.kill()
        self._stderr.close()
