"""The vLLM rollout's figures for ``verl_iteration.py --rollout vllm``: response equivalence between two
trainer modes, what generation costs, the ratio R of generation to ingestion, the core split.

Equivalence: vLLM batches the requests that are in flight together, so a request's logits can depend on
its neighbours and equal losses are not promised. What is measured instead: per iteration, the multiset of
(prompt, response) token lists each run trained on (``samples.jsonl``, ``--dump-samples``), and the share
of one run's responses that the other run also produced (multiset intersection / responses).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from verl_analysis import gen_events, jsonl

#: The share of identical responses the issue asks for between ``sync`` and ``conduit``.
IDENTICAL_TARGET = 0.95


def _samples(work: Path) -> dict[int, Counter[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """Iteration -> the multiset of (prompt, response) a run trained on (empty without a dump)."""
    return {
        int(rec["step"]): Counter((tuple(s["prompt"]), tuple(s["response"])) for s in rec["samples"])
        for rec in jsonl(work / "samples.jsonl")
    }


def response_identity(a: Path, b: Path) -> dict[str, Any]:
    """The share of run ``a``'s responses that run ``b`` also produced, per common iteration and over
    all of them; ``None`` figures when the runs have no dumped iteration in common."""
    sa, sb = _samples(a), _samples(b)
    common = sorted(set(sa) & set(sb))
    per: dict[str, dict[str, int]] = {}
    same = total = 0
    for it in common:
        n_same = sum((sa[it] & sb[it]).values())
        n = max(sum(sa[it].values()), sum(sb[it].values()))
        per[str(it)] = {"identical": n_same, "responses": n}
        same, total = same + n_same, total + n
    share = same / total if total else None
    return {
        "iterations": per,
        "identical": same,
        "responses": total,
        "share_identical": None if share is None else round(share, 4),
        "target>=0.95": share is not None and share >= IDENTICAL_TARGET,
    }


def generation_cost(rows: list[dict[str, Any]], system: str) -> dict[str, float | None]:
    """Medians over ``system``'s measured rows: generation busy time (first request start -> last
    request end, from vLLM's server), response tokens per second of it, the ingestion stages, and R =
    generation / ingestion (the ratio the paced rollout sets by hand)."""
    mine = [r for r in rows if r["system"] == system]
    if not mine:
        return {"gen_busy_s": None, "response_tokens_per_s": None, "ingest_s": None, "R": None}
    busy = statistics.median(r["stages"]["gen_busy"] for r in mine)
    tokens = statistics.median(r["work"]["response_tokens"] for r in mine)
    ingest = statistics.median(r["ingest_s"] for r in mine)
    return {
        "gen_busy_s": round(busy, 4),
        "response_tokens": tokens,
        "response_tokens_per_s": round(tokens / busy, 1) if busy else None,
        "ingest_s": round(ingest, 4),
        "R": round(busy / ingest, 3) if ingest else None,
    }


def _finishes(work: Path) -> dict[int, list[tuple[float, int]]]:
    """Weight version -> its responses' (end time, response tokens), from the server's request log."""
    out: dict[int, list[tuple[float, int]]] = {}
    for e in gen_events(work / "gen_events.jsonl"):
        out.setdefault(int(e["version"]), []).append((float(e["t1"]), int(e.get("length", 0))))
    return out


def ingestion_floor(
    rows: list[dict[str, Any]], work: Path, system: str, baseline: str = "verl_sync_tuned"
) -> dict[str, Any]:
    """The exposed time no on-policy schedule avoids on this workload and machine, per measured
    iteration of ``system``: every response ingested the moment it finishes, one after another on
    the one ingestion core, at the ``baseline``'s whole-batch rate (its ingestion seconds per response
    token in the same iteration, which generated the same responses; its median where that iteration
    is missing: one call per stage, no per-call cost); the floor is how long after the last
    response that ends. Beside it the baseline's own wait for generation's outputs
    (``gen_wait_exposed``), which every schedule has too. ``exposed_ratio_floor``: the least
    exposed ratio ``system`` / ``baseline`` any on-policy schedule could reach here; ``wall_ratio_floor``
    the least wall ratio: the baseline's median wall with its exposed time cut to that floor. It is
    called a floor only where ``system``'s own iterations respect it (:func:`floor_holds`:
    ``is_bound``, ``undercut_by``); otherwise it is an estimate."""
    base = [r for r in rows if r["system"] == baseline]
    mine = [r for r in rows if r["system"] == system]
    if not base or not mine:
        return {"missing": True}
    rates = {int(r["iteration"]): r["ingest_s"] / r["work"]["response_tokens"] for r in base}
    median_rate = statistics.median(rates.values())
    finishes = _finishes(work)
    per_iteration = {}
    for r in mine:
        done = sorted(finishes.get(int(r["iteration"]), []))
        if not done:
            continue
        t, rate = done[0][0], rates.get(int(r["iteration"]), median_rate)
        for end, tokens in done:
            t = max(t, end) + rate * tokens
        per_iteration[int(r["iteration"])] = round(t - done[-1][0], 4)
    if not per_iteration:
        return {"missing": True}
    floor = statistics.median(per_iteration.values())
    wait = statistics.median(r["stages"]["gen_wait_exposed"] for r in base)
    base_exposed = statistics.median(r["exposed_s"] for r in base)
    base_wall = statistics.median(r["wall_s"] for r in base)
    out = {
        "per_token_s": round(median_rate, 7),
        "floor_s": round(floor, 4),
        "per_iteration": per_iteration,
        "baseline_gen_wait_s": round(wait, 4),
        "exposed_floor_s": round(floor + wait, 4),
        "exposed_ratio_floor": round((floor + wait) / base_exposed, 3) if base_exposed else None,
        "wall_ratio_floor": round((base_wall - base_exposed + floor + wait) / base_wall, 3),
    }
    return out | floor_holds(rows, out, system)


def floor_holds(rows: list[dict[str, Any]], floor: dict[str, Any], system: str) -> dict[str, Any]:
    """Whether ``floor`` (an :func:`ingestion_floor` record) is a bound on ``system``'s measured rows:
    ``undercut_by`` lists each iteration whose exposed time fell below that iteration's floor
    (``per_iteration`` + ``baseline_gen_wait_s``) with both figures; ``is_bound`` is True only when
    the list is empty and some iteration was compared (an estimate the system undercut is no floor)."""
    wait = floor.get("baseline_gen_wait_s")
    per = {int(k): v for k, v in (floor.get("per_iteration") or {}).items()}
    if wait is None or not per:
        return {"is_bound": False, "undercut_by": []}
    under: list[dict[str, Any]] = []
    compared = 0
    for r in sorted((r for r in rows if r.get("system") == system), key=lambda r: int(r["iteration"])):
        it = int(r["iteration"])
        if it not in per or r.get("exposed_s") is None:
            continue
        compared += 1
        bound = round(per[it] + wait, 4)
        if r["exposed_s"] < bound:
            under.append({"iteration": it, "exposed_s": r["exposed_s"], "exposed_floor_s": bound})
    return {"is_bound": compared > 0 and not under, "undercut_by": under}


def run_info(work: Path) -> dict[str, Any]:
    """From the run's ``summary.json``: how the cores were split (``cores``; None when not split) and
    whether every response ran to the length cap (``fixed_length``, the harness's ``--fixed-length``;
    None for a run from before the flag)."""
    path = work / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    return {"cores": summary.get("cores"), "fixed_length": summary.get("fixed_length")}


def engine_steps(work: Path) -> dict[int, dict[str, float]]:
    """Iteration -> vLLM's own counters for that iteration's generation (``vllm_stats.jsonl``: the
    server's ``/metrics`` read when each weight version starts generating; iteration ``s`` is the
    difference between the reads at versions ``s + 1`` and ``s``, so the last iteration has none):
    engine steps, prompt and generated tokens, preemptions, mean time to first token, inter-token
    latency and request latency (s)."""
    snaps = {int(rec["version"]): rec["stats"] for rec in jsonl(work / "vllm_stats.jsonl") if "stats" in rec}
    out: dict[int, dict[str, float]] = {}
    for v in sorted(snaps):
        if v + 1 not in snaps:
            continue
        d = {k: snaps[v + 1].get(k, 0.0) - snaps[v].get(k, 0.0) for k in snaps[v + 1]}

        def mean(name: str, d: dict[str, float] = d) -> float | None:
            n = d.get(f"vllm:{name}_count", 0.0)
            return round(d.get(f"vllm:{name}_sum", 0.0) / n, 5) if n else None

        out[v] = {
            "engine_steps": d.get("vllm:iteration_tokens_total_count", 0.0),
            "prompt_tokens": d.get("vllm:prompt_tokens_total", 0.0),
            "generation_tokens": d.get("vllm:generation_tokens_total", 0.0),
            "preemptions": d.get("vllm:num_preemptions_total", 0.0),
            "ttft_s": mean("time_to_first_token_seconds"),
            "inter_token_s": mean("inter_token_latency_seconds"),
            "request_latency_s": mean("e2e_request_latency_seconds"),
        }
    return out
