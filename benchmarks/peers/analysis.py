"""Derived results: Conduit ÷ peer ratios, per-call overhead, loaded ÷ idle, and the pass/fail targets.

Rows measured with the other cores busy (``load: true``) only enter the loaded ÷ idle comparison;
every other figure uses the idle rows. Every figure is computed on the median round; ratios also give
the best round beside it. A ratio is only computed between two rows whose measured work per call
(``row["work"]``, see ``harness.work_record``) is equal; otherwise it is refused and the difference
recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Key = tuple[str, str, int, int]  # (op, sampler, batch, dim)

OVERHEAD_BATCH = 256
OVERHEAD_LIMIT_US = 10.0
TARGET_BATCHES = (32, 256)
TORCHRL_TARGET_DIMS = (4, 64, 1024)
MIN_X_TORCHRL = 3.0
MIN_X_RLLIB = 30.0
MAX_LOADED_OVER_IDLE = 1.5
GATHER_DIM = 16384
MIN_MEMCPY_FRACTION = 0.5
CONDUIT_SYSTEMS = ("conduit", "conduit_dqn")  # Conduit doing the peers' work: one column / a DQN train batch
REFERENCE_SYSTEMS = ("memcpy",)  # bandwidth references, not peers: no ratio against them
WORK_KEYS = ("transitions", "fields", "bytes", "priority_update", "access")


def idle_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows measured without the ``--load`` spinners."""
    return [r for r in rows if not r.get("load")]


def index_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[Key, Mapping[str, Any]]]:
    """Idle rows keyed by system, then by (op, sampler, batch, dim)."""
    out: dict[str, dict[Key, Mapping[str, Any]]] = {}
    for r in idle_rows(rows):
        out.setdefault(r["system"], {})[(r["op"], r["sampler"], r["batch"], r["dim"])] = r
    return out


def work_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None when rows ``a`` and ``b`` did the same work per call, else what differs (the refusal)."""
    wa, wb = a.get("work"), b.get("work")
    missing = [r["system"] for r, w in ((a, wa), (b, wb)) if not w]
    if missing:
        return f"work not recorded for {', '.join(missing)}"
    assert wa is not None and wb is not None
    diffs = [f"{k} {wa.get(k)!r} vs {wb.get(k)!r}" for k in WORK_KEYS if wa.get(k) != wb.get(k)]
    return "; ".join(diffs) or None


def compute_ratios(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Peer time ÷ Conduit time per call (median round, and best round beside it), for every cell a
    Conduit system and a peer both measured; ``ratio_median`` / ``ratio_best`` are None and
    ``refused`` says why where the two did unequal work."""
    by = index_rows(rows)
    out: list[dict[str, Any]] = []
    peers = sorted(s for s in by if s not in CONDUIT_SYSTEMS and s not in REFERENCE_SYSTEMS)
    for peer in peers:
        for key, prow in sorted(by[peer].items()):
            for csys in CONDUIT_SYSTEMS:
                crow = by.get(csys, {}).get(key)
                if crow is None:
                    continue
                op, sampler, batch, dim = key
                refused = work_difference(crow, prow)
                entry: dict[str, Any] = {
                    "op": op,
                    "sampler": sampler,
                    "batch": batch,
                    "dim": dim,
                    "conduit_system": csys,
                    "peer": peer,
                    "conduit_us_median": crow["us_per_call_median"],
                    "conduit_us_best": crow["us_per_call_best"],
                    "peer_us_median": prow["us_per_call_median"],
                    "peer_us_best": prow["us_per_call_best"],
                    "ratio_median": None,
                    "ratio_best": None,
                    "refused": None,
                    "conduit_work": crow.get("work"),
                    "peer_work": prow.get("work"),
                }
                if refused:
                    entry["refused"] = f"unequal work ({csys} vs {peer}): {refused}"
                else:
                    entry["ratio_median"] = prow["us_per_call_median"] / crow["us_per_call_median"]
                    entry["ratio_best"] = prow["us_per_call_best"] / crow["us_per_call_best"]
                out.append(entry)
    return out


def _fit_intercept(points: list[tuple[int, float]]) -> float | None:
    """Least-squares intercept (µs) of call time vs batch size; None with fewer than 2 batches."""
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx
    return my - slope * mx


def compute_overhead(
    rows: Iterable[Mapping[str, Any]], gather_rows: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Conduit's per-call sample overhead, per sampler and dim.

    ``minus_gather_us``: Conduit's sample call at batch 256 minus a bare ``index_select`` of 256 random
    rows of a store of the same shape, timed interleaved with it. ``intercept_us``: intercept of
    Conduit's call time vs batch size.
    """
    conduit = index_rows(rows).get("conduit", {})
    gather = index_rows(gather_rows).get("gather", {})
    per: list[dict[str, Any]] = []
    for sampler in ("uniform", "prioritized"):
        dims = sorted({k[3] for k in conduit if k[0] == "sample" and k[1] == sampler})
        for dim in dims:
            key = ("sample", sampler, OVERHEAD_BATCH, dim)
            row, g = conduit.get(key), gather.get(key)
            pts = [
                (k[2], r["us_per_call_median"])
                for k, r in conduit.items()
                if k[:2] == ("sample", sampler) and k[3] == dim
            ]
            per.append(
                {
                    "sampler": sampler,
                    "dim": dim,
                    "batch": OVERHEAD_BATCH,
                    "call_us": row["us_per_call_median"] if row else None,
                    "gather_us": g["us_per_call_median"] if g else None,
                    "minus_gather_us": (row["us_per_call_median"] - g["us_per_call_median"])
                    if (row and g)
                    else None,
                    "intercept_us": _fit_intercept(pts),
                }
            )
    return {
        "method": "conduit sample call at batch 256 minus a bare torch.index_select of 256 random rows "
        "(preallocated output) from a store of the same shape, timed interleaved with it (median rounds); "
        "intercept_us = intercept of conduit's median call time vs batch size (least squares over the "
        "measured batches)",
        "per_cell": per,
    }


def _not_evaluated(name: str, reason: str) -> dict[str, Any]:
    return {"target": name, "passed": None, "status": "not evaluated", "reason": reason}


def _speedup_target(
    rows: Iterable[Mapping[str, Any]],
    peer: str,
    minimum: float,
    errors: Mapping[str, str],
    dims: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Peer ÷ Conduit by median round for prioritized sample+update at every target batch (and dim),
    on equal work only: a cell where no Conduit system did the peer's work is refused, not passed."""
    batches = " and ".join(str(b) for b in TARGET_BATCHES)
    scope = f", dims {', '.join(str(d) for d in dims)}" if dims else ""
    name = f"prioritized sample+update at batch {batches}{scope}: conduit >= {minimum:g}x {peer} (median round, equal work)"
    for system in ("conduit", peer):
        if system in errors:
            return _not_evaluated(name, f"{system} unavailable: {errors[system]}")
    per_cell: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in compute_ratios(rows):
        wanted = (r["op"], r["sampler"]) == ("sample", "prioritized") and r["batch"] in TARGET_BATCHES
        if r["peer"] == peer and wanted and (dims is None or r["dim"] in dims):
            per_cell.setdefault((r["batch"], r["dim"]), []).append(r)
    cells = []
    for (batch, dim), entries in sorted(per_cell.items()):
        equal = [e for e in entries if e["refused"] is None]
        if equal:
            e = equal[0]
            cells.append(
                {
                    "batch": batch,
                    "dim": dim,
                    "conduit_system": e["conduit_system"],
                    "conduit_us_median": e["conduit_us_median"],
                    f"{peer}_us_median": e["peer_us_median"],
                    "conduit_us_best": e["conduit_us_best"],
                    f"{peer}_us_best": e["peer_us_best"],
                    "ratio": e["ratio_median"],
                    "ratio_best_round": e["ratio_best"],
                    "work": e["peer_work"],
                    "passed": e["ratio_median"] >= minimum,
                }
            )
        else:
            refusals = "; ".join(e["refused"] for e in entries)
            cells.append({"batch": batch, "dim": dim, "ratio": None, "refused": refusals, "passed": None})
    if not cells:
        have = {r["system"] for r in idle_rows(rows)}
        missing = [s for s in (peer,) if s not in have] + ([] if have & set(CONDUIT_SYSTEMS) else ["conduit"])
        why = f"{' and '.join(missing)} not run" if missing else "no cell measured by both systems"
        return _not_evaluated(name, why)
    verdicts = [c["passed"] for c in cells]
    passed = False if False in verdicts else (None if None in verdicts else True)
    out: dict[str, Any] = {"target": name, "passed": passed, "cells": cells}
    if None in verdicts:
        out["reason"] = "ratio refused in some cells (unequal work): no claim there"
    return out


def compute_load_ratios(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per system and cell: median seconds per call with the other cores busy ÷ idle."""
    idle: dict[tuple[str, Key], Mapping[str, Any]] = {}
    busy: dict[tuple[str, Key], Mapping[str, Any]] = {}
    for r in rows:
        key = (r["system"], (r["op"], r["sampler"], r["batch"], r["dim"]))
        (busy if r.get("load") else idle)[key] = r
    out = []
    for (system, (op, sampler, batch, dim)), b in sorted(busy.items()):
        i = idle.get((system, (op, sampler, batch, dim)))
        if i is not None:
            out.append(
                {
                    "system": system,
                    "op": op,
                    "sampler": sampler,
                    "batch": batch,
                    "dim": dim,
                    "idle_us_median": i["us_per_call_median"],
                    "loaded_us_median": b["us_per_call_median"],
                    "loaded_over_idle": b["us_per_call_median"] / i["us_per_call_median"],
                }
            )
    return out


def _load_target(load_ratios: list[dict[str, Any]], errors: Mapping[str, str]) -> dict[str, Any]:
    name = (
        f"conduit sample latency with the other cores busy <= {MAX_LOADED_OVER_IDLE:g}x idle (median round)"
    )
    if "conduit" in errors:
        return _not_evaluated(name, f"conduit unavailable: {errors['conduit']}")
    cells = [
        {**c, "passed": c["loaded_over_idle"] <= MAX_LOADED_OVER_IDLE}
        for c in load_ratios
        if c["system"] == "conduit" and c["op"] == "sample"
    ]
    if not cells:
        return _not_evaluated(name, "run with --load to measure it")
    return {"target": name, "passed": all(c["passed"] for c in cells), "cells": cells}


def _gather_target(rows: Iterable[Mapping[str, Any]], errors: Mapping[str, str]) -> dict[str, Any]:
    name = f"uniform sample (gather) at dim {GATHER_DIM}: conduit GB/s >= {MIN_MEMCPY_FRACTION:.0%} of memcpy GB/s"
    for system in ("conduit", "memcpy"):
        if system in errors:
            return _not_evaluated(name, f"{system} unavailable: {errors[system]}")
    by = index_rows(rows)
    cells = []
    for sampler in ("uniform", "prioritized"):
        for key, mrow in sorted(by.get("memcpy", {}).items()):
            crow = by.get("conduit", {}).get(key)
            if key[0] == "sample" and key[1] == sampler and key[3] == GATHER_DIM and crow:
                frac = crow["gb_per_s_median"] / mrow["gb_per_s_median"]
                cells.append(
                    {
                        "sampler": sampler,
                        "batch": key[2],
                        "conduit_gb_per_s": crow["gb_per_s_median"],
                        "memcpy_gb_per_s": mrow["gb_per_s_median"],
                        "fraction": frac,
                        "passed": frac >= MIN_MEMCPY_FRACTION,
                        "counts_for_target": sampler == "uniform",
                    }
                )
    judged = [c for c in cells if c["counts_for_target"]]
    if not judged:
        return _not_evaluated(name, f"dim {GATHER_DIM} not measured")
    return {"target": name, "passed": all(c["passed"] for c in judged), "cells": cells}


def _overhead_target(overhead: Mapping[str, Any], errors: Mapping[str, str]) -> dict[str, Any]:
    name = f"per-call sample overhead at batch {OVERHEAD_BATCH} <= {OVERHEAD_LIMIT_US:g} us (uniform, smallest dim)"
    for system in ("conduit", "memcpy"):
        if system in errors:
            return _not_evaluated(name, f"{system} unavailable: {errors[system]}")
    cands = [
        c for c in overhead["per_cell"] if c["sampler"] == "uniform" and c["minus_gather_us"] is not None
    ]
    if not cands:
        return _not_evaluated(name, f"no uniform sample cell at batch {OVERHEAD_BATCH}")
    c = min(cands, key=lambda c: c["dim"])
    return {
        "target": name,
        "passed": c["minus_gather_us"] <= OVERHEAD_LIMIT_US,
        "dim": c["dim"],
        "overhead_us": c["minus_gather_us"],
        "call_us": c["call_us"],
        "gather_us": c["gather_us"],
        "intercept_us": c["intercept_us"],
    }


def evaluate_targets(
    rows: list[Mapping[str, Any]], overhead: Mapping[str, Any], errors: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The five project targets, each with pass/fail (None when it could not be evaluated) and numbers."""
    return [
        _speedup_target(rows, "torchrl", MIN_X_TORCHRL, errors, TORCHRL_TARGET_DIMS),
        _speedup_target(rows, "rllib", MIN_X_RLLIB, errors),
        _gather_target(rows, errors),
        _overhead_target(overhead, errors),
        _load_target(compute_load_ratios(rows), errors),
    ]
