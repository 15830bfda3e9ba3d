"""Shared benchmark harness: the cell grid, the row record and the timer.

Imported by every peer, including ``torchrl_peer.py`` which runs in a separate venv with another torch
release, so this module depends on the standard library only.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

FLOAT32_BYTES = 4
FULL_CAPACITY = 100_000
LARGE_DIM = 4096
LARGE_DIM_CAPACITY = 8192
ALPHA = 0.6
BETA = 0.4
PREFILL_CHUNK = 8192  # rows a prefill adds per call
N_PRIORITY_SETS = 16  # prioritized sample cells cycle through this many sets of new priorities


def prefill(extend: Callable[[int], None], capacity: int) -> None:
    """Fill a buffer to ``capacity`` rows: ``extend(n)`` adds ``n`` random rows, ``PREFILL_CHUNK`` at most."""
    filled = 0
    while filled < capacity:
        n = min(PREFILL_CHUNK, capacity - filled)
        extend(n)
        filled += n


def capacity_for(dim: int) -> int:
    """Buffer capacity used by every system for a cell of transition size ``dim`` (float32 values)."""
    return FULL_CAPACITY if dim < LARGE_DIM else LARGE_DIM_CAPACITY


@dataclass(frozen=True)
class Cell:
    """One measured configuration; the same cell is run by each system."""

    op: str  # "insert" | "sample"
    sampler: str  # "uniform" | "prioritized"
    batch: int
    dim: int
    capacity: int

    @property
    def nbytes(self) -> int:
        """Payload bytes moved by one call: ``batch`` rows of ``dim`` float32 values."""
        return self.batch * self.dim * FLOAT32_BYTES

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able) form."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Cell:
        """Inverse of :meth:`to_dict`."""
        return Cell(**{k: d[k] for k in ("op", "sampler", "batch", "dim", "capacity")})


@dataclass(frozen=True)
class Timing:
    """How long to time each cell: ``rounds`` rounds of at least ``min_time / rounds`` seconds each."""

    min_time: float = 0.2
    rounds: int = 5
    warmup: int = 3

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able) form."""
        return dataclasses.asdict(self)


def make_grid(
    batches: Iterable[int], dims: Iterable[int], ops: Iterable[str], samplers: Iterable[str]
) -> list[Cell]:
    """The cross product of the given axes, with each dim's capacity."""
    return [
        Cell(op, sampler, b, d, capacity_for(d))
        for d in dims
        for sampler in samplers
        for op in ops
        for b in batches
    ]


def group_by_buffer(cells: Iterable[Cell]) -> dict[tuple[str, int, int], list[Cell]]:
    """Cells keyed by (sampler, dim, capacity): one prefilled buffer serves each group."""
    groups: dict[tuple[str, int, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.sampler, c.dim, c.capacity), []).append(c)
    return groups


@dataclass(frozen=True)
class Measured:
    """Seconds per call of every timing round, summarised as the median round and the best round."""

    best: float
    median: float
    calls: int
    per_round: tuple[float, ...] = ()

    @staticmethod
    def from_rounds(rounds: list[tuple[float, int]]) -> Measured:
        """Summarise ``(elapsed seconds, calls)`` rounds."""
        per_call = [e / n for e, n in rounds]
        return Measured(
            min(per_call), statistics.median(per_call), sum(n for _, n in rounds), tuple(per_call)
        )


def work_record(
    transitions: int, field_bytes: dict[str, int], priority_update: bool, access: str
) -> dict[str, Any]:
    """What one call of a cell did, measured on the call's own payload (see :meth:`System.measure`).

    ``transitions``: rows delivered (sample) or taken in (insert); ``fields``: the names of the
    columns / arrays delivered or taken in; ``bytes``: their payload; ``priority_update``: whether the
    call also wrote new priorities; ``access``: how the rows were reached (``"buffer"`` for a
    replay buffer's sample or insert, ``"contiguous copy"`` for the memcpy reference). Two systems'
    times are only divided where these records are equal (``analysis.work_difference``).
    """
    return {
        "transitions": int(transitions),
        "fields": sorted(field_bytes),
        "bytes": int(sum(field_bytes.values())),
        "priority_update": bool(priority_update),
        "access": access,
    }


def run_round(fn: Callable[[], object], seconds: float) -> tuple[float, int]:
    """Call ``fn`` repeatedly (GC paused) until ``seconds`` have passed; return (elapsed, calls)."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        n = 0
        t0 = time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                return elapsed, n
    finally:
        if gc_was_enabled:
            gc.enable()


class System:
    """One benchmarked system, driven cell by cell so that systems can be interleaved round by round.

    Subclasses implement :meth:`open` (build and prefill a buffer for one (sampler, dim, capacity)),
    :meth:`step_fn` (the callable timed for a cell; it returns the payload it moved: the delivered
    batch for a sample, what it took in for an insert), :meth:`measure` (the work record of one call,
    from that payload) and :meth:`close`; :meth:`supports` limits cells.
    """

    name = "system"

    def __init__(self) -> None:
        self._fn: Callable[[], object] | None = None
        self._last: object = None

    def supports(self, cell: Cell) -> bool:
        """Whether this system measures ``cell``."""
        return True

    def open(self, sampler: str, dim: int, capacity: int) -> None:
        """Build and prefill (to capacity) the buffer the following cells run on."""
        raise NotImplementedError

    def step_fn(self, cell: Cell) -> Callable[[], object]:
        """The callable one timed call of ``cell`` runs."""
        raise NotImplementedError

    def measure(self, cell: Cell, payload: object) -> dict[str, Any]:
        """The :func:`work_record` of one call of ``cell`` that returned ``payload``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the buffer built by :meth:`open`."""
        self._fn = None
        self._last = None

    def prepare(self, cell: Cell, warmup: int) -> None:
        """Make ``cell`` current and run its warmup calls (at least one: it gives the work record)."""
        self._fn = self.step_fn(cell)
        for _ in range(max(1, warmup)):
            self._last = self._fn()

    def work(self, cell: Cell) -> dict[str, Any]:
        """The work one call of the current cell does, measured on the last warmup call's payload."""
        return self.measure(cell, self._last)

    def round(self, seconds: float) -> tuple[float, int]:
        """One timing round of the current cell."""
        assert self._fn is not None, "prepare() a cell first"
        return run_round(self._fn, seconds)


def make_row(cell: Cell, system: str, m: Measured, **extra: Any) -> dict[str, Any]:
    """The flat result record of one cell for one system: median round beside best round."""
    row: dict[str, Any] = {
        "op": cell.op,
        "sampler": cell.sampler,
        "batch": cell.batch,
        "dim": cell.dim,
        "capacity": cell.capacity,
        "system": system,
        "us_per_call_median": m.median * 1e6,
        "us_per_call_best": m.best * 1e6,
        "items_per_s_median": cell.batch / m.median,
        "items_per_s_best": cell.batch / m.best,
        "gb_per_s_median": cell.nbytes / m.median / 1e9,
        "gb_per_s_best": cell.nbytes / m.best / 1e9,
        "rounds": len(m.per_round),
        "us_per_call_rounds": [round(x * 1e6, 2) for x in m.per_round],
        "timed_calls": m.calls,
    }
    row.update(extra)
    return row


def progress_line(row: dict[str, Any]) -> str:
    """One human-readable progress line for a finished row."""
    return (
        f"  {row['system']:<8} {row['op']:<6} {row['sampler']:<11} B={row['batch']:<5} dim={row['dim']:<6} "
        f"{'loaded' if row.get('load') else 'idle':<6} "
        f"median {row['us_per_call_median']:>10.1f} us/call (best {row['us_per_call_best']:>10.1f}) "
        f"{row['items_per_s_median']:>13,.0f} items/s {row['gb_per_s_median']:>8.3f} GB/s"
    )
