"""``verl_staleness.py``'s analysis: the staleness each system really had (Conduit's group log, verl's
per-step metrics), per-system summaries, the ratios it allows (only where Conduit trained no staler
data) and issue 30's targets."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from intervals import headline  # noqa: E402
from verl_analysis import (  # noqa: E402
    bound_medians,
    jsonl,
    median,
    median_per_token,
    median_ratios,
    per_token,
    ratios,
    tokens_differ,
    two_resource_bound,
    work_differs,
)
from verl_runs import TQ_SUFFIX, split_system  # noqa: E402

#: verl's trainers that generate ahead with no bound of their own (off-policy)
VERL_ASYNC = ("verl_colocate_async", "verl_separate_async")
CONDUIT_K = re.compile(r"conduit_k(\d+)$")
#: verl's async trainer under verl's own bound of k versions (``max_off_policy_threshold`` = k + 1:
#: verl counts the versions a trajectory spans, so a group one version old spans 2; strategy ``drop``)
VERL_K = re.compile(r"(verl_colocate_async|verl_separate_async)_k(\d+)$")
HEADLINE = ("conduit_k1", "verl_colocate_async")
#: the equal-bound baseline of the headline: verl's colocate_async under its own bound of 1
EQUAL_BOUND = "verl_colocate_async_k1"
VERL_WORST = "training/off_policy/trajectory_staleness_worst"
VERL_EVICTED = "training/off_policy/evicted_samples"
#: issue 30's targets: conduit k=1 over verl_colocate_async, and the backend under verl's async trainers
TARGET_WALL, TARGET_EXPOSED, TARGET_BACKEND_SPEEDUP = 0.9, 0.5, 1.1
#: issue 48: with generation on hardware of its own (vLLM on its own core) the baseline a user runs is
#: verl's separate_async, under its own bound set equal to Conduit's
SEPARATE_HEADLINE = ("conduit_k1", "verl_separate_async_k1")
#: its wall target by the resource that bounds the baseline's step: 0.9x where the trainer's core does,
#: no slower (the interval's upper end <= 1.0) where generation does
TARGET_SEPARATE = {"trainer": 0.9, "generation": 1.0}


def headline_pair(rollout: str | None) -> tuple[str, str]:
    """The headline pair of a run on ``rollout``: separate_async's on vLLM (split cores), else
    colocate_async's (the paced rollout models separate hardware the way issue 30 compared it)."""
    return SEPARATE_HEADLINE if rollout == "vllm" else HEADLINE


def bound_held(rows: list[dict[str, Any]], system: str) -> str | None:
    """Which resource bounded most of ``system``'s measured steps ("trainer" on a tie; None: no row
    carries the bound)."""
    by = [r.get("bound_by") for r in rows if r["system"] == system and r.get("bound_by")]
    if not by:
        return None
    return "trainer" if by.count("trainer") >= by.count("generation") else "generation"


def bound(system: str) -> int | None:
    """The staleness bound a system runs under: k for ``conduit_k<k>``, 0 for verl's sync trainer,
    None for verl's async trainers (no bound: the harness switches verl's threshold off)."""
    plain, _ = split_system(system)
    if m := CONDUIT_K.match(plain):
        return int(m.group(1))
    if m := VERL_K.match(plain):
        return int(m.group(2))
    return 0 if plain.startswith("verl_sync") else None


def verl_async(system: str) -> bool:
    """One of verl's async trainers, bounded (``_k<k>``) or not."""
    plain, _ = split_system(system)
    return plain in VERL_ASYNC or VERL_K.match(plain) is not None


def group_lags(path: Path) -> dict[int, list[int]]:
    """Step -> the lag of each group it trained, from a ``group_log``. A reused work dir appends a
    second run's rows: only the rows after the log's last restart (a step lower than the one before)
    count."""
    rows = jsonl(path)
    start = 0
    for i in range(1, len(rows)):
        if int(rows[i]["step"]) < int(rows[i - 1]["step"]):
            start = i
    out: dict[int, list[int]] = {}
    for r in rows[start:]:
        out.setdefault(int(r["step"]), []).append(int(r["staleness"]))
    return out


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def step_staleness(work: Path, system: str, batch_size: int | None) -> dict[int, dict[str, Any]]:
    """Per step of one run: ``staleness_median`` / ``_max`` / ``_mean``, their ``staleness_source``,
    the lags (Conduit, group log), ``prompts_trained`` and ``stale_dropped`` (groups evicted as too
    old before they were trained: Conduit's ``conduit/stale_dropped``, verl's
    ``training/off_policy/evicted_samples``, which counts groups too)."""
    metrics = {int(r["step"]): r["data"] for r in jsonl(work / "metrics.jsonl")}
    conduit = split_system(system)[0].startswith("conduit")
    log = group_lags(work / "groups.jsonl") if conduit else {}
    out: dict[int, dict[str, Any]] = {}
    for step, m in sorted(metrics.items()):
        lags = log.get(step)
        groups = m.get("conduit/staleness/groups")
        if conduit and lags and (groups is None or int(groups) == len(lags)):
            med, top = float(statistics.median(lags)), float(max(lags))
            mean, source = statistics.fmean(lags), "group_log"
        elif conduit:
            med, top = _f(m.get("conduit/staleness/median")), _f(m.get("conduit/staleness/max"))
            mean, source, lags = _f(m.get("conduit/staleness/mean")), "conduit_metrics", None
        else:  # verl: per step, the mean and max over samples (groups of n: the mean over groups)
            mean, top = _f(m.get(f"{VERL_WORST}/mean")), _f(m.get(f"{VERL_WORST}/max"))
            med, source = mean, "verl_step_mean"
        dropped = m.get("conduit/stale_dropped") if conduit else m.get(VERL_EVICTED, 0)
        trained = int(groups) if groups is not None else (len(lags) if lags else batch_size)
        out[step] = {
            "staleness_median": med,
            "staleness_max": top,
            "staleness_mean": None if mean is None else round(mean, 4),
            "staleness_source": source if top is not None else None,
            "lags": lags,
            "prompts_trained": trained,
            "stale_dropped": None if dropped is None else int(dropped),
        }
    return out


def annotate(
    rows: list[dict[str, Any]], work_dirs: dict[str, str], label: str, batch_size: int | None
) -> None:
    """Add each row's staleness fields and work counters, from its run's work dir."""
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        key = f"{label}{r['system']}_r{r['round']}"
        if key not in runs:
            runs[key] = step_staleness(Path(work_dirs[key]), r["system"], batch_size)
        s = runs[key].get(r["iteration"], {})
        trained, dropped = s.get("prompts_trained"), s.get("stale_dropped")
        r.update(
            max_staleness=bound(r["system"]),
            staleness_median=s.get("staleness_median"),
            staleness_max=s.get("staleness_max"),
            staleness_mean=s.get("staleness_mean"),
            staleness_source=s.get("staleness_source"),
            lags=s.get("lags"),
            prompts_trained=trained,
            stale_dropped=dropped,
            prompts_generated=None if trained is None or dropped is None else trained + dropped,
            update_weights_s=r.get("stages", {}).get("update_weights"),
        )


def _med(values: list[Any], nd: int = 4) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return round(statistics.median(vals), nd) if vals else None


def _sum(values: list[Any]) -> int | None:
    vals = [int(v) for v in values if v is not None]
    return sum(vals) if vals else None


def summarize(rows: list[dict[str, Any]], systems: list[str]) -> list[dict[str, Any]]:
    """One row per system over all its measured iterations (every round): the bound, the measured
    staleness (Conduit: over every trained group; verl: per-step means), medians of wall, exposed
    and weight-push time, and the work totals."""
    out = []
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        if not mine:
            continue
        lags = [lag for r in mine for lag in (r.get("lags") or [])]
        sources = {r.get("staleness_source") for r in mine} - {None}
        per_group = sources == {"group_log"}
        step_means = [r.get("staleness_mean") for r in mine]
        maxes = [float(r["staleness_max"]) for r in mine if r.get("staleness_max") is not None]
        out.append(
            {
                "algo": mine[0]["algo"],
                "system": system,
                "max_staleness": bound(system),
                "staleness_median": float(statistics.median(lags))
                if per_group and lags
                else _med([r.get("staleness_median") for r in mine]),
                "staleness_max": max(maxes) if maxes else None,
                "staleness_source": "group_log (every trained group)"
                if per_group
                else (
                    "verl_step_mean (median of per-step means)"
                    if "verl_step_mean" in sources
                    else "conduit_metrics (median of per-step medians)"
                    if sources
                    else None
                ),
                "staleness_median_of_step_means": _med(step_means),
                "lag_histogram": {str(k): lags.count(k) for k in sorted(set(lags))} if per_group else None,
                "iterations": len(mine),
                "rounds": len({r["round"] for r in mine}),
                "tq_backend": ",".join(sorted({str(r.get("tq_backend")) for r in mine})),
                "wall_s": _med([r["wall_s"] for r in mine]),
                "exposed_s": _med([r["exposed_s"] for r in mine]),
                "ingest_busy_s": _med([r.get("ingest_busy_s") for r in mine]),
                "update_weights_s": _med([r.get("update_weights_s") for r in mine]),
                "responses": _sum([r.get("work", {}).get("responses") for r in mine]),
                "response_tokens": _sum([r.get("work", {}).get("response_tokens") for r in mine]),
                "prompts_trained": _sum([r.get("prompts_trained") for r in mine]),
                "stale_dropped": _sum([r.get("stale_dropped") for r in mine]),
                "prompts_generated": _sum([r.get("prompts_generated") for r in mine]),
                **_bound_summary(mine),
                "storage_s_per_iter": _med(
                    [
                        r["tq_put_s_per_iter"] + r["tq_get_s_per_iter"]
                        for r in mine
                        if r.get("tq_put_s_per_iter") is not None and r.get("tq_get_s_per_iter") is not None
                    ]
                ),
            }
        )
    return out


def _bound_summary(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of a system's rows' two-resource bound (``verl_analysis.two_resource_bound``), which
    resource bounded how many iterations, and its median seconds per response token."""
    bounds = [b for r in mine if (b := two_resource_bound(r))["bound_s"]]
    out = {
        "trainer_busy_s": _med([b["trainer_busy_s"] for b in bounds]),
        "gen_busy_s": _med([b["gen_busy_s"] for b in bounds]),
        "bound_s": _med([b["bound_s"] for b in bounds]),
        "wall_over_bound": _med([b["wall_over_bound"] for b in bounds], 3),
        "bound_by": {k: sum(b["bound_by"] == k for b in bounds) for k in ("trainer", "generation")}
        if bounds
        else None,
    }
    spt = median_per_token(mine, mine[0]["system"]) if mine else None
    return out | {"s_per_token": None if spt is None else round(spt, 7)}


def staleness_differs(summary: dict[str, dict[str, Any]], a: str, b: str) -> str | None:
    """Why ``a`` (a conduit system) cannot be compared with ``b``: it trained staler data than ``b``
    on the median (over every group where both have a group log, else the median of per-step means,
    the statistic verl reports) or the maximum, to 3 decimals; or None. ``a`` at equal or lower
    staleness is compared: fresher data can only have cost ``a`` time, never saved it."""
    sa, sb = summary.get(a), summary.get(b)
    for name, s in ((a, sa), (b, sb)):
        if s is None or s.get("staleness_max") is None:
            return f"no measured staleness for {name}"
    assert sa is not None and sb is not None
    per_group = str(sa.get("staleness_source")).startswith("group_log") and str(
        sb.get("staleness_source")
    ).startswith("group_log")
    median_key = "staleness_median" if per_group else "staleness_median_of_step_means"
    staler = []
    for key in (median_key, "staleness_max"):
        va, vb = sa.get(key), sb.get(key)
        if va is None or vb is None:
            return f"{key} not measured for {a if va is None else b}"
        if round(float(va), 3) > round(float(vb), 3):
            staler.append(f"{key} {a} {va:g}, {b} {vb:g}")
    return f"staleness differs: {a} trained staler data: " + "; ".join(staler) if staler else None


def staleness_compared(summary: dict[str, dict[str, Any]], a: str, b: str) -> str:
    """How ``a``'s measured staleness stood to ``b``'s where their ratio is computed."""
    sa, sb = summary[a], summary[b]
    parts = [
        f"{key} {sa.get(key)!s} vs {sb.get(key)!s}"
        for key in ("staleness_median_of_step_means", "staleness_max")
        if sa.get(key) is not None and sb.get(key) is not None
    ]
    return "; ".join(parts)


def staleness_ratios(
    rows: list[dict[str, Any]], summary: dict[str, dict[str, Any]], pairs: list[tuple[str, str]]
) -> dict[str, Any]:
    """``a`` ÷ ``b`` (medians of wall and exposed time) for each pair, only where ``a`` trained no staler
    data than ``b`` (``refused/<a>_over_<b>``: why not; ``staleness/<a>_vs_<b>``: both measurements)
    and about the same work: median response tokens per iteration within ``verl_analysis.WORK_TOLERANCE``
    (``tokens_differ``: async trainers' response lengths drift with the policy and the timing; the
    refusal says by how much; each system's last iteration left out, as ``work_differs`` does). Beside it ``s_per_token/<a>_over_<b>``, seconds per response token, the
    ratio that holds whatever the work. ``work/<a>_vs_<b>``: where the generated work differed
    iteration by iteration (``verl_analysis.work_differs``; in async modes it depends on when in-flight
    requests are aborted and resumed) or ``"equal"``; reported, not a refusal."""
    out: dict[str, Any] = {}
    for a, b in pairs:
        if a not in summary or b not in summary:
            continue
        if why := staleness_differs(summary, a, b):
            out[f"refused/{a}_over_{b}"] = why
            continue
        out.update(per_token(rows, a, b, open_last=True))
        out[f"work/{a}_vs_{b}"] = work_differs(rows, a, b, open_last=True) or "equal"
        out[f"staleness/{a}_vs_{b}"] = staleness_compared(summary, a, b)
        if why := tokens_differ(rows, a, b, open_last=True):
            out[f"refused/{a}_over_{b}"] = why
            continue
        out.update(median_ratios(rows, a, b))
    return out


def all_ratios(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> dict[str, Any]:
    """``verl_analysis.ratios`` on the on-policy comparison (``conduit_k0`` ÷ ``verl_sync_tuned``) and
    the backend rule (every ``+tq_conduit`` system ÷ its trainer on SimpleStorage); then every
    ``conduit_k>=1`` ÷ every verl async system where Conduit trained no staler data; medians of every system."""
    systems = [s["system"] for s in summary]
    on_policy = [r for r in rows if not (r["system"].startswith("conduit") and (r["max_staleness"] or 0) > 0)]
    baselines = [s for s in systems if split_system(s)[0] == "verl_sync_tuned"]
    out = ratios(on_policy, baselines)
    by = {s["system"]: s for s in summary}
    mine = [s for s in systems if s.startswith("conduit") and (bound(s) or 0) > 0]
    theirs = [s for s in systems if verl_async(s)]
    out.update(staleness_ratios(rows, by, [(a, b) for a in mine for b in theirs]))
    for s in systems:
        out.setdefault(f"median_wall_s/{s}", median(rows, s, "wall_s"))
        out.setdefault(f"median_exposed_s/{s}", median(rows, s, "exposed_s"))
        if (spt := median_per_token(rows, s)) is not None:
            out.setdefault(f"median_s_per_token/{s}", round(spt, 7))
    for key, value in bound_medians(rows, systems).items():
        out.setdefault(key, value)
    return out


def targets(ratio: dict[str, Any], summary: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 30's targets from the measured ratios: conduit k=1 ≤ 0.9× ``verl_colocate_async`` end to
    end and ≤ 0.5× exposed where k = 1 trained no staler data (None where refused: the reason beside);
    Conduit's backend under each verl async trainer ≥ 1.1× faster (wall ratio ≤ 1/1.1), else the
    storage time per iteration that bounds what a backend could save (for the note)."""
    head = f"{HEADLINE[0]}_over_{HEADLINE[1]}"
    wall, exposed = ratio.get(f"wall/{head}"), ratio.get(f"exposed/{head}")
    out: dict[str, Any] = {
        f"k1_wall<={TARGET_WALL}x": None if wall is None else wall <= TARGET_WALL,
        f"k1_exposed<={TARGET_EXPOSED}x": None if exposed is None else exposed <= TARGET_EXPOSED,
    }
    if why := ratio.get(f"refused/{head}"):
        out["k1_refused"] = why
    equal = f"{HEADLINE[0]}_over_{EQUAL_BOUND}"  # verl under its own bound of one version
    if f"wall/{equal}" in ratio or f"refused/{equal}" in ratio:
        wall, exposed = ratio.get(f"wall/{equal}"), ratio.get(f"exposed/{equal}")
        out[f"k1_equal_bound_wall<={TARGET_WALL}x"] = None if wall is None else wall <= TARGET_WALL
        out[f"k1_equal_bound_exposed<={TARGET_EXPOSED}x"] = (
            None if exposed is None else exposed <= TARGET_EXPOSED
        )
        if why := ratio.get(f"refused/{equal}"):
            out["k1_equal_bound_refused"] = why
    by = {s["system"]: s for s in summary}
    for base in VERL_ASYNC:
        mine = f"{base}{TQ_SUFFIX}conduit"
        if base not in by or mine not in by:
            continue
        r = ratio.get(f"backend/wall/{mine}_over_{base}")
        out[f"backend_{base}>={TARGET_BACKEND_SPEEDUP}x"] = (
            None if r is None else r <= 1 / TARGET_BACKEND_SPEEDUP
        )
        if why := ratio.get(f"refused/backend/{mine}_over_{base}"):
            out[f"backend_{base}_refused"] = why
        if r is None or r > 1 / TARGET_BACKEND_SPEEDUP:  # what storage could save at most, measured
            storage, wall_s = by[base].get("storage_s_per_iter"), by[base].get("wall_s")
            out[f"backend_{base}_storage_share"] = (
                round(storage / wall_s, 4) if storage is not None and wall_s else None
            )
    return out


def headlines(
    rows: list[dict[str, Any]], ratio: dict[str, Any], polls: dict[str, str]
) -> list[dict[str, Any]]:
    """The file's headline claims: ``conduit_k1`` ÷ ``verl_colocate_async``, wall <= ``TARGET_WALL`` and
    exposed <= ``TARGET_EXPOSED``, each with its interval and verdict (``intervals.headline``); on
    vLLM ``conduit_k1`` ÷ ``verl_separate_async_k1``, wall <= ``TARGET_SEPARATE`` of the resource
    that bounded the baseline (``bound_held``);
    refused where Conduit trained staler data (``all_ratios``) or the baseline waited on a long
    poll (``polls``: ``poll_check.poll_findings``)."""
    rollout = rows[0].get("rollout") if rows else None
    a, b = headline_pair(rollout)
    algo = str(rows[0]["algo"]).upper() if rows else ""
    why = ratio.get(f"refused/{a}_over_{b}") or (f"{b}: {polls[b]}" if b in polls else None)
    if rollout == "vllm":  # one claim: wall, its target set by what bounded the baseline's steps
        held = bound_held(rows, b)
        target = TARGET_SEPARATE.get(held or "trainer", TARGET_SEPARATE["trainer"])
        claim = f"verl {algo} vLLM, equal staleness bound: {a} ÷ {b}, wall ({held or 'unknown'}-bound)"
        return [headline(claim, rows, (a, b), "wall_s", target, refused=why)]
    return [
        headline(
            f"verl {algo} paced, bounded staleness: {a} ÷ {b}, {what}",
            rows,
            HEADLINE,
            key,
            target,
            refused=why,
        )
        for what, key, target in (("wall", "wall_s", TARGET_WALL), ("exposed", "exposed_s", TARGET_EXPOSED))
    ]
