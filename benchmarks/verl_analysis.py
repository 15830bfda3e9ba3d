"""Per-iteration rows of the verl CPU benchmark: wall, exposed experience-path time, stages.

Exposed time (DESIGN.md §4), same definition for every system, from verl's ``timing_s/*`` and the
CPU rollout server's generation log (``gen_events.jsonl``: wall-clock start/end of every request,
by weight version; step ``s`` generates with version ``s``):

* every system: ``max(0, gen - gen_busy)``: the part of verl's ``gen`` stage (step start → the
  trainer holds the last group) not spent generating (``gen_busy`` = first request start → last
  request end): rollout start-up, the replay buffer's poll, and in conduit mode ingestion of an
  earlier piece still running when the last group finished;
* plus, verl trainers: old_log_prob + ref + values + adv (whole batch, after sampling);
  conduit: Conduit ``Metrics`` exposed time (ingestion of the last piece and delivery; with PPO
  also the whole-batch whitening of the GAE advantages; ingestion of the earlier pieces overlaps
  generation and is not exposed).

PPO adds ``values`` (critic forward: an ingestion stage, per piece in conduit mode) and
``update_critic`` (whole batch, like ``update_actor`` not part of the exposed time, in every system).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

INGEST = ("old_log_prob", "ref", "values", "adv")
STAGES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")


def gen_windows(path: Path) -> dict[int, tuple[float, float]]:
    """Weight version → (first request start, last request end), wall clock."""
    out: dict[int, tuple[float, float]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        e = json.loads(line)
        v, t0, t1 = int(e["version"]), float(e["t0"]), float(e["t1"])
        a, b = out.get(v, (t0, t1))
        out[v] = (min(a, t0), max(b, t1))
    return out


def rows_for_run(
    work: Path, algo: str, system: str, skip: int, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per measured iteration (the first ``skip`` iterations are warm-up)."""
    windows = gen_windows(work / "gen_events.jsonl")
    rows = []
    for line in (work / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        step, m = int(rec["step"]), rec["data"]
        if step <= skip:
            continue
        t = {k.removeprefix("timing_s/"): float(v) for k, v in m.items() if k.startswith("timing_s/")}
        start, end = windows.get(step, (0.0, 0.0))
        gen_busy = end - start
        stages = {k: round(t.get(k, 0.0), 4) for k in STAGES}
        wait = max(0.0, t.get("gen", 0.0) - gen_busy)
        if system.startswith("conduit"):
            ingest = float(m.get("conduit/exposed_s", 0.0))
            stages["overlapped_ingest"] = round(sum(t.get(k, 0.0) for k in INGEST) - ingest, 4)
        else:
            ingest = sum(t.get(k, 0.0) for k in INGEST)
        stages.update(
            gen_busy=round(gen_busy, 4), gen_wait_exposed=round(wait, 4), ingest_exposed=round(ingest, 4)
        )
        rows.append(
            {
                "algo": algo,
                "system": system,
                "iteration": step,
                "wall_s": round(t.get("step", 0.0), 4),
                "exposed_s": round(wait + ingest, 4),
                "actor_loss": m.get("actor/pg_loss"),
                "g_ing": m.get("conduit/g_ing"),
                "score": m.get("critic/score/mean"),
                "stages": stages,
                **extra,
            }
        )
    return rows


def median(rows: list[dict[str, Any]], system: str, key: str, first: int = 0) -> float | None:
    vals = [float(r[key]) for r in rows if r["system"] == system and r["iteration"] >= first]
    return statistics.median(vals) if vals else None


def ratios(rows: list[dict[str, Any]], baselines: list[str], steady_from: int = 0) -> dict[str, Any]:
    """Each conduit system ÷ each baseline, medians, for wall and exposed time.

    ``steady_from``: also ``<key>/conduit_steady_over_<base>``, conduit's iterations from that one
    on (after ``g_ing=auto`` has measured its options).
    """
    out: dict[str, Any] = {}
    systems = sorted({r["system"] for r in rows})
    mine = [s for s in systems if s.startswith("conduit")]
    for base in baselines:
        for key in ("wall_s", "exposed_s"):
            b = median(rows, base, key)
            for system in mine:
                c = median(rows, system, key)
                if c is not None and b:
                    out[f"{key.removesuffix('_s')}/{system}_over_{base}"] = round(c / b, 3)
            c = median(rows, "conduit", key, steady_from) if steady_from else None
            if c is not None and b:
                out[f"{key.removesuffix('_s')}/conduit_steady_over_{base}"] = round(c / b, 3)
    for system in systems:
        out[f"median_wall_s/{system}"] = median(rows, system, "wall_s")
        out[f"median_exposed_s/{system}"] = median(rows, system, "exposed_s")
    return out
