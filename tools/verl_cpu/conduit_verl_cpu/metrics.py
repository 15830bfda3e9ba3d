"""Read verl's ``file`` logger JSONL (one line per iteration) and print compact progress."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

#: The per-iteration numbers shown in progress lines (verl's metric names).
PROGRESS_KEYS = (
    ("step_s", "timing_s/step"),
    ("gen_s", "timing_s/gen"),
    ("update_actor_s", "timing_s/update_actor"),
    ("pg_loss", "actor/pg_loss"),
    ("grad_norm", "actor/grad_norm"),
    ("score", "critic/score/mean"),
)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Return ``[{"step": int, **metrics}, ...]`` from a verl file-logger JSONL."""
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            rows.append({"step": rec["step"], **rec["data"]})
    return rows


def progress_line(row: dict[str, Any], elapsed_s: float | None = None) -> str:
    """One human-readable line for an iteration (``elapsed_s``: since the launcher started)."""
    parts = [f"step {row['step']}"] + ([f"t=+{elapsed_s:.1f}s"] if elapsed_s is not None else [])
    for label, key in PROGRESS_KEYS:
        if key in row:
            parts.append(f"{label}={row[key]:.4g}")
    return "[conduit-cpu] " + " ".join(parts)


class ProgressPrinter(threading.Thread):
    """Tails the metrics JSONL while the trainer runs and prints one line per new iteration."""

    def __init__(self, path: str | Path, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.path, self.interval_s = Path(path), interval_s
        self._stop_event = threading.Event()
        self._seen = 0
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        rows = read_metrics(self.path) if self.path.exists() else []
        for row in rows[self._seen :]:
            print(progress_line(row, time.monotonic() - self._t0), flush=True)
        self._seen = len(rows)

    def stop(self) -> None:
        self._stop_event.set()
        self.flush()
