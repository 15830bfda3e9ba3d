"""What ``tq_backends.py`` derives from its rows: SimpleStorage's best unit count per cell and op, the
Conduit ÷ SimpleStorage and Conduit ÷ memcpy ratios, the per-unit-count summary, and the targets."""

from __future__ import annotations

import statistics

from tq_worker import MIB

TARGET_MIN_FIELD_BYTES = MIB  # the get/put targets apply to cells with >= 1 MiB in every token field
BIG = f"cells with >= {TARGET_MIN_FIELD_BYTES // MIB} MiB in every token field"
#: name: (rule, nodes, op, reference, factor, only cells with >= 1 MiB in every token field)
TARGETS = {
    "same_node_get_vs_simplestorage": (
        f"same-node get GB/s >= 5x SimpleStorage, best unit count ({BIG})", 1, "get", "SimpleStorage", 5.0, True),
    "same_node_get_vs_memcpy": (
        f"same-node get GB/s >= 50% of memcpy into preallocated memory ({BIG})", 1, "get", "memcpy", 0.5, True),
    "same_node_put_vs_simplestorage": (
        f"same-node put GB/s >= 3x SimpleStorage, best unit count ({BIG})", 1, "put", "SimpleStorage", 3.0, True),
    "same_node_put_vs_simplestorage_all_cells": (
        "same-node put GB/s >= 3x SimpleStorage, best unit count (every cell; informational)", 1, "put",
        "SimpleStorage", 3.0, False),
    "cross_node_put_vs_simplestorage": (
        "cross-node put GB/s >= SimpleStorage, best unit count (every cell)", 3, "put", "SimpleStorage", 1.0, False),
    "cross_node_get_vs_simplestorage": (
        "cross-node get GB/s >= SimpleStorage, best unit count (every cell)", 3, "get", "SimpleStorage", 1.0, False),
}  # fmt: skip


def find(rows: list[dict], system: str, op: str, nodes: int, b: int, t: int,
         units: int | None = None) -> dict | None:  # fmt: skip
    """The row of ``system`` for one cell and op; for SimpleStorage, the given unit count's row or, by
    default, the best (highest GB/s) over the unit counts swept."""
    found = [
        r
        for r in rows
        if (r["system"], r["op"], r["nodes"], r["samples"], r["tokens_per_sample"])
        == (system, op, nodes, b, t)
        and (units is None or r.get("storage_units") == units)
    ]
    return max(found, key=lambda r: r["gb_per_s"]) if found else None


def mark_best_units(rows: list[dict]) -> None:
    """Set ``best_of_units`` on every SimpleStorage row: whether it is its cell and op's best unit count."""
    for r in rows:
        if r["system"] == "SimpleStorage":
            best = find(rows, "SimpleStorage", r["op"], r["nodes"], r["samples"], r["tokens_per_sample"])
            r["best_of_units"] = best is r


def simple_units(rows: list[dict]) -> list[int]:
    return sorted({r["storage_units"] for r in rows if r["system"] == "SimpleStorage"})


def units_summary(rows: list[dict]) -> list[dict]:
    """Per phase and op, each SimpleStorage unit count's geometric-mean GB/s over the cells and the
    number of cells where it was the best."""
    out = []
    for nodes in sorted({r["nodes"] for r in rows}):
        for op in ("put", "get"):
            for u in simple_units(rows):
                mine = [r for r in rows if (r["system"], r["nodes"], r["op"], r.get("storage_units")) ==
                        ("SimpleStorage", nodes, op, u)]  # fmt: skip
                if mine:
                    geo = statistics.geometric_mean([r["gb_per_s"] for r in mine])
                    best = sum(bool(r.get("best_of_units")) for r in mine)
                    out.append({"nodes": nodes, "op": op, "storage_units": u, "cells": len(mine),
                                "geomean_gb_per_s": round(geo, 4), "best_in_cells": best})  # fmt: skip
    return out


def cells_of(rows: list[dict]) -> list[tuple[int, int, int]]:
    seen: list[tuple[int, int, int]] = []
    for r in rows:
        key = (r["nodes"], r["samples"], r["tokens_per_sample"])
        if key not in seen:
            seen.append(key)
    return seen


def compute_ratios(rows: list[dict]) -> list[dict]:
    out = []
    for nodes, b, t in cells_of(rows):
        memcpy = find(rows, "memcpy", "copy_into", nodes, b, t)
        for op in ("put", "get"):
            c, s = find(rows, "Conduit", op, nodes, b, t), find(rows, "SimpleStorage", op, nodes, b, t)
            if c is None:
                continue
            out.append({
                "nodes": nodes, "samples": b, "tokens_per_sample": t, "op": op,
                "conduit_over_simplestorage": None if s is None else round(c["gb_per_s"] / s["gb_per_s"], 3),
                "simplestorage_units": None if s is None else s["storage_units"],
                "conduit_over_memcpy": None if memcpy is None else round(c["gb_per_s"] / memcpy["gb_per_s"], 3),
            })  # fmt: skip
    return out


def evaluate_targets(rows: list[dict]) -> dict[str, dict]:
    """Each of :data:`TARGETS`: its rule, the ratio per cell it applies to, and whether all cells pass."""

    def rule(text: str, nodes: int, op: str, ref: str, factor: float, big_only: bool) -> dict:
        cells = []
        for n, b, t in cells_of(rows):
            if n != nodes:
                continue
            c = find(rows, "Conduit", op, n, b, t)
            r = find(rows, ref, "copy_into" if ref == "memcpy" else op, n, b, t)
            if c is None or r is None or (big_only and c["min_field_bytes"] < TARGET_MIN_FIELD_BYTES):
                continue
            ratio = c["gb_per_s"] / r["gb_per_s"]
            cell = {"samples": b, "tokens_per_sample": t, "ratio": round(ratio, 3), "pass": ratio >= factor}
            if ref == "SimpleStorage":
                cell["simplestorage_units"] = r["storage_units"]  # its best unit count in this cell
            if c.get("client_seconds"):
                # the ratio a backend taking no time at all would reach, given the TQ client's own time
                cell["bound"] = round(r["seconds"] / c["client_seconds"], 2)
            cells.append(cell)
        return {"rule": text, "cells": cells, "pass": all(x["pass"] for x in cells) if cells else None}

    return {name: rule(*spec) for name, spec in TARGETS.items()}
