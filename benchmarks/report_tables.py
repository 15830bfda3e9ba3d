"""Renderers for ``report.py``: one results JSON (or a few) -> one markdown table and its target lines.

Each renderer takes the parsed JSON (``{}`` where the file is missing) and returns lines. It shows
what the JSON holds: counters, medians (best round or spread where recorded), the ratios the JSON
computed or the reason it refused one, and targets as recorded. Missing fields render as ``—``.
"""

from __future__ import annotations

from typing import Any

from report_fmt import DASH, Refusals, both, get, kv, ms, num, pct, rows_of, table, targets, times

Doc = dict[str, Any]
PEERS = {"torchrl": "TorchRL", "rllib": "RLlib"}


def buffer_throughput(d: Doc) -> list[str]:
    """Per batch × dim: Conduit's prioritized sample + update, each peer's ratio per operation."""
    ratios, refusals = rows_of(d, "ratios"), Refusals()
    conduit = {
        (r.get("batch"), r.get("dim")): r
        for r in rows_of(d)
        if (r.get("system"), r.get("op"), r.get("sampler"), r.get("load"))
        == ("conduit", "sample", "prioritized", False)
    }
    loaded = {
        (r.get("batch"), r.get("dim")): r.get("loaded_over_idle")
        for r in rows_of(d, "load_ratios")
        if (r.get("system"), r.get("op"), r.get("sampler")) == ("conduit", "sample", "prioritized")
    }

    def peers(op: str, sampler: str, batch: int, dim: int) -> str:
        parts = []
        for peer, label in PEERS.items():
            mine = [
                r
                for r in ratios
                if (r.get("op"), r.get("sampler"), r.get("batch"), r.get("dim"), r.get("peer"))
                == (op, sampler, batch, dim, peer)
            ]
            equal = [r for r in mine if r.get("refused") is None]
            if equal:
                r = equal[0]
                vs = "" if r.get("conduit_system") == "conduit" else f" (vs {r.get('conduit_system')})"
                parts.append(f"{label}{vs} {times(r.get('ratio_median'))} [{times(r.get('ratio_best'))}]")
            elif mine:
                parts.append(f"{label} {refusals.cell(mine[0].get('refused'))}")
        return "; ".join(parts) or DASH

    rows = []
    for (batch, dim), r in sorted(conduit.items()):
        work = r.get("work") or {}
        rows.append(
            [
                str(batch),
                str(dim),
                f"{num(work.get('transitions'))} / {num(work.get('bytes'))} B",
                f"{num(r.get('us_per_call_median'), 1)} [{num(r.get('us_per_call_best'), 1)}]",
                peers("sample", "prioritized", batch, dim),
                peers("sample", "uniform", batch, dim),
                peers("insert", "prioritized", batch, dim),
                times(loaded.get((batch, dim))),
            ]
        )
    head = [
        "batch",
        "dim",
        "work: transitions / bytes",
        "Conduit µs, prioritized sample + update, median [best]",
        "peer ÷ Conduit, prioritized sample + update, median [best]",
        "peer ÷ Conduit, uniform sample",
        "peer ÷ Conduit, insert (prioritized)",
        "Conduit loaded ÷ idle",
    ]
    return table(head, rows) + [""] + refusals.lines() + targets(d.get("targets"))


def rllib_iteration(d: Doc) -> list[str]:
    """Per workload: work on both sides, medians per iteration native → Conduit, ratios or refusal,
    and async Conduit's staleness."""
    refusals, rows = Refusals(), []
    for name, r in (d.get("ratios") or {}).items():
        nw, cw = r.get("native_work") or {}, r.get("conduit_work") or {}
        refused = r.get("ratio_refused")

        def ratio(key: str, r: dict[str, Any] = r, refused: Any = refused) -> str:
            return refusals.cell(refused) if refused else num(r.get(key), 3)

        def stale(x: Any) -> str:
            return (
                DASH
                if not isinstance(x, dict)
                else f"{num(x.get('median'), 0)} / {num(x.get('p90'))} / {num(x.get('max'))}"
            )

        rows.append(
            [
                name,
                f"{num(nw.get('env_steps_sampled'))} / {num(cw.get('env_steps_sampled'))}",
                f"{num(nw.get('gradient_updates'))} / {num(cw.get('gradient_updates'))}",
                f"{num(r.get('native_wall_s'))} → {num(r.get('conduit_wall_s'))}",
                ratio("ratio_wall"),
                f"{num(r.get('native_exposed_s'), 3)} → {num(r.get('conduit_exposed_s'), 3)}",
                ratio("ratio_exposed"),
                f"{num(r.get('native_wall_s_per_update'), 4)} → {num(r.get('conduit_wall_s_per_update'), 4)}",
                stale(r.get("conduit_priority_age_updates")),
                stale(r.get("conduit_staging_delay_transitions")),
            ]
        )
    head = [
        "workload",
        "env steps native / Conduit",
        "gradient updates native / Conduit",
        "wall s native → Conduit",
        "wall ratio",
        "exposed s native → Conduit",
        "exposed ratio",
        "wall s per update",
        "priority age, updates (median / p90 / max)",
        "staging delay, transitions (median / p90 / max)",
    ]
    settings = get(d, "machine", "settings") or {}
    return [f"- Settings: {kv(settings)}.", ""] + table(head, rows) + [""] + refusals.lines()


def rllib_convergence(d: Doc) -> list[str]:
    """Per system: seeds that reached the target, env steps to it per seed, per-iteration medians."""
    rows = []
    for system, s in (d.get("summary") or {}).items():
        steps = s.get("steps_to_target")
        rows.append(
            [
                system,
                f"{num(s.get('reached'))} / {num(s.get('runs'))}",
                " / ".join(num(x) for x in steps) if isinstance(steps, list) else DASH,
                "; ".join(
                    f"{num(get(r, 'work', 'env_steps_sampled'))} / {num(get(r, 'work', 'gradient_updates'))}"
                    for r in rows_of(d, "runs")
                    if r.get("system") == system
                )
                or DASH,
                num(s.get("median_steps_to_target"), 0),
                num(s.get("median_iteration_wall_s")),
                num(s.get("median_iteration_exposed_s"), 3),
                num(s.get("gradient_updates_per_env_step"), 3),
            ]
        )
    head = [
        "system",
        "reached",
        "env steps to target (per seed)",
        "work per seed: env steps / gradient updates",
        "median",
        "wall s / iteration",
        "exposed s / iteration",
        "gradient updates per env step",
    ]
    line = (
        f"Settings: {d.get('algo', DASH)} on {d.get('env', DASH)}, target mean return {num(d.get('target'), 0)}, "
        f"budget {num(d.get('max_env_steps'))} env steps, {num(d.get('seeds'))} seeds, quick={num(d.get('quick'))}."
    )
    return [f"- {line}", ""] + table(head, rows)


def overlap_executors(d: Doc) -> list[str]:
    rows = [
        [setup, ms(s.get("step_s"), 3), times(s.get("slowdown_vs_alone")), num(s.get("fragments_per_s"), 0)]
        for setup, s in (d.get("summary") or {}).items()
    ]
    return table(["setup", "learner step ms (median)", "slowdown vs alone", "fragments ingested / s"], rows)


def _config(r: dict[str, Any]) -> str:
    return f"depth {r.get('depth', DASH)}, g_ing {r.get('g_ing', DASH)}, g_del {r.get('g_del', DASH)}"


def granularity(d: Doc) -> list[str]:
    """The overlap sweep: sync against async per item size (the g_ing / g_del sweeps are in the PNG)."""
    by: dict[Any, dict[str, dict[str, Any]]] = {}
    for r in rows_of(d, "overlap"):
        by.setdefault((r.get("item_bytes"), r.get("batch"), r.get("dim")), {})[str(r.get("overlap"))] = r
    rows = []
    for (item, batch, dim), modes in by.items():
        s, a = modes.get("sync", {}), modes.get("async", {})
        w = s.get("work") or a.get("work") or {}
        rows.append(
            [
                num(item),
                f"{num(batch)} × {num(dim)}",
                f"{ms(s.get('seconds'))} ({_config(s)})",
                f"{ms(a.get('seconds'))} ({_config(a)})",
                f"{num(w.get('puts'))} / {num(w.get('gets'))} / {num(w.get('items_in'))} / {num(w.get('items_out'))}",
            ]
        )
    head = [
        "bytes / item",
        "batch × dim",
        "sync ms / iteration",
        "async ms / iteration",
        "work: puts / gets / items in / out",
    ]
    return [f"- Median over {num(d.get('iterations'))} iterations per point.", ""] + table(head, rows)


def tq_backends(d: Doc) -> list[str]:
    """Per cell: Conduit ÷ SimpleStorage at its best unit count (put, get), ÷ memcpy, GB/s, mapped share."""
    rows_by: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows_of(d):
        key = (r.get("nodes"), r.get("samples"), r.get("tokens_per_sample"))
        if r.get("system") == "Conduit" or (r.get("system") == "SimpleStorage" and r.get("best_of_units")):
            rows_by.setdefault(key, {})[f"{r['system']}/{r.get('op')}"] = r
    ratios: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows_of(d, "ratios"):
        ratios.setdefault((r.get("nodes"), r.get("samples"), r.get("tokens_per_sample")), {})[
            str(r.get("op"))
        ] = r

    def vs(r: dict[str, Any] | None) -> str:
        return (
            DASH
            if not r
            else f"{times(r.get('conduit_over_simplestorage'))} u={r.get('simplestorage_units', DASH)}"
        )

    def gbs(cell: dict[str, Any], system: str) -> str:
        return both(*(num(get(cell, f"{system}/{op}", "gb_per_s"), 3) for op in ("put", "get")))

    rows = []
    for key, rs in ratios.items():
        cell = rows_by.get(key, {})
        nbytes = get(cell, "Conduit/put", "bytes")
        rows.append(
            [
                num(key[0]),
                f"{num(key[1])} × {num(key[2])}",
                num(nbytes, 1, scale=2**-20),
                vs(rs.get("put")),
                vs(rs.get("get")),
                both(*(pct(get(rs, op, "conduit_over_memcpy"), 1) for op in ("put", "get"))),
                gbs(cell, "Conduit"),
                gbs(cell, "SimpleStorage"),
                both(
                    *(
                        pct(get(cell, f"Conduit/{op}", "conduit_path_bytes", "mapped_share"), 0)
                        for op in ("put", "get")
                    )
                ),
            ]
        )
    head = [
        "nodes",
        "samples × tokens",
        "MiB",
        "put: Conduit ÷ SimpleStorage (its best units)",
        "get: Conduit ÷ SimpleStorage",
        "Conduit ÷ memcpy put / get",
        "Conduit GB/s put / get",
        "SimpleStorage GB/s put / get (best units)",
        "mapped share put / get",
    ]
    units = [
        f"{u.get('nodes')} node(s) {u.get('op')} u={u.get('storage_units')}: {num(u.get('geomean_gb_per_s'), 3)}"
        for u in rows_of(d, "simplestorage_units")
    ]
    out = table(head, rows) + [""]
    if units:
        out += [
            "- SimpleStorage by unit count, geometric mean GB/s over the cells: " + "; ".join(units) + "."
        ]
    out += [f"- Skipped: {name}: {why}" for name, why in (d.get("skipped") or {}).items()]
    return out + targets(d.get("targets"))
