"""Provenance of a benchmark run: which commit, whether the tree was dirty, and the machine's load.

    tok = provenance.start()                 # first thing the run does (reads the git facts)
    ...
    machine.update(provenance.finish(tok))   # git_commit, git_dirty, load_average_start/_end, created_utc,
                                             # command

The git facts are read in ``start`` (the code the run imported); ``git_dirty`` counts untracked files
and is None where git cannot tell; ``command`` is the script's name and arguments (``sys.argv``), so
that every results file says how it was made. Standard library only (the GPU scripts need it too).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git(*args: str) -> str | None:
    """``git -C REPO *args``'s stripped stdout, or None (no git, not a checkout, error, timeout)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def command_line() -> str:
    """The command that started this process: the script's file name and its arguments."""
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages, rounded to 0.01, or None where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@dataclass(frozen=True)
class Start:
    """What ``start`` captured; pass it to ``finish``."""

    git_commit: str
    git_dirty: bool | None
    load_average_start: list[float] | None


def start(own_outputs: tuple[Path, ...] = ()) -> Start:
    """Capture the commit, the dirty flag and the load average at the start of a run. Files under
    ``own_outputs`` (the folder a multi-part run writes its records to) do not make the tree dirty:
    they are this run's own output, not code it ran."""
    status = git("status", "--porcelain", "--untracked-files=all")
    mine = [str(p.resolve().relative_to(REPO)) for p in own_outputs if p.resolve().is_relative_to(REPO)]
    lines = [x for x in (status or "").splitlines() if not any(x[3:].startswith(m) for m in mine)]
    return Start(
        git_commit=git("rev-parse", "HEAD") or "unknown",
        git_dirty=None if status is None else bool(lines),
        load_average_start=load_average(),
    )


def finish(token: Start) -> dict[str, Any]:
    """The provenance record of a run begun with ``token = start()``; call it when the run ends."""
    return {
        "git_commit": token.git_commit,
        "git_dirty": token.git_dirty,
        "load_average_start": token.load_average_start,
        "load_average_end": load_average(),
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command_line(),
    }
