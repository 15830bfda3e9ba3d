"""Which TransferQueue storage backend a run used, and the Conduit backend's counters at its end.

With ``CONDUIT_VERL_TQ_STATS=<file>`` (the launcher sets it), TransferQueue's ``close`` is wrapped: in
the process that started the storage (verl's task runner, whose ``tq.init`` bootstrapped it; it calls
``tq.close`` once training ends), it first writes ``{"backend": <storage_backend>, "nodes": [...]}``:
for the ``Conduit`` backend, every storage actor's ``stats()`` (bytes put, bytes read mapped or copied,
each field's tier); for other backends ``nodes`` is ``null``. Other processes write nothing.

With the same variable, every process times its storage manager's ``put_data`` / ``get_data`` /
``clear_data`` (any backend: the factory's product is wrapped) and appends one JSON line per call to
``<dir of that file>/tq_calls/<pid>.jsonl``; :func:`call_totals` sums them (seconds and calls per op).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
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


def install_timing() -> None:
    """Time every storage-manager call of this process (no-op without the env var)."""
    path = os.environ.get(STATS_ENV)
    if not path:
        return
    from transfer_queue.storage.managers.base import StorageManagerFactory

    original = StorageManagerFactory.create.__func__  # type: ignore[attr-defined]
    if getattr(original, "_conduit_timed", False):
        return
    out = Path(path).parent / "tq_calls"
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{os.getpid()}.jsonl"

    def timed(op: str, fn: Any) -> Any:
        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                with log.open("a") as f:
                    f.write(json.dumps({"op": op, "s": time.perf_counter() - t0, "t": time.time()}) + "\n")

        return call

    @functools.wraps(original)
    def create(cls: Any, *args: Any, **kwargs: Any) -> Any:
        manager = original(cls, *args, **kwargs)
        for op in ("put_data", "get_data", "clear_data"):
            setattr(manager, op, timed(op.removesuffix("_data"), getattr(manager, op)))
        return manager

    create._conduit_timed = True  # type: ignore[attr-defined]
    StorageManagerFactory.create = classmethod(create)  # type: ignore[method-assign, assignment]


def call_totals(work: str | Path, after: float | None = None) -> dict[str, float]:
    """Seconds and calls per storage op over every process of a run (``tq_put_s``, ``tq_put_calls``, ...);
    with ``after`` (a ``time.time()``), only the calls that ended after it."""
    out: dict[str, float] = {}
    for log in sorted((Path(work) / "tq_calls").glob("*.jsonl")):
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            if after is not None and rec.get("t", 0.0) <= after:
                continue
            out[f"tq_{rec['op']}_s"] = out.get(f"tq_{rec['op']}_s", 0.0) + rec["s"]
            out[f"tq_{rec['op']}_calls"] = out.get(f"tq_{rec['op']}_calls", 0) + 1
    return out


def warmup_end(work: str | Path) -> float | None:
    """When the run's second iteration began generating (``gen_events.jsonl``: the first response of
    weight version 2), the end of the warm-up iteration; None if the run has no second iteration."""
    path = Path(work) / "gen_events.jsonl"
    if not path.exists():
        return None
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    versions = sorted({e["version"] for e in events})
    if len(versions) < 2:
        return None
    return min(e["t0"] for e in events if e["version"] == versions[1])
