"""What a ``tq_backends.py`` run draws: bars of GB/s per system (SimpleStorage once per unit count) and
memcpy references as ticks; its table is ``report_tables.tq_backends``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import script
from tq_analysis import cells_of, find, simple_units


def columns_of(rows: list[dict], systems: list[str]) -> list[tuple[str, str, int | None]]:
    """(heading, system, units) per column: SimpleStorage once per unit count swept."""
    cols: list[tuple[str, str, int | None]] = []
    for s in systems:
        if s == "SimpleStorage":
            cols += [(f"Simple u={u}", s, u) for u in simple_units(rows)]
        elif any(r["system"] == s for r in rows):
            cols.append((s, s, None))
    return cols


def plot(rows: list[dict], systems: list[str], path: Path, title: str) -> None:
    plt = script.pyplot()
    phases = sorted({r["nodes"] for r in rows})
    fig, axes = plt.subplots(len(phases), 2, figsize=(14, 4.8 * len(phases)), squeeze=False)
    colors = {"RayStore": "tab:orange", "Conduit": "tab:green"}
    blues = {1: "lightsteelblue", 2: "tab:blue", 4: "navy"}
    for pi, nodes in enumerate(phases):
        cells = [(b, t) for n, b, t in cells_of(rows) if n == nodes]
        here = [r for r in rows if r["nodes"] == nodes]
        names = columns_of(here, systems)
        for oi, op in enumerate(("put", "get")):
            ax = axes[pi][oi]
            width = 0.8 / max(len(names), 1)
            for si, (label, s, u) in enumerate(names):
                ys = [(find(rows, s, op, nodes, b, t, u) or {}).get("gb_per_s", 0.0) for b, t in cells]
                xs = [i - 0.4 + width * (si + 0.5) for i in range(len(cells))]
                ax.bar(xs, ys, width, label=label, color=blues.get(u or 0) if u else colors.get(s))
            mc = [(find(rows, "memcpy", "copy", nodes, b, t) or {}).get("gb_per_s") for b, t in cells]
            if any(mc):
                ax.scatter(range(len(cells)), mc, marker="_", s=900, color="black", label="memcpy (clone)",
                           zorder=3)  # fmt: skip
            mi = [(find(rows, "memcpy", "copy_into", nodes, b, t) or {}).get("gb_per_s") for b, t in cells]
            if any(mi):
                ax.scatter(range(len(cells)), mi, marker="_", s=900, color="gray", linestyle="--",
                           label="memcpy (copy_ into preallocated)", zorder=3)  # fmt: skip
            ax.set_xticks(range(len(cells)), [f"{b}x{t}" for b, t in cells], rotation=30)
            ax.set_yscale("log")
            ax.set_ylabel("GB/s (payload / median seconds)")
            where = "same node" if nodes == 1 else f"cross node ({nodes}-node cluster, one machine)"
            ax.set_title(f"{op}: tq.kv_batch_{op} — {where}")
            ax.set_xlabel("samples x response tokens (lengths uniform in [L/2, L])")
            ax.grid(axis="y", alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.suptitle(title)
    script.save_figure(fig, path, rect=(0, 0.04, 1, 1))


def figure_title(result: dict[str, Any]) -> str:
    m = result["machine"]
    title = (
        f"TransferQueue backends via tq.kv_batch_put/get ({result['mode']}, {m['cpu_count']} cores, "
        f"{result['setup']['torch_threads']} torch thread(s), load {m['load_average_start'][0]:.1f}"
        f"->{m['load_average_end'][0]:.1f})"
    )
    for name, why in result["skipped"].items():
        title += f"\n{name} not shown: {why.splitlines()[0].split(' (')[0][:100]} (see 'skipped' in the JSON)"
    return title
