"""verl 0.9.1 on CPU under bounded staleness: Conduit's ``max_staleness=k`` mode and verl's async trainers.

    python benchmarks/verl_staleness.py [--algo grpo|ppo] [--quick] [--systems a,b,...] [--out FILE]
    python benchmarks/verl_staleness.py --rollout vllm ...
    python benchmarks/verl_staleness.py --reward-steps 50 --seeds 3     # also the reward curves

Issue 30's benchmark, built on ``verl_iteration.py``'s runs (``verl_runs``: one harness run per system
and round, rounds alternating verl's and Conduit's systems; ``verl_analysis``: per-iteration rows, wall
and exposed time, medians, the backend ratio). Systems, same seed and data:

* ``verl_colocate_async``, ``verl_separate_async``: verl's async trainers (one batch generated ahead,
  no staleness bound: the harness sets ``trainer.v1.sampler.max_off_policy_threshold=null``), each on
  verl's SimpleStorage and, with the suffix ``+tq_conduit``, on Conduit's TransferQueue backend;
* ``conduit_k0``, ``conduit_k1``, ``conduit_k2``: trainer mode ``conduit`` with
  ``+trainer.v1.conduit.max_staleness=k`` and a group log (``<work>/groups.jsonl``: one line per trained
  prompt group, the versions that generated it and the one that trained it); k = 0 is the on-policy mode;
* ``verl_sync_tuned`` (reference, on-policy): verl's sync trainer at a fixed replay-buffer poll period
  (``--poll``, default 0.02 s; no sweep here: ``verl_iteration.py`` sweeps it).

Every row (per measured iteration, and per system in ``summary``) carries ``algo``, ``system``,
``max_staleness`` (the bound: k; 0 for verl's sync trainer; None for verl's async ones, unbounded),
the measured staleness ``staleness_median`` / ``staleness_max`` (lag = version trained on - oldest
version that generated any token of the group), ``wall_s``, ``exposed_s`` (``verl_analysis``), the
work counters (``work``: responses and response tokens the rollout generated per weight version;
``prompts_trained``, ``stale_dropped``, ``prompts_generated`` = trained + dropped) and
``update_weights_s`` (verl's ``timing_s/update_weights``: the weight push to the rollout).

Staleness sources: Conduit's rows from the group log (per group; the step's ``conduit/staleness/*``
metrics where no log is there); verl's rows from verl's own ``training/off_policy/
trajectory_staleness_worst/{mean,max}`` per step, so a verl system's ``staleness_median`` is the median
of per-step means (no per-group source exists for verl's trainers). ``conduit_k1 / verl_colocate_async``
(and every other conduit_k>=1 over each verl async system) is computed only where Conduit trained no
staler data: its median of per-step means (the statistic both sides have) and its maximum each at most
the verl system's (fresher data can only have cost Conduit time); otherwise ``refused/...`` says which
was staler, and ``staleness/...`` gives both measurements beside every computed ratio. The backend ratio (``backend/...``) is
``verl_analysis.ratios``' rule; ``conduit_k0 / verl_sync_tuned`` too (both on-policy).

``--reward-steps N --seeds S`` (off by default) also runs ``conduit_k1`` and ``verl_colocate_async`` for
N iterations with seeds seed..seed+S-1 on the same rollout and shape: mean score per iteration, and
whether k = 1's final score lies within verl's seed-to-seed spread. Paced rollout: a model of separate
rollout hardware (``verl_iteration.py``'s docstring), not a GPU measurement.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import script  # noqa: E402
from verl_analysis import calibration, median, ratios, work_differs  # noqa: E402
from verl_plots import reward_curve  # noqa: E402
from verl_runs import (  # noqa: E402
    TQ_SUFFIX,
    add_run_flags,
    calibrate,
    harness_args,
    machine,
    plan_size,
    run_method,
    run_systems,
    split_system,
    table,
)

#: every system of the default run (``round_order`` pairs verl's with Conduit's in this order)
SYSTEMS = (
    "verl_colocate_async",
    "verl_colocate_async+tq_conduit",
    "verl_separate_async",
    "verl_separate_async+tq_conduit",
    "verl_sync_tuned",
    "conduit_k1",
    "conduit_k0",
    "conduit_k2",
)
#: ``--quick``: the headline pair, the backend pair, and the on-policy mode (4 runs, ~10 min)
QUICK_SYSTEMS = ("verl_colocate_async", "verl_colocate_async+tq_conduit", "conduit_k1", "conduit_k0")
VERL_MODES = ("verl_sync", "verl_sync_tuned", "verl_colocate_async", "verl_separate_async")
#: verl's trainers that generate ahead with no bound of their own (off-policy)
VERL_ASYNC = ("verl_colocate_async", "verl_separate_async")
CONDUIT_K = re.compile(r"conduit_k(\d+)$")
HEADLINE = ("conduit_k1", "verl_colocate_async")
VERL_WORST = "training/off_policy/trajectory_staleness_worst"
VERL_EVICTED = "training/off_policy/evicted_samples"
#: issue 30's targets: conduit k=1 over verl_colocate_async, and the backend under verl's async trainers
TARGET_WALL, TARGET_EXPOSED, TARGET_BACKEND_SPEEDUP = 0.9, 0.5, 1.1
REWARD_SYSTEMS = ("conduit_k1", "verl_colocate_async")
#: the reward curves' final score: mean over this many last iterations
REWARD_TAIL = 10


def bound(system: str) -> int | None:
    """The staleness bound a system runs under: k for ``conduit_k<k>``, 0 for verl's sync trainer,
    None for verl's async trainers (no bound: the harness switches verl's threshold off)."""
    plain, _ = split_system(system)
    if m := CONDUIT_K.match(plain):
        return int(m.group(1))
    return 0 if plain.startswith("verl_sync") else None


def conduit_modes(systems: list[str], g_ing: str) -> dict[str, tuple[str, list[str]]]:
    """``run_systems``' extra systems: ``conduit_k<k>`` -> trainer mode ``conduit`` with the bound
    and a group log in the run's work dir (``{work}``)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for system in systems:
        plain, _ = split_system(system)
        k = bound(system)
        if CONDUIT_K.match(plain) and k is not None:
            out[plain] = (
                "conduit",
                [
                    f"+trainer.v1.conduit.max_staleness={k}",
                    "+trainer.v1.conduit.group_log={work}/groups.jsonl",
                    f"+trainer.v1.conduit.g_ing={g_ing}",
                ],
            )
    return out


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def group_lags(path: Path) -> dict[int, list[int]]:
    """Step -> the lag of each group it trained, from a ``group_log``. A reused work dir appends a
    second run's rows: only the rows after the log's last restart (a step lower than the one before)
    count."""
    rows = _jsonl(path)
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
    metrics = {int(r["step"]): r["data"] for r in _jsonl(work / "metrics.jsonl")}
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
                "update_weights_s": _med([r.get("update_weights_s") for r in mine]),
                "responses": _sum([r.get("work", {}).get("responses") for r in mine]),
                "response_tokens": _sum([r.get("work", {}).get("response_tokens") for r in mine]),
                "prompts_trained": _sum([r.get("prompts_trained") for r in mine]),
                "stale_dropped": _sum([r.get("stale_dropped") for r in mine]),
                "prompts_generated": _sum([r.get("prompts_generated") for r in mine]),
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
    data than ``b`` (``refused/<a>_over_<b>``: why not; ``staleness/<a>_vs_<b>``: both measurements). ``work/<a>_vs_<b>``: where the generated work differed
    (``verl_analysis.work_differs``; in async modes it depends on when in-flight requests are
    aborted and resumed) or ``"equal"``; reported, not a refusal."""
    out: dict[str, Any] = {}
    for a, b in pairs:
        if a not in summary or b not in summary:
            continue
        if why := staleness_differs(summary, a, b):
            out[f"refused/{a}_over_{b}"] = why
            continue
        for key in ("wall_s", "exposed_s"):
            x, y = median(rows, a, key), median(rows, b, key)
            if x is not None and y:
                out[f"{key.removesuffix('_s')}/{a}_over_{b}"] = round(x / y, 3)
        out[f"work/{a}_vs_{b}"] = work_differs(rows, a, b, open_last=True) or "equal"
        out[f"staleness/{a}_vs_{b}"] = staleness_compared(summary, a, b)
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
    theirs = [s for s in systems if split_system(s)[0] in VERL_ASYNC]
    out.update(staleness_ratios(rows, by, [(a, b) for a in mine for b in theirs]))
    for s in systems:
        out.setdefault(f"median_wall_s/{s}", median(rows, s, "wall_s"))
        out.setdefault(f"median_exposed_s/{s}", median(rows, s, "exposed_s"))
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


def reward_runs(
    root: Path, args: argparse.Namespace, plan: dict[str, Any], errors: dict[str, str]
) -> dict[str, Any]:
    """``--reward-steps``: ``conduit_k1`` and ``verl_colocate_async``, one run each per seed, through
    ``run_systems`` (warm-up iteration dropped as everywhere): mean score per iteration, each
    system's final score (mean of the last ``REWARD_TAIL`` iterations) per seed, and whether k = 1's
    mean final score lies within verl's seed-to-seed spread (min..max over its seeds)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    final: dict[str, dict[str, float]] = {s: {} for s in REWARD_SYSTEMS}
    for seed in range(args.seed, args.seed + args.seeds):
        a = argparse.Namespace(**{**vars(args), "seed": seed})
        mine = {**plan, "rounds": 1, "steps": args.reward_steps - 1, "label": f"reward_s{seed}_"}
        mine["harness"] = [*plan["harness"], "--lr", str(args.reward_lr)]
        result: dict[str, Any] = {"errors": errors}
        rows = run_systems(root, a, list(REWARD_SYSTEMS), mine, result)
        for system in REWARD_SYSTEMS:
            pts = [
                (r["iteration"], float(r["score"]))
                for r in rows
                if r["system"] == system and r["score"] is not None
            ]
            if pts:
                curves[f"{system} seed {seed}"] = pts
                final[system][str(seed)] = round(statistics.fmean(v for _, v in pts[-REWARD_TAIL:]), 4)
    spread = list(final["verl_colocate_async"].values())
    k1 = list(final["conduit_k1"].values())
    within = None
    if len(spread) >= 2 and k1:
        within = min(spread) <= statistics.fmean(k1) <= max(spread)
    return {
        "lr": args.reward_lr,
        "seeds": args.seeds,
        "iterations": args.reward_steps,
        "final_over_last": REWARD_TAIL,
        "final_score": final,
        "verl_colocate_async_spread": [min(spread), max(spread)] if spread else None,
        "k1_within_spread": within,
        "curves": curves,
    }


def plot(summary: list[dict[str, Any]], png: Path, title: str) -> None:
    """Per system: median wall and exposed time (bars), and the measured staleness (median, max)."""
    plt = script.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    names = [s["system"] for s in summary]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [s["wall_s"] or 0 for s in summary], 0.4, label="wall")
    ax.bar([x + 0.2 for x in xs], [s["exposed_s"] or 0 for s in summary], 0.4, label="exposed")
    ax.set_xticks(list(xs), names, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("seconds per iteration (median)")
    ax.legend(fontsize=8)
    nan = float("nan")
    for key, marker in (("staleness_median", "o"), ("staleness_max", "x")):
        ys = [nan if s[key] is None else s[key] for s in summary]
        bx.scatter(xs, ys, label=key.removeprefix("staleness_"), marker=marker)
    bx.set_xticks(list(xs), names, rotation=25, ha="right", fontsize=7)
    bx.set_ylabel("lag, versions (trained - generated)")
    bx.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    script.save_figure(fig, png)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = script.parser(__doc__, quick="4 measured iterations, 1 round, 4 systems (about 10 min paced)")
    p.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    p.add_argument(
        "--systems",
        default=None,
        help=f"comma list (default {','.join(SYSTEMS)}); conduit_k<k> for any k; a suffix "
        f"{TQ_SUFFIX}conduit / {TQ_SUFFIX}simple sets the TransferQueue backend",
    )
    p.add_argument(
        "--steps", type=int, default=None, help="measured iterations per run (default 14, quick 4)"
    )
    p.add_argument("--rounds", type=int, default=None, help="rounds of all systems (default 2, quick 1)")
    p.add_argument("--poll", type=float, default=0.02, help="verl_sync_tuned's replay-buffer poll period (s)")
    p.add_argument(
        "--rollout",
        choices=("paced", "vllm"),
        default="paced",
        help="paced: real tokens released at a modelled inference server's times (a model of separate "
        "rollout hardware); vllm: verl's vLLM rollout on vLLM's CPU build, its own core (--core-split)",
    )
    add_run_flags(p, timeout=900, paced="paced: ")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--response-length", type=int, default=256, help="max response tokens")
    p.add_argument("--pace-median", type=int, default=64, help="paced: median response tokens")
    p.add_argument("--core-split", default="0:1", help="vllm: VLLM_CORES:TRAINER_CORES")
    p.add_argument(
        "--g-ing", default="auto", help="conduit_k*: prompt groups per ingestion piece (int or auto)"
    )
    p.add_argument(
        "--reward-steps",
        type=int,
        default=0,
        help="also reward curves: conduit_k1 and verl_colocate_async, this many iterations per seed (0: off)",
    )
    p.add_argument("--seeds", type=int, default=3, help="--reward-steps: seeds seed..seed+N-1")
    p.add_argument("--reward-lr", type=float, default=3e-3, help="learning rate of the reward-curve runs")
    args = p.parse_args(argv)
    args.systems = args.systems or ",".join(QUICK_SYSTEMS if args.quick else SYSTEMS)
    for system in args.systems.split(","):
        try:
            plain, _ = split_system(system)
        except SystemExit as e:
            p.error(str(e))
        if plain not in VERL_MODES and not CONDUIT_K.match(plain):
            p.error(f"system {system!r}: use one of {', '.join(VERL_MODES)} or conduit_k<k> (k >= 0)")
    if args.reward_steps and (args.reward_steps < 2 or args.seeds < 1):
        p.error("--reward-steps needs at least 2 iterations (the first is warm-up) and --seeds >= 1")
    return args


def bench(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """Calibrate (paced), run every system in its rounds, analyse; write the JSON and PNGs."""
    prov = provenance.start()
    paced = args.rollout == "paced"
    steps, rounds = plan_size(args)
    name = "verl_staleness" + "_vllm" * (not paced) + f"_{args.algo}"
    args.out = args.out or script.RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    root = Path(args.work or tempfile.mkdtemp(prefix="verl_staleness_")).resolve()
    systems = args.systems.split(",")
    result: dict[str, Any] = {"algo": args.algo, "rollout": args.rollout, "machine": machine(), "errors": {}}
    if paced:
        cal = calibration(calibrate(root, args, args.tail))
        result["calibration"] = {f"tail={args.tail:g}": cal}
        harness = harness_args(args, args.tail, args.R * cal["time_scale_per_R"])
    else:
        harness = harness_args(args)
    plan = {
        "poll": args.poll,
        "rounds": rounds,
        "steps": steps,
        "label": "",
        "harness": harness,
        "info": {
            "rollout": args.rollout,
            "tail": args.tail if paced else None,
            "R": args.R if paced else None,
        },
        "modes": conduit_modes([*systems, *REWARD_SYSTEMS], str(args.g_ing)),
    }
    rows = run_systems(root, args, systems, plan, result)
    annotate(rows, result.get("work_dirs", {}), plan["label"], args.batch_size)
    summary = summarize(rows, systems)
    result.update(rows=rows, summary=summary)
    result["ratios"] = all_ratios(rows, summary)
    result["targets"] = targets(result["ratios"], summary)
    if args.reward_steps:
        result["reward_curve"] = reward_runs(root, args, plan, result["errors"])
        curves = result["reward_curve"]["curves"]
        if curves:
            title = f"verl 0.9.1 CPU {args.algo}, {args.rollout} rollout, lr {args.reward_lr}: mean score"
            reward_curve(curves, args.out.with_name(f"{args.out.stem}_reward.png"), title)
    result["method"] = method(args, rounds, steps)
    result["machine"].update(provenance.finish(prov))
    label = f"PACED rollout (modelled), tail {args.tail:g}, R {args.R:g}" if paced else "vLLM (CPU) rollout"
    title = f"verl 0.9.1 CPU {args.algo}, {label}: bounded staleness"
    out = script.write_result(name, args, result, lambda png: plot(summary, png, title) if summary else None)
    return result, out


def method(args: argparse.Namespace, rounds: int, steps: int) -> dict[str, Any]:
    """How the rows were made (goes into the JSON)."""
    out = {
        **run_method(rounds, steps),
        "systems": "conduit_k<k>: trainer mode conduit, +trainer.v1.conduit.max_staleness=k, "
        f"g_ing={args.g_ing}, a group log per run; verl_colocate_async / verl_separate_async: verl's async "
        "trainers (one batch generated ahead; no bound: the harness sets "
        "trainer.v1.sampler.max_off_policy_threshold=null), on SimpleStorage or, +tq_conduit, on Conduit's "
        f"backend; verl_sync_tuned: verl's sync trainer at a fixed poll period of {args.poll} s (no sweep here)",
        "staleness": "lag of a group = version trained on (step - 1) - oldest version that generated any "
        "of its tokens. conduit_k*: from the group log, every trained group of the measured iterations "
        "(staleness_median over groups); verl: verl's training/off_policy/trajectory_staleness_worst/"
        "{mean,max} per step, so its staleness_median is the median of per-step means (no per-group "
        "source exists for verl's trainers). staleness_max: the largest lag any measured step trained",
        "equal_staleness": "conduit_k>=1 / a verl async system only where Conduit trained no staler data: "
        "its median of per-step means (or, both with group logs, over groups) and its maximum each at most "
        "the other's, to 3 decimals (fresher data can only cost Conduit time); otherwise refused/... "
        "gives both values; staleness/<a>_vs_<b> gives both beside every computed ratio",
        "work": "work: responses and response tokens the rollout generated per weight version "
        "(gen_events); in async modes this depends on when in-flight requests are aborted and resumed, "
        "so it is reported (work/<a>_vs_<b>) and not a refusal for the staleness ratios; the backend "
        "and on-policy ratios refuse on it (verl_analysis.ratios), except, for trainers that generate ahead, "
        "on the last iteration (its version's responses are generated during a step the run never reaches). prompts_trained: Conduit's trained "
        "groups, verl's train batch size; stale_dropped: conduit/stale_dropped or verl's "
        "training/off_policy/evicted_samples (groups); prompts_generated = trained + dropped",
        "update_weights": "update_weights_s: verl's timing_s/update_weights (the push of new weights to "
        "the rollout, every step, every mode)",
        "exposed": (sys.modules["verl_analysis"].__doc__ or "").strip(),
        "targets": f"k1 over verl_colocate_async: wall <= {TARGET_WALL}x, exposed <= {TARGET_EXPOSED}x (None "
        f"where refused); backend: <base>+tq_conduit / <base> wall <= 1/{TARGET_BACKEND_SPEEDUP}, else "
        "backend_<base>_storage_share = SimpleStorage's TQ put+get seconds per iteration (summed over "
        "processes) / its median wall: what any backend could save at most",
        "shape": f"{args.batch_size} prompts x n={args.n}, responses up to {args.response_length} tokens",
    }
    if args.rollout == "paced":
        out["paced"] = (
            "PACED: real tokens released at a modelled inference server's times, time-scaled so a step's "
            f"modelled generation is R={args.R:g} x the ingestion time of a calibration run (tail "
            f"{args.tail:g}, median {args.pace_median} tokens); a model of separate rollout hardware, not "
            "a GPU measurement"
        )
    else:
        out["vllm"] = f"verl's vLLM rollout on vLLM's CPU build, cores {args.core_split}"
    if args.reward_steps:
        out["reward"] = (
            f"conduit_k1 and verl_colocate_async, {args.reward_steps} iterations, seeds {args.seed}.."
            f"{args.seed + args.seeds - 1}, lr {args.reward_lr}, same rollout and shape; final score = "
            f"mean critic/score/mean of the last {REWARD_TAIL} iterations; k1_within_spread: k1's mean "
            "final score within [min, max] of verl_colocate_async's seeds"
        )
    return out


def main() -> int:
    args = parse()
    result, out = bench(args)
    print(table(result["rows"], args.systems.split(",")))
    for s in result["summary"]:
        print(
            f"{s['system']:<32} bound {s['max_staleness']!s:>4}  staleness median {s['staleness_median']!s:>6} "
            f"max {s['staleness_max']!s:>4} ({s['staleness_source']}); dropped {s['stale_dropped']}"
        )
    print(json.dumps(result["ratios"], indent=1))
    print("targets:", json.dumps(result["targets"]))
    if "reward_curve" in result:
        rc = result["reward_curve"]
        print("reward:", json.dumps({k: rc[k] for k in ("final_score", "k1_within_spread")}))
    print(f"[bench] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
