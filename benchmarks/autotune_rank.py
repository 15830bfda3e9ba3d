"""Rank agreement for the tuner benchmarks: Kendall's tau, between rounds, and half against half."""

from __future__ import annotations

import statistics


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
