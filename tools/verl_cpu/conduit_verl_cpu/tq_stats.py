"""Which TransferQueue storage backend a run used, and the Conduit backend's counters at its end.

With ``CONDUIT_VERL_TQ_STATS=<file>`` (the launcher sets it), TransferQueue's ``close`` is wrapped: in
the process that started the storage (verl's task runner, whose ``tq.init`` bootstrapped it; it calls
``tq.close`` once training ends), it first writes ``{"backend": <storage_backend>, "nodes": [...]}``:
for the ``Conduit`` backend, every storage actor's ``stats()`` (bytes put, bytes read mapped or copied,
each field's tier); for other backends ``nodes`` is ``null``. Other processes write nothing.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATS_ENV = "CONDUIT_VERL_TQ_STATS"
CONDUIT = "Conduit"


def snapshot() -> dict[str, Any] | None:
    """This process's storage backend and, for Conduit, each storage actor's stats (None: not the owner)."""
    import ray
    from transfer_queue import interface

    storage = getattr(interface, "_TQ_STORAGE", None) or {}
    if not storage:
        return None
    backend = next(iter(storage))
    nodes = None
    if backend == CONDUIT:
        nodes = ray.get([a.stats.remote() for a in storage[backend]], timeout=60)
    return {"backend": backend, "nodes": nodes}


def read(path: str | Path) -> dict[str, Any] | None:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def totals(stats: dict[str, Any]) -> dict[str, int]:
    """The Conduit counters summed over the storage actors (empty for other backends)."""
    out: dict[str, int] = {}
    for node in stats.get("nodes") or []:
        for key, value in node.items():
            if isinstance(value, int):
                out[key] = out.get(key, 0) + value
    return out


def install() -> None:
    """Wrap ``transfer_queue.close`` to write the snapshot first (no-op without the env var)."""
    path = os.environ.get(STATS_ENV)
    if not path:
        return
    import transfer_queue
    from transfer_queue import interface

    original = interface.close
    if getattr(original, "_conduit_patched", False):
        return

    @functools.wraps(original)
    def close() -> Any:
        try:
            snap = snapshot()
            if snap is not None:
                Path(path).write_text(json.dumps(snap, indent=1))
        except Exception:  # noqa: BLE001  (never keep TransferQueue from closing)
            logger.warning("conduit_verl_cpu: could not record TransferQueue storage stats", exc_info=True)
        return original()

    close._conduit_patched = True  # type: ignore[attr-defined]
    interface.close = close
    transfer_queue.close = close  # verl calls `tq.close()` on the package
