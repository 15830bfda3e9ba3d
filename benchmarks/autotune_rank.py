"""Rank agreement for the tuner benchmarks: Kendall's tau, between rounds, and half against half."""

from __future__ import annotations

import statistics
from typing import Any


def kendall(xs: list[float], ys: list[float]) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(xs, ys).statistic)


def repeatability(rounds: list[list[float]]) -> float | None:
    """Median Kendall tau between two rounds of the same grid: the best tau any model can reach when
    ranked against one round (``None`` with one round)."""
    taus = [kendall(a, b) for n, a in enumerate(rounds) for b in rounds[n + 1 :]]
    return statistics.median(taus) if taus else None


def split_halves(rounds: list[list[float]]) -> float | None:
    """Kendall tau between the medians of the even and of the odd rounds: how far two measurements of
    the grid, each of half the rounds, agree (``None`` with fewer than two rounds)."""
    if len(rounds) < 2:
        return None
    halves = [[statistics.median(r[i] for r in rounds[h::2]) for i in range(len(rounds[0]))] for h in (0, 1)]
    return kendall(*halves)


def ranking(
    names: list[str],
    measured: list[float],
    predicted: list[float],
    per_round: list[list[float]],
    top: int = 8,
) -> dict[str, Any]:
    """How the model's order of the configurations (``predicted``) agrees with the measured one: the best
    measured and the model's best, the top-``top`` sets and orders, Kendall's tau, and what noise allows
    (tau between rounds, half against half)."""
    best = min(range(len(names)), key=measured.__getitem__)
    order_m = sorted(range(len(names)), key=measured.__getitem__)[:top]
    order_p = sorted(range(len(names)), key=predicted.__getitem__)[:top]
    return {
        "best_measured": {"config": names[best], "seconds": measured[best]},
        "predicted_best": {"config": names[order_p[0]], "measured_seconds": measured[order_p[0]]},
        f"top{top}_same_set": set(order_m) == set(order_p),
        f"top{top}_same_order": order_m == order_p,
        f"top{top}_overlap": len(set(order_m) & set(order_p)),
        "kendall_tau": kendall(predicted, measured),
        "kendall_tau_between_rounds": repeatability(per_round),
        "kendall_tau_split_halves": split_halves(per_round),
    }


def prediction_panel(ax: Any, row: dict[str, Any], pick: int, manual: str, title: str, unit: str) -> None:
    """One panel of a tuner plot: measured against predicted ms per ``unit`` for every configuration of
    ``row`` (grey, labelled ``manual``), the tuner's ``pick`` starred, the diagonal dotted."""
    pred = [p * 1e3 for p in row["predicted_s"]]
    meas = [m * 1e3 for m in row["measured_s"]]
    ax.scatter(pred, meas, c="0.6", s=18, label=manual)
    ax.scatter([pred[pick]], [meas[pick]], c="tab:red", marker="*", s=160, label="auto")
    lo, hi = min(pred + meas), max(pred + meas)
    ax.plot([lo, hi], [lo, hi], "k:", lw=0.8)
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(f"predicted ms/{unit}")
    ax.set_ylabel(f"measured ms/{unit}")
    ax.legend(fontsize=7)
