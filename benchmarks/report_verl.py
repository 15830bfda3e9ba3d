"""verl renderers for ``report.py``: ``verl_iteration.py``'s results (hf and paced) and its paced sweep.

The JSON's ``ratios`` hold every median and ratio (``median_wall_s/<system>``,
``wall/<system>_over_<baseline>``, ``refused/...``, ``losses_equal/...``, ``backend/...``); the
table shows them per system, one column per baseline the JSON compared against. Files that carry the
two-resource bound (``median_wall_over_bound/<system>``, ``bound_by/<system>``, or rows with
``wall_over_bound``) get the columns "wall ÷ bound" and "bound by"; a ratio refused for unequal work
shows its seconds-per-response-token ratio (``s_per_token/...``) beside the refusal.
"""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, Refusals, get, num, pct, table, targets, times, verdict
from report_headline import headline_lines

Doc = dict[str, Any]
#: display order of the systems (others follow, sorted): verl's first, then Conduit's
ORDER = (
    "verl_sync",
    "verl_sync_tuned",
    "verl_sync_tuned+tq_conduit",
    "verl_colocate_async",
    "verl_separate_async",
    "conduit",
    "conduit+tq_simple",
    "conduit_stream",
)
STEADY = "conduit_steady"


def in_order(names: set[str]) -> list[str]:
    return [s for s in ORDER if s in names] + sorted(names - set(ORDER))


def pairs(ratios: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The systems compared (``X`` of ``X_over_Y``) and the baselines (``Y``) in the ratio keys."""
    xs: set[str] = set()
    ys: set[str] = set()
    for key in ratios:
        parts = key.split("/")
        rest, sep = parts[-1], "_vs_" if parts[0].endswith("losses_equal") else "_over_"
        if parts[0] in ("wall", "exposed", "refused", "losses_equal", "critic_losses_equal", "backend"):
            if sep in rest:
                x, y = rest.split(sep, 1)
                xs.add(x)
                ys.add(y)
    return in_order(xs), in_order(ys)


def pair_cell(r: dict[str, Any], x: str, y: str, refusals: Refusals) -> str:
    """``x`` ÷ ``y``: wall / exposed (or the backend-only ratio), losses equal or not, or the refusal."""
    why = r.get(f"refused/{x}_over_{y}") or r.get(f"refused/backend/{x}_over_{y}")
    wall, exposed = r.get(f"wall/{x}_over_{y}"), r.get(f"exposed/{x}_over_{y}")
    if wall is None and exposed is None:
        wall, exposed = r.get(f"backend/wall/{x}_over_{y}"), r.get(f"backend/exposed/{x}_over_{y}")
    cell = (
        refusals.cell(why)
        if why
        else ("" if wall is None and exposed is None else f"{num(wall, 3)} / {num(exposed, 3)}")
    )
    per_token = r.get(f"s_per_token/{x}_over_{y}", r.get(f"backend/s_per_token/{x}_over_{y}"))
    if per_token is not None:
        cell += f"{', ' if cell else ''}per token {num(per_token, 3)}"
    for key, label in (("losses_equal", "losses"), ("critic_losses_equal", "critic")):
        eq = r.get(f"{key}/{x}_vs_{y}")
        if eq is not None:
            cell += f"{', ' if cell else ''}{label} {'equal' if eq else 'differ'}"
    return cell


def error_lines(prefix: str, d: dict[str, Any], end: str = "") -> list[str]:
    """The line ``{prefix}: errors in a, b{end}`` when ``d`` records errors; none otherwise."""
    return [f"{prefix}: errors in {', '.join(map(str, d['errors']))}{end}"] if d.get("errors") else []


def _per_round(rows: list[dict[str, Any]], key: str) -> str:
    by = {r.get("round"): r.get(key) for r in rows if r.get(key) is not None}
    return ", ".join(num(by[k], 3) for k in sorted(by, key=str)) or DASH


def has_bound(d: Doc) -> bool:
    """Whether a results file carries the two-resource bound (its ratios' medians or its rows)."""
    r = d.get("ratios") or {}
    return any(k.startswith("median_wall_over_bound/") for k in r) or any(
        isinstance(x, dict) and "wall_over_bound" in x for x in d.get("rows") or []
    )


def bound_by(counts: Any) -> str:
    """``{"trainer": 12, "generation": 2}`` -> ``trainer 12 / generation 2``; one resource alone: its name."""
    if not isinstance(counts, dict) or not any(counts.values()):
        return DASH
    seen = [(k, v) for k, v in sorted(counts.items(), key=lambda kv: -kv[1]) if v]
    return seen[0][0] if len(seen) == 1 else " / ".join(f"{k} {num(v)}" for k, v in seen)


def system_rows(
    label: str, d: Doc, baselines: list[str], refusals: Refusals, bound: bool = False
) -> list[list[str]]:
    r = d.get("ratios") or {}
    point = (get(d, "rows", 0, "tail"), get(d, "rows", 0, "R"))
    rows = [x for x in d.get("rows") or [] if (x.get("tail"), x.get("R")) == point]
    names = {x.get("system") for x in rows} | {
        k.split("/", 1)[1] for k in r if k.startswith("median_wall_s/")
    }
    xs, _ = pairs(r)
    out = []
    for s in in_order({n for n in names if n}) + ([STEADY] if STEADY in xs else []):
        mine = [x for x in rows if x.get("system") == s]
        prof = get(d, "profile", s) or {}
        rep = r.get(f"repeats/{s}")
        cells = [
            label,
            s if s != STEADY else "conduit, steady window",
            ", ".join(sorted({str(x.get("tq_backend")) for x in mine})) or DASH,
            f"{len(mine) or DASH} / {num(sum(get(x, 'work', 'response_tokens') or 0 for x in mine)) if mine else DASH}",
            num(r.get(f"median_wall_s/{s}"), 3),
            num(r.get(f"median_exposed_s/{s}"), 3),
            num(r.get(f"median_ingest_busy_s/{s}"), 3),
            num(r.get(f"median_update_actor_s/{s}"), 3),
            *(
                [num(r.get(f"median_wall_over_bound/{s}"), 2), bound_by(r.get(f"bound_by/{s}"))]
                if bound
                else []
            ),
            f"{_per_round(mine, 'tq_put_s_per_iter')} / {_per_round(mine, 'tq_get_s_per_iter')}"
            if mine
            else DASH,
            f"{rep.get('iterations_differing')} of {rep.get('iterations_repeated')}"
            if isinstance(rep, dict)
            else "",
            f"{num(prof.get('whole_batch_iterations'))} whole-batch of {num(prof.get('iterations'))}; "
            f"{num(prof.get('pieces_streamed'), 0)} pieces"
            if prof
            else "",
        ]
        out.append(cells + [pair_cell(r, s, y, refusals) for y in baselines])
    return out


HEAD = [
    "algo",
    "system",
    "TQ backend",
    "iterations / response tokens",
    "wall s",
    "exposed s",
    "ingestion busy s",
    "update_actor s",
    "TQ put / get s per iteration (per round)",
    "rounds' losses differ at",
    "`auto`: whole-batch iterations; pieces per streamed step",
]


#: the two-resource bound's columns, after ``update_actor s`` (files that carry it: ``has_bound``)
BOUND_HEAD = ["wall ÷ bound", "bound by"]


def iteration(docs: list[tuple[str, Doc]]) -> list[str]:
    """One table over several runs (GRPO, PPO): per system medians, work, the two-resource bound
    where a file carries it, and its ratio to every baseline (wall / exposed, losses equal); then
    each run's poll sweep and targets."""
    refusals = Refusals()
    baselines = in_order({y for _, d in docs for y in pairs(d.get("ratios") or {})[1]})
    bound = any(has_bound(d) for _, d in docs)
    rows = [row for label, d in docs for row in system_rows(label, d, baselines, refusals, bound)]
    at = HEAD.index("update_actor s") + 1
    head = (HEAD[:at] + BOUND_HEAD + HEAD[at:] if bound else HEAD) + [
        f"÷ {y}: wall / exposed" for y in baselines
    ]
    out = table(head, rows) + [""] + refusals.lines()
    for label, d in docs:
        sw = d.get("sweep") or {}
        resolved = sw.get("resolved")
        given = next((x.get("poll_s") for x in d.get("rows") or [] if x.get("poll_s") is not None), None)
        out += [
            f"- {label}: verl_sync_tuned's poll period {num(sw.get('chosen'), 3)} s "
            f"(rule: {sw.get('rule', DASH)}; sweep resolved the order: {num(resolved)})."
            if sw or given is None
            else f"- {label}: verl_sync_tuned's poll period {num(given, 3)} s, given (`--poll`), no sweep.",
        ]
        out += error_lines(f"- {label}", d, ".")
        out += [f"- {label}: {line.removeprefix('- ')}" for line in targets(d.get("targets"))]
        out += headline_lines(label, d)
    return out


def _point(row: dict[str, Any]) -> str | None:
    """A row's sweep point as the JSON names it (``tail=4,R=4``)."""
    tail, r = row.get("tail"), row.get("R")
    return None if tail is None or r is None else f"tail={tail:g},R={r:g}"


def sweep(d: Doc) -> list[str]:
    """The paced sweep: per (tail, R) point each system's medians, the ratios, ``auto``'s g per step."""
    refusals, rows = Refusals(), []
    points = d.get("sweep_ratios") or {}
    systems = in_order(
        {k.split("/", 1)[1] for r in points.values() for k in r if k.startswith("median_wall_s/")}
    )
    xs, ys = pairs({k: v for r in points.values() for k, v in r.items()})
    compared = [(x, y) for x in xs for y in ys if x != y and x != STEADY]
    for point, r in points.items():
        mine = [x for x in d.get("rows") or [] if x.get("system") == "conduit" and _point(x) == point]
        rows.append(
            [point]
            + [f"{num(r.get(f'median_wall_s/{s}'))} / {num(r.get(f'median_exposed_s/{s}'))}" for s in systems]
            + [pair_cell(r, x, y, refusals) or DASH for x, y in compared]
            + [", ".join(num(x.get("g_ing"), 0) for x in mine) or DASH]
        )
    head = (
        ["point"]
        + [f"{s} wall / exposed s" for s in systems]
        + [f"{x} ÷ {y}: wall / exposed" for x, y in compared]
        + ["conduit's piece_groups per iteration"]
    )
    return table(head, rows) + [""] + refusals.lines() + targets(d.get("targets"))


def _gaps(e: dict[str, Any]) -> str:
    """``auto``'s gaps to the best fixed g (tuned part / iteration), its rank, probes."""
    if not e:
        return DASH
    rank = f"rank {num(e.get('auto_rank'))} of {num(e.get('auto_rank_among'))}"
    steps = e.get("auto_steps_compared")
    return (
        f"{pct(e.get('auto_gap_tuned'), sign=True)} / {pct(e.get('auto_gap_iteration'), sign=True)}, {rank}"
        f" on {num(len(steps)) if isinstance(steps, list) else DASH} steps; probes {num(e.get('auto_probes'))}/"
        f"{num(e.get('auto_steps'))}, {pct(e.get('auto_probe_share'))} of the run"
    )


def autotune_verl(d: Doc) -> list[str]:
    """Per workload (median response length): the model's order against the grid, ``auto`` fresh and
    from the cache against the best fixed g (the ``recorded`` view: the run's own policy)."""
    rows, verdicts = [], []
    for p in d.get("points") or []:
        e, c = get(p, "evaluation", "recorded") or {}, get(p, "cached", "recorded") or {}
        rows.append(
            [
                num(p.get("median")),
                f"{num(e.get('tau_tail'))} / {num(e.get('tau_rest'))}",
                f"{num(e.get('repeat_tau_tail'))} / {num(e.get('repeat_tau_rest'))}",
                f"{num(e.get('top3_overlap'))}/3",
                f"{num(e.get('best_g'))} ({num(e.get('best_rest_s'))})",
                num(get(p, "views", "recorded", "median_wall_s")),
                f"{num(e.get('model_pick'))}, {pct(e.get('model_pick_gap_tuned'), sign=True)} / "
                f"{pct(e.get('model_pick_gap_iteration'), sign=True)}",
                pct(e.get("prediction_error"), 0),
                _gaps(e),
                _gaps(c),
            ]
        )
        t = e.get("targets") or {}
        verdicts.append(f"median {p.get('median')}: " + ", ".join(f"{k} {verdict(v)}" for k, v in t.items()))
        verdicts += error_lines(f"median {p.get('median')}", p)
    head = [
        "median tokens",
        "τ tail / rest",
        "repetitions agree: τ tail / rest",
        "top-3 overlap",
        "best fixed g (rest s)",
        "grid's median iteration s",
        "model's pick, gap tuned / iteration",
        "prediction error (median)",
        "`auto`, fresh: gap tuned / iteration, rank, probes",
        "`auto`, 2nd run from the cache",
    ]
    return table(head, rows) + ["", "- Targets (recorded view): " + "; ".join(verdicts) + "."]


def tuning_cost(d: Doc) -> list[str]:
    rows = []
    for name, r in (d.get("runs") or {}).items():
        w, med = get(d, "work", name) or {}, r.get("median_wall_s") or {}
        rows.append(
            [
                name,
                str(r.get("settled_arm", DASH)),
                num(r.get("probe_steps")),
                num(r.get("other_arm_steps")),
                " / ".join(f"{arm} {num(v, 3)}" for arm, v in med.items()) or DASH,
                num(r.get("tuning_s")),
                pct(r.get("tuning_share"), 2, sign=True),
                f"{num(w.get('steps'))} / {num(w.get('responses'))} / {num(w.get('response_tokens'))}",
            ]
        )
    head = [
        "run",
        "settled arm",
        "probe steps",
        "steps in the other arm",
        "median step s per arm",
        "tuning s",
        "tuning share of the run",
        "work: steps / responses / tokens",
    ]
    return table(head, rows) + [
        "",
        f"- Same work in both runs: {num(d.get('work_equal'))}; target: tuning share ≤ {pct(d.get('target_share'), 0)}.",
    ]


def crash_resume(d: Doc) -> list[str]:
    """Per system: clean / degenerate trials, what a crash lost (medians over the clean trials), the
    correctness totals; the per-trial ratio (or its refusal); the shared kill schedule; journal lag."""
    rows = []
    for name, s in (d.get("systems") or {}).items():
        m = s.get("summary") or {}
        rows.append(
            [
                f"{name}: {s['label']}" if s.get("label") else name,
                f"{num(m.get('trials'))} / {num(m.get('clean'))} / {num(m.get('degenerate'))}",
                num(m.get("median_kill_at_s")),
                num(m.get("median_work_before_kill_s"), 1),
                num(m.get("median_lost_gen_s")),
                num(m.get("median_work_lost_s"), 1),
                num(m.get("median_requests_lost"), 0),
                f"{num(m.get('kept_groups_total'))} / {num(m.get('regenerated_requests_total'))}",
                f"{num(m.get('prompts_lost_total'))} / {num(m.get('prompts_duplicated_total'))}",
                num(m.get("kept_data_equal_all")),
                num(m.get("trained_before_kill")),
            ]
        )
    head = [
        "system",
        "trials / clean / degenerate",
        "kill at s after step start",
        "work before the kill (request-s)",
        "generation wall lost s",
        "generation work lost (request-s)",
        "requests lost",
        "groups kept / requests regenerated (totals)",
        "prompts lost / duplicated",
        "kept data = journal",
        "killed after the step trained",
    ]
    out = table(head, rows) + [""]
    refused = d.get("ratio_refused")
    for label, keys, rkey in (
        (
            "generation work lost",
            ("lost_work_ratio_journal_off_over_on", "lost_work_ratio_verl_over_conduit"),
            "work_lost_s",
        ),
        (
            "generation wall lost",
            ("lost_gen_ratio_journal_off_over_on", "lost_gen_ratio_verl_over_conduit"),
            "lost_gen_s",
        ),
    ):
        value = next((d[k] for k in keys if d.get(k) is not None), None)
        pairs_n = num(get(d, "ratios", rkey, "pairs"))
        shown = f"refused: {refused}" if refused else times(value)
        out.append(f"- {label}, baseline ÷ journal (median of {pairs_n} per-trial ratios): {shown}")
    ks = d.get("kill_schedule") or {}
    kills = ks.get("seconds_after_step_start")
    out.append(
        f"- kill schedule, s after the step began: "
        f"{', '.join(num(k) for k in kills) if isinstance(kills, list) else DASH}; shared by both systems: "
        f"{num(ks.get('shared'))}"
    )
    lag = d.get("durability_lag") or {}
    out.append(
        f"- durability lag (group finished → fsynced) over {num(lag.get('groups'))} groups: median "
        f"{num(lag.get('median_s'), 3)} s, p95 {num(lag.get('p95_s'), 3)} s, max {num(lag.get('max_s'), 3)} s"
    )
    return out


def sweep_point(d: Doc, point: str, name: str) -> list[str]:
    """One point of the paced sweep (``d``: its results file ``name``) beside the paced headline: the
    point where overlap has least to hide (tail 1, R 1), so the headline is not read alone."""
    r = get(d, "sweep_ratios", point) or {}
    if not r:
        return [f"- The sweep point {point}: not in `{name}`."]
    wall, exposed = r.get("wall/conduit_over_verl_sync_tuned"), r.get("exposed/conduit_over_verl_sync_tuned")
    return [
        f"- Beside the headline point, the sweep's point {point} (`{name}`, GRPO, one quick round, the "
        f"sweep's own provenance below): conduit ÷ verl_sync_tuned wall {num(wall, 3)}, exposed "
        f"{num(exposed, 3)}, losses equal: {num(r.get('losses_equal/conduit_vs_verl_sync_tuned'))}."
    ]
