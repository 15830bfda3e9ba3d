"""What a ``tq_backends.py`` run prints and draws: the table of GB/s per cell and op (SimpleStorage once per
unit count), the targets' verdicts, and the figure (bars per system, memcpy references as ticks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import script
from tq_analysis import cells_of, find, simple_units
from tq_worker import MIB


def columns_of(rows: list[dict], systems: list[str]) -> list[tuple[str, str, int | None]]:
    """(heading, system, units) per column: SimpleStorage once per unit count swept."""
    cols: list[tuple[str, str, int | None]] = []
    for s in systems:
        if s == "SimpleStorage":
            cols += [(f"Simple u={u}", s, u) for u in simple_units(rows)]
        elif any(r["system"] == s for r in rows):
            cols.append((s, s, None))
    return cols


def format_table(rows: list[dict], systems: list[str]) -> str:
    cols = columns_of(rows, systems)
    head = ["nodes", "samples x tokens", "MiB", "op", *[f"{h} GB/s" for h, _, _ in cols], "clone GB/s",
            "copy_ GB/s", "Conduit/Simple(best u)", "Conduit/copy_", "Conduit mapped %",
            "Conduit TQ-client ms"]  # fmt: skip
    lines = []
    for nodes, b, t in cells_of(rows):
        memcpy = find(rows, "memcpy", "copy", nodes, b, t)
        into = find(rows, "memcpy", "copy_into", nodes, b, t)
        for op in ("put", "get"):
            got = [find(rows, s, op, nodes, b, t, u) for _, s, u in cols]
            if not any(got):
                continue
            anyrow = next(r for r in got if r)
            c, s = find(rows, "Conduit", op, nodes, b, t), find(rows, "SimpleStorage", op, nodes, b, t)
            share = (c.get("conduit_path_bytes") or {}).get("mapped_share") if c else None
            lines.append([
                str(nodes), f"{b} x {t}", f"{anyrow['bytes'] / MIB:.1f}", op,
                *[f"{x['gb_per_s']:.3f}" if x else "-" for x in got],
                f"{memcpy['gb_per_s']:.2f}" if memcpy else "-",
                f"{into['gb_per_s']:.2f}" if into else "-",
                f"{c['gb_per_s'] / s['gb_per_s']:.2f}x (u={s['storage_units']})" if c and s else "-",
                f"{c['gb_per_s'] / into['gb_per_s']:.0%}" if c and into else "-",
                f"{share:.0%}" if share is not None else "-",
                f"{c['client_seconds'] * 1e3:.1f}" if c and c.get("client_seconds") is not None else "-",
            ])  # fmt: skip
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*head), fmt.format(*["-" * w for w in widths]), *(fmt.format(*x) for x in lines)]
    )


def format_targets(targets: dict[str, dict]) -> str:
    out = []
    for t in targets.values():
        verdict = "n/a (no cells)" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        cells = ", ".join(
            f"{c['samples']}x{c['tokens_per_sample']}: {c['ratio']:.2f}"
            + (f" (u={c['simplestorage_units']})" if "simplestorage_units" in c else "")
            + (f" (bound {c['bound']:.2f})" if "bound" in c else "")
            for c in t["cells"]
        )
        out.append(f"  [{verdict}] {t['rule']}" + (f"\n         ratios: {cells}" if cells else ""))
    return "\n".join(out)


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
