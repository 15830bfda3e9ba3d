"""The placement planner's solvers: the exact MILP (SciPy's HiGHS) and the heuristic (regret greedy, then
re-packing of tier pairs and triples with small exact MILPs); see :mod:`conduit.placement_model` for the model.
They work on the planner's validated arrays (``PlacementModel``: cost, nbytes, budget, allowed)."""

from __future__ import annotations

import time
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np

from conduit.errors import PlacementCapacityError

if TYPE_CHECKING:
    from conduit.placement_model import PlacementModel, Plan

MILP_TIME_LIMIT_S = 20.0
HEURISTIC_TIME_S = 1.0  # the heuristic stops improving after this (its feasible plan is kept)


def _milp(
    model: PlacementModel,
    key: np.ndarray,
    fields: np.ndarray,
    tiers: np.ndarray,
    capped: np.ndarray,
    rhs: np.ndarray,
    limit_s: float,
) -> tuple[np.ndarray | None, str]:
    """HiGHS over variables (row ``key``: one per field, exactly one chosen; ``fields``, ``tiers``):
    capacity ``sum bytes <= rhs[tier]`` over the ``capped`` variables. The chosen mask, or None."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n = len(key)
    one = coo_matrix((np.ones(n), (key, np.arange(n))), shape=(int(key.max()) + 1, n)).tocsr()
    rows = np.unique(tiers[capped])
    scale = np.maximum(model.budget[rows], 1).astype(float)  # rows scaled to O(1) for the solver
    row = np.searchsorted(rows, tiers[capped])
    nbytes = model.nbytes[fields[capped]]
    cap = coo_matrix((nbytes / scale[row], (row, np.flatnonzero(capped))), shape=(len(rows), n)).tocsr()
    cost = model.cost[fields, tiers]
    cost = cost / max(float(cost.max(initial=0.0)), 1e-300)  # O(1): HiGHS's absolute gap is ~1e-6
    for margin in (0.0, 1e-6):  # HiGHS's tolerance may overfill by a few bytes: retry a hair tighter
        res = milp(
            cost,
            integrality=np.ones(n),
            bounds=Bounds(0, 1),
            constraints=[
                LinearConstraint(one, 1, 1),
                LinearConstraint(cap, -np.inf, rhs[rows] / scale - margin),
            ],
            options={"time_limit": limit_s, "mip_rel_gap": 1e-9, "disp": False},
        )
        if res.x is None:
            return None, ""
        pick = res.x > 0.5
        if (np.bincount(row, weights=nbytes * pick[capped], minlength=len(rows)) <= rhs[rows]).all():
            stopped = f"HiGHS MILP at its time limit (gap {res.mip_gap:.2g})"
            return pick, "exact (HiGHS MILP)" if res.status == 0 else stopped
    return None, ""


def _exact(model: PlacementModel) -> Plan | None:
    fi, tj = np.nonzero(model.allowed)
    pick, method = _milp(model, fi, fi, tj, np.ones(len(fi), bool), model.budget, MILP_TIME_LIMIT_S)
    if pick is None:
        return None
    assign = np.empty(model.n_fields, dtype=np.int64)
    assign[fi[pick]] = tj[pick]
    return model.to_plan(assign, method)


def _heuristic(model: PlacementModel) -> np.ndarray | None:
    deadline = time.perf_counter() + HEURISTIC_TIME_S
    assign, unplaced = _regret_greedy(model)
    if unplaced:
        assign, _, unplaced = _pack(model)
    if unplaced:
        return None  # no packing found: plan() asks the MILP
    return _repack(model, assign, deadline)


def _regret_greedy(model: PlacementModel) -> tuple[np.ndarray, list[int]]:
    free = model.budget.copy()
    assign = np.full(model.n_fields, -1, dtype=np.int64)
    cost = np.where(model.allowed, model.cost, np.inf)
    todo = np.ones(model.n_fields, dtype=bool)
    unplaced: list[int] = []
    while todo.any():
        idx = np.flatnonzero(todo)
        c = np.where(free[None, :] >= model.nbytes[idx, None], cost[idx], np.inf)
        part = np.partition(c, 1, axis=1) if model.n_tiers > 1 else np.hstack([c, np.full_like(c, np.inf)])
        stuck = ~np.isfinite(part[:, 0])
        if stuck.any():  # fits nowhere any more
            unplaced += idx[stuck].tolist()
            todo[idx[stuck]] = False
            continue
        regret = np.where(
            np.isfinite(part[:, 1]), (part[:, 1] - part[:, 0]) / np.maximum(model.nbytes[idx], 1), np.inf
        )
        k = int(np.argmax(regret))
        i, j = int(idx[k]), int(np.argmin(c[k]))
        assign[i], todo[i] = j, False
        free[j] -= model.nbytes[i]
    return assign, unplaced


def _pack(model: PlacementModel, worst_fit: bool = False) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Packing first, cost ignored: the most constrained and largest fields first, each on the allowed
    tier it fills most tightly (``worst_fit``: with the most room). Returns assignment, free, left over."""
    free = model.budget.copy()
    assign = np.full(model.n_fields, -1, dtype=np.int64)
    unplaced = []
    for i in np.lexsort((-model.nbytes, model.allowed.sum(axis=1))):
        ok = model.allowed[i] & (free >= model.nbytes[i])
        if not ok.any():
            unplaced.append(int(i))
            continue
        j = int(np.argmax(np.where(ok, free, -1)) if worst_fit else np.argmin(np.where(ok, free, np.inf)))
        assign[i] = j
        free[j] -= model.nbytes[i]
    return assign, free, unplaced


def _repack(model: PlacementModel, assign: np.ndarray, deadline: float, outsiders: int = 48) -> np.ndarray:
    """For each pair, then each triple, of tiers G: re-solve exactly the fields on G plus the
    ``outsiders`` fields elsewhere that would gain most there; every field may also stay (outsiders)
    or leave for its cheapest tier outside G with room (fields on G). Keep improvements; sweep while
    any, until the deadline."""
    rows = np.arange(model.n_fields)
    groups = [*combinations(range(model.n_tiers), 2), *combinations(range(model.n_tiers), 3)]
    for _ in range(20):
        improved = False
        for g in map(list, groups):
            if time.perf_counter() > deadline:
                return assign
            here = model.cost[rows, assign]
            on_g = np.isin(assign, g)
            inside = np.flatnonzero(on_g)
            there = np.where(model.allowed[:, g], model.cost[:, g], np.inf).min(axis=1)
            gain = np.where(on_g, -np.inf, here - there)
            out = np.argsort(-gain)[:outsiders]
            subset = np.concatenate([inside, out[gain[out] > 0]])
            if len(subset) < 2:
                continue
            free = model.budget - model.used(assign)
            key, tiers, capped = [], [], []
            for k, f in enumerate(subset):
                options = [(t, True) for t in g if model.allowed[f, t]]
                if k >= len(inside):
                    options.append((int(assign[f]), False))  # stay: its tier's bytes do not grow
                else:
                    away = model.allowed[f] & (free >= model.nbytes[f])
                    away[g] = False
                    if away.any():
                        options.append((int(np.argmin(np.where(away, model.cost[f], np.inf))), True))
                key += [k] * len(options)
                tiers += [t for t, _ in options]
                capped += [c for _, c in options]
            rhs = free.copy()
            rhs[g] = model.budget[g]
            kk, tt = np.array(key), np.array(tiers)
            limit = max(0.01, min(0.25, deadline - time.perf_counter()))
            pick, _ = _milp(model, kk, subset[kk], tt, np.array(capped), rhs, limit)
            if pick is None:
                continue
            trial = assign.copy()
            trial[subset[kk[pick]]] = tt[pick]
            if model.total(trial) < model.total(assign) * (1 - 1e-9):
                assign, improved = trial, True
        if not improved:
            break
    return assign


def packing_error(model: PlacementModel) -> PlacementCapacityError:
    """Demand fits in total but no packing exists: the smallest field left over by a packing that
    puts the most constrained fields first, each where most room is left, and its gap."""
    _, free, unplaced = _pack(model, worst_fit=True)
    i = min(unplaced, key=lambda k: int(model.nbytes[k])) if unplaced else 0
    cand = np.flatnonzero(model.allowed[i])
    j = int(cand[np.argmax(free[cand])])
    missing = int(model.nbytes[i] - free[j])
    return PlacementCapacityError(
        f"demand {int(model.nbytes.sum())} bytes is within the total budget {int(model.budget.sum())} bytes"
        f" but no packing fits: field {model.fields[i].name!r} ({model.nbytes[i]} bytes) misses {missing}"
        f" bytes on {model.tier_names[j]}, the largest gap left on a tier it can use",
        missing,
        [model.tier_names[j]],
    )
