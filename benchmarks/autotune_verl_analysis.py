"""``autotune_verl.py``'s analysis: the grid run's per-step trace, its replay at every fixed ``g``
(the same steps for every point), the ranking's repeatability, ``auto``'s gaps to the best fixed
``g`` and the targets."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autotune_rank import kendall  # noqa: E402
from verl_analysis import jsonl  # noqa: E402

#: the ranking's top-k overlap
TOP = 3
#: targets: tau >= 0.8; auto within 10% of the best fixed g on the tuned part (``rest``), within 5%
#: of it as a share of the iteration
TAU_TARGET, GAP_TUNED_TARGET, GAP_ITERATION_TARGET = 0.8, 0.10, 0.05


def read_trace(work: Path) -> dict[int, dict[str, Any]]:
    """The piece policy's per-step trace (``pieces.jsonl``), by step."""
    return {int(r["step"]): r for r in jsonl(work / "pieces.jsonl")}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def recorded(trace: dict[int, dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Each step's predicted tails as the run's own policy made them (``predicted_tail``)."""
    return {s: t["predicted_tail"] for s, t in trace.items() if t.get("predicted_tail")}


def replay(trace: dict[int, dict[str, Any]], groups: int, unit: int = 1) -> dict[int, dict[str, float]]:
    """Each step's predicted tails by *this checkout's* policy code, fed the run's pieces step by step:
    before each step, the fit of the earlier steps' pieces only (as in the run), replayed on that
    step's finish times. Judges a changed model on recorded steps; the tails it is compared with were
    measured under the run's schedule, which no model changes."""
    from conduit_verl_cpu.piece_trace import predicted_tails

    from conduit.piece_policy import PiecePolicy

    policy = PiecePolicy("auto", groups, unit)
    out: dict[int, dict[str, float]] = {}
    for step in sorted(trace):
        t = trace[step]
        policy.begin_step(100.0 * step)
        if len(policy.pieces) and len(t["finish"]) == groups:
            cost, k = policy.fitted()
            tails = predicted_tails(policy, t["finish"], t["work"], (cost.a, cost.b, cost.per_byte, k))
            out[step] = {str(g): v for g, v in tails.items()}
        for piece in t["pieces"]:
            if piece.get("rows"):  # an early-rows call (traces from before them have none)
                policy.record_rows(piece["seconds"], piece["tokens"])
                continue
            policy.record_piece(
                piece["groups"], piece["seconds"], piece["overlapped"], piece["work"], piece.get("tokens")
            )
        policy.record_step(t["finish"], t["ended"])
    return out


def rest_s(row: dict[str, Any], scale: float) -> float:
    """The iteration less its modelled generation (``model_gen_s`` x the run's time scale) and its
    updates: the part a piece size can change (waits, lateness, exposed ingestion). Steps draw
    different responses, so generation and updates differ by seconds between steps; comparing whole
    iterations of different steps would rank the data, not ``g``."""
    stages = row.get("stages") or {}
    updates = float(stages.get("update_actor", 0.0)) + float(stages.get("update_critic", 0.0))
    return row["wall_s"] - float(row.get("model_gen_s") or 0.0) * scale - updates


def grid_view(
    rows: list[dict[str, Any]],
    trace: dict[int, dict[str, Any]],
    grid: list[int],
    predictions: dict[int, dict[str, float]],
    scale: float,
) -> dict[str, Any]:
    """Per ``g`` of the grid: the steps it ran, their measured wall, iteration less generation
    (``rest``), exposed time and exposed tail, and the tail ``predictions`` gave for the ``g`` each
    step ran; medians (of all but the steps)."""
    keys = ("wall", "rest", "exposed", "tail", "pred")
    per: dict[int, dict[str, list[float]]] = {g: {k: [] for k in ("step", *keys)} for g in grid}
    errors: list[float] = []
    for row in rows:
        step = trace.get(int(row["iteration"]))
        if step is None or step.get("g") not in per or step.get("tail") is None:
            continue
        mine = per[step["g"]]
        mine["step"].append(int(row["iteration"]))
        mine["wall"].append(row["wall_s"])
        mine["rest"].append(rest_s(row, scale))
        mine["exposed"].append(row["exposed_s"])
        mine["tail"].append(step["tail"])
        pred = predictions.get(int(row["iteration"]), {}).get(str(step["g"]))
        if pred is not None:
            mine["pred"].append(pred)
            if step["tail"] > 0:
                errors.append(abs(pred - step["tail"]) / step["tail"])
    medians = {str(g): {k: _median(d[k]) for k in keys} for g, d in per.items()}
    walls = [w for d in per.values() for w in d["wall"]]
    return {
        "per_g": {str(g): d for g, d in per.items()},
        "medians": medians,
        "prediction_error": _median(errors),
        "median_wall_s": _median(walls),
    }


def _ranked(values: dict[str, float | None]) -> list[int]:
    """``g`` by value, then the larger ``g`` first (fewer pieces) on ties."""
    known = [(v, -int(g)) for g, v in values.items() if v is not None]
    return [-g for _, g in sorted(known)]


def repeatability(per_g: dict[str, dict[str, list[float]]], key: str) -> float | None:
    """τ between the first and second measured repetition of every ``g`` (None: under two each)."""
    pairs = [(v[key][0], v[key][1]) for v in per_g.values() if len(v[key]) >= 2]
    if len(pairs) < 3:
        return None
    return kendall([p[0] for p in pairs], [p[1] for p in pairs])


def evaluate(
    view: dict[str, Any],
    auto_rows: list[dict[str, Any]],
    auto_trace: dict[int, dict[str, Any]],
    scale: float,
) -> dict[str, Any]:
    """τ, top-3 agreement, the model's pick and ``auto``'s run against the best fixed ``g``. Gaps are
    in iteration less modelled generation (:func:`rest_s`), each as a share of the tuned part (the
    best ``rest``) and of the iteration (the grid's median iteration): :func:`gaps`."""
    med = view["medians"]
    measured = [g for g, m in med.items() if m["tail"] is not None and m["pred"] is not None]
    pred = [med[g]["pred"] for g in measured]
    tau_tail = kendall(pred, [med[g]["tail"] for g in measured]) if len(measured) >= 3 else None
    tau_rest = kendall(pred, [med[g]["rest"] for g in measured]) if len(measured) >= 3 else None
    by_rest = _ranked({g: m["rest"] for g, m in med.items()})
    by_pred = _ranked({g: m["pred"] for g, m in med.items()})
    best = by_rest[0] if by_rest else None
    best_rest = med[str(best)]["rest"] if best is not None else None
    pick = by_pred[0] if by_pred else None
    pick_gaps = gaps(med[str(pick)]["rest"] if pick is not None else None, best_rest, view["median_wall_s"])
    out: dict[str, Any] = {
        "tau_tail": tau_tail,
        "tau_rest": tau_rest,
        "repeat_tau_tail": repeatability(view["per_g"], "tail"),
        "repeat_tau_rest": repeatability(view["per_g"], "rest"),
        f"top{TOP}_predicted": by_pred[:TOP],
        f"top{TOP}_measured": by_rest[:TOP],
        f"top{TOP}_overlap": len(set(by_pred[:TOP]) & set(by_rest[:TOP])),
        "best_g": best,
        "best_rest_s": best_rest,
        "model_pick": pick,
        "model_pick_gap_tuned": pick_gaps["tuned"],
        "model_pick_gap_iteration": pick_gaps["iteration"],
        "prediction_error": view["prediction_error"],
    }
    out.update(auto_summary(auto_rows, auto_trace, scale, view))
    out["targets"] = targets(tau_tail, out["auto_gap_tuned"], out["auto_gap_iteration"])
    return out


def targets(tau_tail: float | None, gap_tuned: float | None, gap_iteration: float | None) -> dict[str, bool]:
    """τ on the tail; ``auto`` within 10 % of the best fixed ``g`` on the part it tunes, within 5 % of
    it as a share of the iteration (end to end)."""
    return {
        "tau_tail>=0.8": tau_tail is not None and tau_tail >= TAU_TARGET,
        "auto_within_10%_of_tuned": gap_tuned is not None and gap_tuned <= GAP_TUNED_TARGET,
        "auto_within_5%_of_iteration": gap_iteration is not None and gap_iteration <= GAP_ITERATION_TARGET,
    }


def gaps(rest: float | None, best_rest: float | None, iteration: float | None) -> dict[str, float | None]:
    """``rest``'s distance to the best fixed ``g``'s, as a share of the tuned part (``tuned``: of the
    best ``rest``, the quantity a piece size changes) and of the iteration (``iteration``: of the
    grid's median iteration, what it means end to end)."""
    diff = None if rest is None or best_rest is None else rest - best_rest
    return {
        "tuned": diff / best_rest if diff is not None and best_rest > 0 else None,
        "iteration": diff / iteration if diff is not None and iteration else None,
    }


def same_steps(view: dict[str, Any], rests: dict[int, float]) -> dict[str, Any]:
    """``auto``'s ``rest`` (``rests``, by step) against every fixed ``g`` on the same steps: the steps
    both the grid and the ``auto`` run measured (a step's number draws its data, so whole runs of
    different steps would compare the data). Per ``g``, its median over its grid steps among them;
    ``auto``'s median over all of them; the best ``g`` and ``auto``'s rank among the fixed ``g``."""
    common = sorted({s for d in view["per_g"].values() for s in d["step"]} & set(rests))
    shared = set(common)
    fixed = {
        g: _median([r for s, r in zip(d["step"], d["rest"], strict=True) if s in shared])
        for g, d in view["per_g"].items()
    }
    ranked = _ranked(fixed)
    best = ranked[0] if ranked else None
    auto_rest = _median([rests[s] for s in common])
    better = [g for g in ranked if auto_rest is not None and fixed[str(g)] < auto_rest]
    out = gaps(auto_rest, fixed[str(best)] if best is not None else None, view["median_wall_s"])
    return {
        "auto_rest_s": auto_rest,
        "auto_gap_tuned": out["tuned"],
        "auto_gap_iteration": out["iteration"],
        # 1 + the fixed g whose median rest is lower than auto's, among the fixed g measured there
        "auto_rank": len(better) + 1 if auto_rest is not None else None,
        "auto_rank_among": len(ranked),
        "auto_best_g": best,
        "auto_best_rest_s": fixed[str(best)] if best is not None else None,
        "auto_steps_compared": common,
    }


def auto_summary(
    rows: list[dict[str, Any]],
    trace: dict[int, dict[str, Any]],
    scale: float,
    view: dict[str, Any],
) -> dict[str, Any]:
    """An ``auto`` run: its median ``rest`` and its gaps to the best fixed ``g`` on the same steps
    (:func:`same_steps`), its ``g`` per step, how many steps were whole-batch probes and what they
    cost (their time over the median streamed step, as a share of the run's time; all its steps)."""
    pairs = [(rest_s(r, scale), trace[int(r["iteration"])]) for r in rows if int(r["iteration"]) in trace]
    streamed = [w for w, s in pairs if s.get("arm") != "whole"]
    probes = [w for w, s in pairs if s.get("arm") == "whole"]
    excess = sum(max(0.0, w - statistics.median(streamed)) for w in probes) if streamed else 0.0
    walls = [r["wall_s"] for r in rows]
    return {
        **same_steps(view, {int(r["iteration"]): rest_s(r, scale) for r in rows}),
        "auto_g": [s["g"] for _, s in pairs],
        "auto_probes": len(probes),
        "auto_steps": len(rows),
        "auto_probe_share": excess / sum(walls) if walls else None,
    }
