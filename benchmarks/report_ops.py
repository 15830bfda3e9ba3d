"""Renderers for ``report.py``: reliability (crash trials, soak, checkpoint pause), placement, tuners.

Each renderer takes the parsed JSON (``{}`` where the file is missing) and returns lines; missing
fields render as ``—``; nothing is computed beyond unit conversion.
"""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, get, kv, ms, num, pct, rows_of, table, times, verdict
from scaling_report import offpath_line, validated, verdict_lines

Doc = dict[str, Any]


def _ms_or_oom(r: dict[str, Any] | None, nd: int = 2) -> str:
    if not r:
        return DASH
    return "out of memory" if r.get("oom") else ms(r.get("seconds"), nd)


def migration(d: Doc) -> list[str]:
    """Per response length: Conduit, the best static placement (which), greedy, conservative."""
    by: dict[Any, dict[str, dict[str, Any]]] = {}
    for r in rows_of(d):
        by.setdefault(r.get("tokens"), {})[str(r.get("system"))] = r
    ratio = get(d, "summary", "conduit_over_best_static") or {}
    rows = []
    for tokens, s in by.items():
        c, best = s.get("conduit") or {}, s.get("best_static") or {}
        rows.append(
            [
                num(tokens),
                _ms_or_oom(c),
                f"{_ms_or_oom(best)} ({str(best.get('which', DASH)).removeprefix('static:')})",
                times(ratio.get(str(tokens)), 3),
                _ms_or_oom(s.get("greedy")),
                _ms_or_oom(s.get("conservative")),
                " / ".join(
                    _ms_or_oom(s.get(f"static:{p}")) for p in ("planned", "all_host", "all_shm", "all_disk")
                ),
                f"{ms(c.get('migration_s'), 1)} / {ms(c.get('max_pause_s'), 2)}",
                f"{num(c.get('iters'))} × {num(c.get('samples_per_iter'))}",
            ]
        )
    head = [
        "tokens",
        "Conduit ms / iteration",
        "best static ms (which)",
        "Conduit ÷ best static",
        "greedy ms",
        "conservative ms",
        "static planned / host / shm / disk ms",
        "Conduit's migration ms / longest pause ms",
        "work: iterations × responses",
    ]
    s = d.get("summary") or {}
    checks = {k: v for k, v in s.items() if isinstance(v, bool)}
    lines = [f"{k} {verdict(v)}" for k, v in checks.items()]
    for k in ("oom_at_tokens", "cumulative_s", "items_accounted"):
        if isinstance(s.get(k), dict):
            lines.append(f"{k.replace('_', ' ')}: " + ", ".join(f"{a} {num(b, 3)}" for a, b in s[k].items()))
    budgets = ", ".join(f"{k} {num(v, 1, scale=2**-20)} MiB" for k, v in (d.get("budgets") or {}).items())
    return (
        [f"- Simulated budgets: {budgets or DASH}.", ""]
        + table(head, rows)
        + ["", "- Targets and summary: " + "; ".join(lines) + "."]
    )


ABLATION = ("all_pageable_host", "all_shm", "all_disk", "planned")
GPU = ("planned", "all_pageable_host", "pinned_zero_copy", "one_gpu", "sharded_gpus")


def placement_ablation(d: Doc) -> list[str]:
    """Per workload and size: each placement measured, the best, planned ÷ best, Spearman; the
    8×H200 predictions (not measurements)."""
    by: dict[tuple[Any, Any], dict[str, dict[str, Any]]] = {}
    for r in rows_of(d):
        by.setdefault((r.get("workload"), r.get("size")), {})[str(r.get("system"))] = r
    gpu: dict[tuple[Any, Any], dict[str, Any]] = {}
    for r in rows_of(d, "gpu_predictions"):
        gpu.setdefault((r.get("workload"), r.get("size")), {})[str(r.get("system"))] = r.get("predicted_s")
    rows = []
    for (workload, size), s in by.items():
        summ = get(d, "summary", workload, "per_size", str(size)) or {}
        g = gpu.get((workload, size), {})
        rows.append(
            [str(workload), num(size)]
            + [_ms_or_oom(s.get(p), 3) for p in ABLATION]
            + [
                str(summ.get("best_measured", DASH)),
                times(summ.get("planned_over_best"), 3),
                num(summ.get("spearman")),
                " / ".join(ms(g.get(p), 3) for p in GPU),
            ]
        )
    head = (
        ["workload", "size"]
        + [f"{p} ms" for p in ABLATION]
        + [
            "best measured",
            "planned ÷ best",
            "Spearman (this size)",
            "8×H200 predicted ms: " + " / ".join(GPU),
        ]
    )
    lines = [
        f"{w}: Spearman over all points {num(s.get('spearman_all_points'))}; out of memory: "
        + (", ".join(f"{a} at {b}" for a, b in s.get("oom") or []) or "none")
        for w, s in (d.get("summary") or {}).items()
        if isinstance(s, dict)
    ]
    return table(head, rows) + ["", "- Planner accuracy: " + "; ".join(lines) + "."]


CRASH = {
    "lost_s_median": "committed experience lost per crash: median",
    "lost_s_max": "max",
    "lost_items_median": "items lost per crash: median",
    "lost_items_max": "max",
    "recover_s_median": "recovery: median",
    "recover_s_max": "max",
    "kill_after_save_start_s_median": "kill after the save began: median",
    "kill_after_save_start_s_max": "max",
    "save_window_s_median": "save time: median",
    "save_window_s_max": "max",
    "killed_during_save": "kills inside save()",
}


def crash_trials(d: Doc) -> list[str]:
    rows = []
    for part in ("core", "rllib"):
        s = get(d, part, "summary") or {}
        rows.append([part, num(s.get("trials")), num(s.get("ok")), kv(s, CRASH, skip=("trials", "ok"))])
    head = ["part", "trials", "trials ok (exact recovery / restored a written checkpoint)", "measured"]
    return [f"- Journal flush interval {num(d.get('journal_flush_interval_s'))} s.", ""] + table(head, rows)


def soak(d: Doc) -> list[str]:
    rows = []
    for r in rows_of(d):
        rss, put, got = r.get("rss_mb") or {}, r.get("put_latency_s") or {}, r.get("get_latency_s") or {}
        rows.append(
            [
                str(r.get("overlap", DASH)),
                num(r.get("wall_s"), 0),
                f"{num(r.get('items_in'))} / {num(r.get('items_out'))}",
                f"{num(r.get('lost'))} / {num(r.get('duplicated'))}",
                f"{num(r.get('checksum_match'))} / {num(r.get('per_producer_match'))} / {num(r.get('bad_contents_batches'))}",
                num(r.get("throughput_items_per_s_median"), 0),
                f"{ms(put.get('p50'), 1)} / {ms(put.get('p99'), 1)}",
                f"{ms(got.get('p50'), 1)} / {ms(got.get('p99'), 1)}",
                f"{num(rss.get('after_warmup'), 1)} → {num(rss.get('end'), 1)} ({num(rss.get('growth_after_warmup'), 1)})",
                num(len(r["errors"]) if isinstance(r.get("errors"), list) else None),
            ]
        )
    head = [
        "mode",
        "wall s",
        "items in / out",
        "lost / duplicated",
        "checksum / per-producer match / bad batches",
        "items / s (median)",
        "put p50 / p99 ms",
        "get p50 / p99 ms",
        "RSS MiB after warm-up → end (growth)",
        "errors",
    ]
    r = d.get("ratios") or {}
    return table(head, rows) + ["", f"- All items exactly once: {num(d.get('all_items_once'))}; {kv(r)}."]


def checkpoint_pause(d: Doc) -> list[str]:
    rows = []
    for kind, m in (d.get("median") or {}).items():
        rows.append(
            [
                kind,
                ms(m.get("pause_s"), 1),
                ms(m.get("locked_s"), 1),
                num(m.get("save_s")),
                num(m.get("bytes_written"), 0, scale=1e-6),
                f"{num(m.get('segments_written'))} / {num(m.get('segments_reused'))} / {num(m.get('segments_linked'))}",
                f"{ms(m.get('put_max_during_save_s'), 1)} / {ms(m.get('get_max_during_save_s'), 1)}",
                f"{ms(m.get('put_max_idle_s'), 1)} / {ms(m.get('get_max_idle_s'), 1)}",
                num(m.get("puts_during_save")),
            ]
        )
    head = [
        "save",
        "lock held, longest ms",
        "lock held, all holds ms",
        "whole save s",
        "MB written",
        "segments written / reused / linked",
        "longest put / sample during the save ms",
        "idle put / sample ms",
        "puts during the save",
    ]
    return [f"- Buffer {num(d.get('gib'))} GiB; medians over the repeats.", ""] + table(head, rows)


def autotune(d: Doc) -> list[str]:
    """Per item size: the best measured configuration, the model's ranking, the tuner's pick and cost."""
    rows = []
    for r in rows_of(d):
        a, w = r.get("auto") or {}, get(r, "auto", "work") or {}
        rows.append(
            [
                num(r.get("item_bytes")),
                f"{get(r, 'best_measured', 'config') or DASH}: {ms(get(r, 'best_measured', 'seconds'))}",
                f"{get(r, 'predicted_best', 'config') or DASH}: {ms(get(r, 'predicted_best', 'measured_seconds'))}",
                f"{num(r.get('kendall_tau'))} / {num(r.get('kendall_tau_unseen_configs'))}",
                f"{num(r.get('kendall_tau_split_halves'))} / {num(r.get('kendall_tau_between_rounds'))}",
                f"{num(r.get('top8_overlap'))}/8",
                str(a.get("config", DASH)),
                f"{pct(a.get('gap_to_best_grid'), sign=True)} / {pct(a.get('gap_to_best_confirmed'), sign=True)}",
                f"{num(a.get('measured_by_tuner'))} × {num(a.get('repeats'))}",
                pct(a.get("tuning_share_of_100_iterations")),
                f"{num(w.get('puts'))} / {num(w.get('gets'))} / {num(w.get('items_in'))} / {num(w.get('items_out'))}",
            ]
        )
    head = [
        "bytes / item",
        "best measured: ms / iteration",
        "model's best: measured ms",
        "Kendall τ all / unseen",
        "τ half vs half / between rounds",
        "top-8 overlap",
        "`auto` pick",
        "`auto` vs best: grid / re-measured",
        "tuner probes × repeats",
        "tuning share of 100 iterations",
        "work per iteration: puts / gets / items in / out",
    ]
    settings = kv({k: d.get(k) for k in ("iterations_per_config", "rounds", "warmup")})
    return (
        [f"- Settings: {settings}.", ""]
        + table(head, rows)
        + ["", f"- Summary: {kv(d.get('summary') or {})}."]
    )


def autotune_dqn(d: Doc) -> list[str]:
    """The DQN plugin's grid and its ``overlap="auto"`` run, one row."""
    r, a = d.get("row") or {}, get(d, "row", "auto") or {}
    head = [
        "workload, batch",
        "best measured: ms / learning step",
        "model's best: measured ms",
        "Kendall τ / half vs half / between rounds",
        "top-8 overlap",
        "`auto` pick",
        "`auto` vs best: grid / re-measured",
        "tuning: learning steps, share of 100 steps / of 100 iterations",
        "same work in every configuration",
    ]
    row = [
        f"{r.get('workload', DASH)}, {num(r.get('batch'))}",
        f"{get(r, 'best_measured', 'config') or DASH}: {ms(get(r, 'best_measured', 'seconds'))}",
        f"{get(r, 'predicted_best', 'config') or DASH}: {ms(get(r, 'predicted_best', 'measured_seconds'))}",
        f"{num(r.get('kendall_tau'))} / {num(r.get('kendall_tau_split_halves'))} / {num(r.get('kendall_tau_between_rounds'))}",
        f"{num(r.get('top8_overlap'))}/8",
        str(a.get("config", DASH)),
        f"{pct(a.get('gap_to_best_grid'), sign=True)} / {pct(a.get('gap_to_best_confirmed'), sign=True)} "
        f"({ms(get(a, 'confirmed', 'seconds', 'pick'))} vs {ms(get(a, 'confirmed', 'seconds', 'best'))} ms)",
        f"{num(a.get('tuning_learning_steps'))}, {pct(a.get('tuning_share_of_100_steps'), 2)} / "
        f"{pct(a.get('tuning_share_of_100_iterations'), 4)}",
        num(r.get("same_work")),
    ]
    settings = kv({k: d.get(k) for k in ("learning_steps_per_config", "warmup_steps", "rounds")})
    return [f"- Settings: {settings}.", ""] + table(head, [row])


def scaling(d: Doc) -> list[str]:
    """The modelled strong scaling (and, when present, measured rows): per scale and design."""
    by: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows_of(d):
        if r.get("kind", "modelled") == "modelled":
            by[str(r.get("system")), int(r.get("gpus") or 0)] = r
    systems = sorted({s for s, _ in by})
    gpus = sorted({g for _, g in by})
    head = ["GPUs (kind)"]
    for s in systems:
        head += [f"{s}: iteration s", f"{s}: data path s (share)"]
    over = (d.get("summary") or {}).get("conduit_over_tq_iteration") or {}
    ok = validated(d)
    head.append("conduit ÷ tq_simplestorage iteration" + ("" if ok else " (not validated)"))
    rows = []
    for g in gpus:
        kind = next((str(by[s, g].get("kind")) for s in systems if (s, g) in by), DASH)
        cells = [f"{num(g)} ({kind})"]
        for s in systems:
            r = by.get((s, g)) or {}
            cells += [
                num(r.get("predicted_s"), 1),
                f"{num(r.get('data_path_s'), 2)} ({pct(r.get('data_path_share'))})",
            ]
        cells.append(num(over.get(str(g)), 3))
        rows.append(cells)
    summary = d.get("summary") or {}
    sat = d.get("saturation") or {}
    out = verdict_lines(d) + table(head, rows) + [""]
    out.append(
        f"- Target ({summary.get('target', DASH)}): "
        f"{verdict(summary.get('met')) if ok else 'not judged: the modelled scale is not validated'}; "
        f"Conduit's worst share {pct(summary.get('conduit_worst_share'))} at "
        f"{num(summary.get('conduit_worst_at_gpus'))} GPUs."
    )
    for s, v in sat.items():
        if isinstance(v, dict):
            out.append(f"- {s} saturates at {num(v.get('saturates_at_gpus'))} GPUs ({v.get('rule', '')}).")
    sens = (d.get("sensitivity") or {}).get("data_path_share") or {}
    if sens:
        parts = [f"{k}: " + ", ".join(f"{s} {pct(x)}" for s, x in v.items()) for k, v in sens.items()]
        out.append(
            f"- Sensitivity at {num((d.get('sensitivity') or {}).get('gpus'))} GPUs: "
            + "; ".join(parts)
            + "."
        )
    calls = (d.get("validation") or {}).get("per_call") or []
    if calls:
        within = sum(1 for c in calls if c.get("within"))
        out.append(
            f"- Validation, per call ({(d.get('validation') or {}).get('per_call_source', DASH)}): "
            f"{within} of {len(calls)} within ±25%."
        )
    for a in d.get("assumptions") or []:
        out.append(f"- Assumption: {a}.")
    return out + scaling_measured(d)


def scaling_measured(d: Doc) -> list[str]:
    """``scaling.py --measure``'s rows (1-8 Ray nodes on this machine) and the model's validation against them."""
    measured = [r for r in rows_of(d) if r.get("kind") == "measured"]
    v = d.get("validation") or {}
    if not measured:
        return ["", f"- Measured: {v.get('per_iteration_note', 'none')}."]
    head = ["nodes", "system", "data path s/iteration (p50 over iterations)", "model s", "controller round trips (s)",
            "bytes across nodes", "per call p50 / p99 ms"]  # fmt: skip
    rows = []
    for r in sorted(measured, key=lambda r: (r.get("nodes") or 0, str(r.get("system")))):
        calls = r.get("per_call_s") or {}
        per_call = "; ".join(f"{op} {ms(c.get('p50'), 1)} / {ms(c.get('p99'), 1)}" for op, c in calls.items())
        trips = f"{num(r.get('controller_requests'), 0)} ({num(r.get('controller_request_s'), 3)})"
        if str(r.get("system")).startswith("rllib"):
            ratio = r.get("ratio_exposed")
            per_call = f"exposed / wall {pct(r.get('data_path_share'))}" + (
                f"; conduit ÷ native exposed {num(ratio, 3)}, wall {num(r.get('ratio_wall'), 3)}"
                if ratio is not None
                else (f"; ratio refused: {r['ratio_refused']}" if r.get("ratio_refused") else "")
            )
            trips = DASH
        rows.append([num(r.get("nodes"), 0), str(r.get("system")), num(r.get("measured_s"), 3),
                     num(r.get("predicted_s"), 3), trips, num(r.get("cross_node_bytes"), 0), per_call])  # fmt: skip
    out = [
        "",
        f"Measured on this machine ({(d.get('measured') or {}).get('setup', {}).get('caveat', '')}):",
        "",
    ]
    out += table(head, rows) + [""]
    for name, key in (
        ("per iteration", "per_iteration"),
        ("per call (driver, out of sample)", "per_call_measured"),
    ):
        tab = v.get(key) or []
        if not tab:
            continue
        before = " on the defaults (before the fit below)" if v.get("refit") else ""
        out.append(f"Validation {name}{before}: {(v.get('verdict') or {}).get(key.removesuffix('_measured'), DASH)} "
                   f"({v.get('target', '±25%')}).")  # fmt: skip
        out += ["", *validation_table(tab), ""]
    refit = v.get("refit") or {}
    if refit:
        vd = v.get("verdict") or {}
        out.append(f"One calibration, fitted on {refit.get('fit_nodes', DASH)} nodes only ({refit.get('source', DASH)}; "
                   f"offpath_s {ms(refit.get('offpath_s'), 2)} ms); the model above runs on it (the defaults' share at "
                   "the largest scale is in the sensitivity line). Validation: per call held out "
                   f"{vd.get('refit_per_call_held_out', DASH)}, per iteration held out "
                   f"{vd.get('refit_per_iteration_held_out', DASH)}, per iteration (all) "
                   f"{vd.get('refit_per_iteration', DASH)}.")  # fmt: skip
        tabs = (refit.get("per_call_held_out") or []) + (refit.get("per_iteration") or [])
        out += ["", *validation_table(tabs), ""]
        out += offpath_line(refit)
    ratios = (d.get("measured") or {}).get("ratios") or {}
    if ratios:
        out.append("- Conduit ÷ SimpleStorage data path, measured: " + ", ".join(
            f"{n} node(s) {num(x.get('ratio'), 3) if x.get('ratio') is not None else 'refused'}" for n, x in ratios.items()
        ) + ".")  # fmt: skip
    return out


def validation_table(tab: list[dict[str, Any]]) -> list[str]:
    """The model's predictions against measured calls or iterations (``scaling_validate``'s tables)."""
    vh = ["system", "nodes", "op / samples / bytes", "predicted s", "measured s", "ratio", "within ±25%"]
    return table(vh, [[str(t.get("system")), num(t.get("nodes"), 0),
                       " / ".join(str(t[k]) for k in ("op", "samples", "bytes") if k in t) or "iteration",
                       num(t.get("predicted_s"), 4), num(t.get("measured_s"), 4), num(t.get("ratio"), 3),
                       verdict(t.get("within"))] for t in tab])  # fmt: skip
