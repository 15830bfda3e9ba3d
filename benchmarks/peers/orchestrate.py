"""Run several systems over the same cells, interleaving their timing rounds.

For each (sampler, dim, capacity) group every system builds its prefilled buffer; then for each cell
every system warms up, and the timing rounds go round-robin over the systems (rotating who goes
first), so a burst of load from other processes on a shared machine hits all systems of a cell alike.
With a :class:`load.CpuLoad`, every round is run twice, idle and with the other cores busy, and each
cell gives one row per system and state (``load: false`` / ``true``). Each row carries the work one
call did (``work``, measured on the last warmup call's payload; ratios need it equal). A system that
raises is dropped from the rest of the run and its error recorded.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from harness import Cell, Measured, System, Timing, group_by_buffer, make_row
from load import CpuLoad


def _guard(system: System, errors: dict[str, str], what: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 — one system failing must not lose the others' results
        errors[system.name] = f"{what}: {type(e).__name__}: {e}"
        print(f"!! {system.name} FAILED during {what}: {e}\n{traceback.format_exc()}", flush=True)
        return None


def run_interleaved(
    systems: Sequence[System],
    cells: Sequence[Cell],
    timing: Timing,
    on_row: Callable[[dict[str, Any]], None],
    errors: dict[str, str],
    load: CpuLoad | None = None,
) -> list[dict[str, Any]]:
    """Rows for every (cell, system) pair the system supports (and load state, with ``load``);
    failures go to ``errors``."""
    rows: list[dict[str, Any]] = []
    round_s = timing.min_time / timing.rounds
    for (sampler, dim, cap), group in group_by_buffer(cells).items():
        live = [s for s in systems if s.name not in errors and any(s.supports(c) for c in group)]
        t0 = time.perf_counter()
        for s in live:
            _guard(s, errors, "open", s.open, sampler, dim, cap)
        opened = [s for s in live if s.name not in errors]
        print(
            f"-- {sampler} dim={dim} capacity={cap}: buffers filled in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        for cell in sorted(group, key=lambda c: (c.op == "insert", c.batch)):  # sample before insert
            active = [s for s in opened if s.supports(cell) and s.name not in errors]
            work: dict[str, Any] = {}
            for s in active:
                _guard(s, errors, "warmup", s.prepare, cell, timing.warmup)
                if s.name not in errors:
                    work[s.name] = _guard(s, errors, "work", s.work, cell)
            active = [s for s in active if s.name not in errors]
            states = (False, True) if load is not None else (False,)
            rounds: dict[tuple[str, bool], list[tuple[float, int]]] = {
                (s.name, busy): [] for s in active for busy in states
            }
            for r in range(timing.rounds):
                k = r % max(1, len(active))
                for busy in states:
                    with load.on() if (busy and load is not None) else contextlib.nullcontext():
                        for s in active[k:] + active[:k]:
                            if s.name not in errors:
                                res = _guard(s, errors, "round", s.round, round_s)
                                if res is not None:
                                    rounds[(s.name, busy)].append(res)
            for s in active:
                for busy in states:
                    if s.name not in errors and rounds[(s.name, busy)]:
                        m = Measured.from_rounds(rounds[(s.name, busy)])
                        row = make_row(cell, s.name, m, load=busy, work=work[s.name])
                        rows.append(row)
                        on_row(row)
        for s in opened:
            if s.name not in errors:
                _guard(s, errors, "close", s.close)
    return rows
