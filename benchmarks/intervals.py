"""The rules a headline ratio stands on: ABBA rounds, a stored 90% bootstrap interval, a verdict.

* ``round_plan``: the pair a headline compares runs ``rounds`` (>= 3) rounds, the two adjacent in
  every round and their order reversed each round (A B, B A, A B, ...); every other system runs in
  the first round only.
* ``bootstrap_ratio``: the ratio of medians ``a`` / ``b`` and its percentile interval; each resample
  draws, round by round, ``a``'s and ``b``'s iterations of that round with replacement (pairing by
  round: only rounds where both ran count, each side keeps its own count per round), then takes the
  ratio of the pooled medians. Seeded, so a file's interval can be recomputed from its rows.
* ``verdict``: "met" only when the whole interval lies inside the target; "no difference resolved"
  when the interval holds 1.0; otherwise "missed".

Standard library only.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

#: the least rounds, and measured iterations per system, a headline ratio stands on
MIN_ROUNDS, MIN_ITERATIONS = 3, 8
LEVEL, RESAMPLES, SEED = 0.9, 2000, 0
MET, MISSED, UNRESOLVED = "met", "missed", "no difference resolved"


def round_plan(first_round: Sequence[str], pair: tuple[str, str], rounds: int) -> list[list[str]]:
    """The systems of each round. Round 0 runs ``first_round`` (every system, in the caller's order)
    with the pair moved together where the first of them stands; rounds 1.. run the pair alone, each
    in the reverse of the order the pair had in the round before."""
    a, b = pair
    if a not in first_round or b not in first_round:
        raise ValueError(f"headline pair {pair} must both be among the systems {list(first_round)}")
    if a == b:
        raise ValueError(f"headline pair compares a system with itself: {a}")
    lead = min(first_round.index(a), first_round.index(b))
    ran = _pair_in(list(first_round), pair)
    rest = [s for s in first_round if s not in pair]
    plan = [rest[:lead] + ran + rest[lead:]]
    for _ in range(1, rounds):
        ran = ran[::-1]
        plan.append(list(ran))
    return plan


def _pair_in(order: list[str], pair: tuple[str, str]) -> list[str]:
    """The two systems of ``pair`` in the order they ran in ``order``."""
    return sorted(pair, key=order.index)


def check_abba(plan: list[list[str]], pair: tuple[str, str]) -> str | None:
    """Why ``plan`` breaks the ABBA rule for ``pair`` (fewer than ``MIN_ROUNDS`` rounds with both, the
    two not adjacent, the order not reversed from one round to the next), or None."""
    both = [order for order in plan if pair[0] in order and pair[1] in order]
    if len(both) < MIN_ROUNDS:
        return f"{pair[0]} and {pair[1]} ran together in {len(both)} round(s), fewer than {MIN_ROUNDS}"
    previous: list[str] | None = None
    for k, order in enumerate(both):
        i, j = order.index(pair[0]), order.index(pair[1])
        if abs(i - j) != 1:
            return f"round {k}: {pair[0]} and {pair[1]} not adjacent ({order})"
        mine = _pair_in(order, pair)
        if previous is not None and mine == previous:
            return f"round {k}: {mine[0]} ran first again (the order must reverse each round)"
        previous = mine
    return None


def _by_round(rows: list[dict[str, Any]], system: str, key: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in rows:
        if r.get("system") == system and r.get(key) is not None:
            out.setdefault(int(r.get("round") or 0), []).append(float(r[key]))
    return out


def bootstrap_ratio(
    rows: list[dict[str, Any]],
    a: str,
    b: str,
    key: str,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
) -> dict[str, Any] | None:
    """``median(a) / median(b)`` of ``key`` over the rounds both ran, with its ``level`` bootstrap
    interval (module docstring), the rounds and iterations it rests on; None where no round holds
    both or ``b``'s median is 0."""
    ra, rb = _by_round(rows, a, key), _by_round(rows, b, key)
    rounds = sorted(set(ra) & set(rb))
    if not rounds:
        return None
    xa = [v for k in rounds for v in ra[k]]
    xb = [v for k in rounds for v in rb[k]]
    base = statistics.median(xb)
    if not base:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        sa = [v for k in rounds for v in rng.choices(ra[k], k=len(ra[k]))]
        sb = [v for k in rounds for v in rng.choices(rb[k], k=len(rb[k]))]
        mb = statistics.median(sb)
        if mb:
            stats.append(statistics.median(sa) / mb)
    stats.sort()
    tail = (1 - level) / 2
    lo = stats[int(tail * (len(stats) - 1))]
    hi = stats[int(round((1 - tail) * (len(stats) - 1)))]
    return {
        "ratio": round(statistics.median(xa) / base, 4),
        "lo": round(lo, 4),
        "hi": round(hi, 4),
        "level": level,
        "rounds": len(rounds),
        "iterations": {a: len(xa), b: len(xb)},
        "iterations_by_round": {a: [len(ra[k]) for k in rounds], b: [len(rb[k]) for k in rounds]},
        "resamples": resamples,
        "seed": seed,
        "method": "ratio of medians; iterations resampled within rounds, rounds paired (intervals.py)",
    }


def verdict(interval: dict[str, Any] | None, target: float, at_most: bool = True) -> str | None:
    """The verdict of a ratio against ``ratio <= target`` (``at_most``) or ``ratio >= target``: met
    when the whole interval is inside the target, "no difference resolved" when it holds 1.0, else
    missed; None without an interval."""
    if interval is None:
        return None
    lo, hi = float(interval["lo"]), float(interval["hi"])
    if (hi <= target) if at_most else (lo >= target):
        return MET
    if lo <= 1.0 <= hi:
        return UNRESOLVED
    return MISSED


def rule_breaks(interval: dict[str, Any] | None, pair: tuple[str, str]) -> str | None:
    """Why an interval cannot carry a headline: fewer than ``MIN_ROUNDS`` rounds or fewer than
    ``MIN_ITERATIONS`` measured iterations per system; None where it can."""
    if interval is None:
        return "no interval (no round holds both systems)"
    if interval["rounds"] < MIN_ROUNDS:
        return f"{interval['rounds']} round(s) of {pair[0]} and {pair[1]}, fewer than {MIN_ROUNDS}"
    short = [s for s, ns in interval["iterations_by_round"].items() if min(ns) < MIN_ITERATIONS]
    if short:
        return f"fewer than {MIN_ITERATIONS} measured iterations a round for {', '.join(short)}"
    return None


def headline(
    claim: str,
    rows: list[dict[str, Any]],
    pair: tuple[str, str],
    key: str,
    target: float,
    at_most: bool = True,
    refused: str | None = None,
) -> dict[str, Any]:
    """One headline claim of a results file: ``pair[0]`` ÷ ``pair[1]`` of ``key`` with its interval,
    its target and its verdict. ``refused`` (unequal work, staler data): no ratio, the reason kept.
    A ratio that breaks the rounds rule keeps its interval and reads "not a headline" with why."""
    out: dict[str, Any] = {"claim": claim, "pair": list(pair), "key": key, "target": target}
    out["target_reads"] = f"{'<=' if at_most else '>='} {target:g}"
    if refused:
        return {**out, "interval": None, "verdict": "refused", "why": refused}
    interval = bootstrap_ratio(rows, pair[0], pair[1], key)
    why = rule_breaks(interval, pair)
    out.update(interval=interval, verdict=verdict(interval, target, at_most) if why is None else None)
    if why is not None:
        out["verdict"], out["why"] = "not a headline", why
    return out
