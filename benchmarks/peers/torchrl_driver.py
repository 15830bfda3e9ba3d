"""Drive ``torchrl_peer.py`` in the separate TorchRL venv and stream its rows back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import Cell, Timing

PEERS_DIR = Path(__file__).resolve().parent
REPO = PEERS_DIR.parent.parent
DEFAULT_PYTHON = REPO / ".venv-torchrl" / "bin" / "python"
SETUP_SCRIPT = PEERS_DIR.parent / "envs" / "setup_torchrl.sh"


@dataclass
class PeerResult:
    """Rows from the peer, its version info, and an error message if it could not run (else None)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


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


def run_torchrl(
    cells: Iterable[Cell],
    timing: Timing,
    on_row: Callable[[dict[str, Any]], None],
    python: Path = DEFAULT_PYTHON,
    threads: int | None = None,
    build: bool = False,
) -> PeerResult:
    """Run the cells in the TorchRL venv; a failure is returned as ``PeerResult.error``, never raised."""
    res = PeerResult()
    res.error = ensure_env(python, build)
    if res.error:
        return res
    cmd = [
        str(python),
        str(PEERS_DIR / "torchrl_peer.py"),
        "--cells",
        json.dumps([c.to_dict() for c in cells]),
        "--timing",
        json.dumps(timing.to_dict()),
    ]
    if threads:
        cmd += ["--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=str(PEERS_DIR))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            print(f"  torchrl peer: {line.rstrip()}", file=sys.stderr, flush=True)
            continue
        if "row" in msg:
            res.rows.append(msg["row"])
            on_row(msg["row"])
        elif "info" in msg:
            res.info = msg["info"]
    stderr = proc.stderr.read()
    if proc.wait() != 0:
        res.error = f"torchrl peer exited with {proc.returncode}: {stderr.strip()[-800:]}"
    return res
