"""Human-facing output: the console table and the PNG plot of the rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from analysis import MAX_LOADED_OVER_IDLE, compute_ratios, index_rows

SYSTEMS = ("conduit", "conduit_dqn", "torchrl", "rllib", "memcpy")
PANELS = (("sample", "prioritized"), ("sample", "uniform"), ("insert", "prioritized"), ("insert", "uniform"))
COLORS = {
    "conduit": "tab:blue",
    "conduit_dqn": "tab:cyan",
    "torchrl": "tab:orange",
    "rllib": "tab:red",
    "memcpy": "tab:gray",
}


def _fmt_us(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return "-"
    return f"{r['us_per_call_median']:.1f}/{r['us_per_call_best']:.1f}"


def format_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """One line per cell: median/best µs per call per system, and each peer's equal-work ratio (median,
    best); the JSON's ``ratios`` also lists every refused pairing with its reason."""
    by = index_rows(rows)
    systems = [s for s in SYSTEMS if s in by]
    keys = sorted(
        {k for rows_ in by.values() for k in rows_}, key=lambda k: (k[0] != "sample", k[1], k[3], k[2])
    )
    ratios: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in compute_ratios(rows):
        ratios.setdefault((r["op"], r["sampler"], r["batch"], r["dim"]), []).append(r)
    head = f"{'op':<7}{'sampler':<12}{'batch':>6}{'dim':>7} | " + "".join(f"{s:>18}" for s in systems)
    head += " | peer / conduit, median round (best round)"
    lines = [
        "us per call, median round / best round; a ratio only where the two did equal work",
        head,
        "-" * len(head),
    ]
    for k in keys:
        line = f"{k[0]:<7}{k[1]:<12}{k[2]:>6}{k[3]:>7} | " + "".join(
            f"{_fmt_us(by[s].get(k)):>18}" for s in systems
        )
        parts = []
        for peer in dict.fromkeys(r["peer"] for r in ratios.get(k, [])):
            mine = [r for r in ratios[k] if r["peer"] == peer]
            equal = [r for r in mine if not r["refused"]]
            for r in equal:  # the equal-work ratio; a refused pairing only where there is none
                parts.append(
                    f"{peer}/{r['conduit_system']} {r['ratio_median']:.2f}x ({r['ratio_best']:.2f}x)"
                )
            if not equal:
                parts.append(f"{peer}/{'|'.join(r['conduit_system'] for r in mine)} refused (unequal work)")
        lines.append(line + " | " + "; ".join(parts))
    return "\n".join(lines)


def format_load_table(load_ratios: Iterable[Mapping[str, Any]]) -> str:
    """One line per (system, cell): median us per call idle, with the other cores busy, and the ratio."""
    head = f"{'system':<9}{'op':<7}{'sampler':<12}{'batch':>6}{'dim':>7} | {'idle us':>10}{'loaded us':>11}{'ratio':>8}"
    lines = ["median us per call, idle vs other cores busy (--load)", head, "-" * len(head)]
    for c in load_ratios:
        lines.append(
            f"{c['system']:<9}{c['op']:<7}{c['sampler']:<12}{c['batch']:>6}{c['dim']:>7} | "
            f"{c['idle_us_median']:>10.1f}{c['loaded_us_median']:>11.1f}{c['loaded_over_idle']:>8.2f}"
        )
    return "\n".join(lines)


def format_targets(targets: Iterable[Mapping[str, Any]]) -> str:
    """One line per target: PASS / FAIL / NOT EVALUATED and its key numbers."""
    lines = []
    for t in targets:
        verdict = {True: "PASS", False: "FAIL", None: "NOT EVALUATED"}[t["passed"]]
        detail = ""
        if "cells" in t:
            parts = []
            for c in t["cells"]:
                if "ratio" in c and c["ratio"] is None:
                    parts.append(f"B={c['batch']} dim={c['dim']}: refused (unequal work)")
                elif "ratio" in c:
                    parts.append(
                        f"B={c['batch']} dim={c['dim']}: {c['ratio']:.1f}x (best round {c['ratio_best_round']:.1f}x)"
                    )
                elif "loaded_over_idle" in c:
                    parts.append(
                        f"{c['sampler'][:4]} B={c['batch']} dim={c['dim']}: {c['loaded_over_idle']:.2f}x"
                    )
                elif c.get("counts_for_target"):
                    parts.append(f"B={c['batch']}: {c['fraction']:.0%}")
            detail = "; ".join(parts)
        elif "overhead_us" in t:
            icpt = t["intercept_us"]
            detail = (
                f"dim {t['dim']}: {t['call_us']:.1f} us call - {t['gather_us']:.1f} us gather = {t['overhead_us']:.1f} us"
                + (f" (intercept {icpt:.1f} us)" if icpt is not None else "")
            )
        elif "reason" in t:
            detail = t["reason"]
        lines.append(f"[{verdict}] {t['target']}: {detail}")
    return "\n".join(lines)


def plot(rows: list[Mapping[str, Any]], path: str, title: str) -> None:
    """Grouped bars of median-round items/s (log scale), best round as a tick, per cell and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = index_rows(rows)
    systems = [s for s in SYSTEMS if s in by]
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(13, 4.2 * len(PANELS)))
    for ax, (op, sampler) in zip(axes, PANELS):
        keys = sorted(
            {k for s in systems for k in by[s] if k[:2] == (op, sampler)}, key=lambda k: (k[3], k[2])
        )
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            xs = [j + (i - (len(systems) - 1) / 2) * width for j, k in enumerate(keys) if k in by[s]]
            ys = [by[s][k]["items_per_s_median"] for k in keys if k in by[s]]
            best = [by[s][k]["items_per_s_best"] for k in keys if k in by[s]]
            ax.bar(xs, ys, width, label=s, color=COLORS.get(s))
            ax.scatter(xs, best, marker="_", color="k", s=40, zorder=3)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"B={k[2]}\ndim={k[3]}" for k in keys], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("items/s (bar: median round, tick: best)")
        label = "sample + priority update" if (op, sampler) == ("sample", "prioritized") else op
        ax.set_title(f"{label} ({sampler})")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(systems))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_load(load_ratios: list[Mapping[str, Any]], path: str, title: str) -> None:
    """Bars of loaded ÷ idle median call time per cell and system, with the 1.5x limit drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in SYSTEMS if any(c["system"] == s for c in load_ratios)]
    keys = sorted({(c["op"], c["sampler"], c["dim"], c["batch"]) for c in load_ratios})
    by = {(c["system"], (c["op"], c["sampler"], c["dim"], c["batch"])): c for c in load_ratios}
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(keys) + 3), 5))
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        xs = [j + (i - (len(systems) - 1) / 2) * width for j, k in enumerate(keys) if (s, k) in by]
        ys = [by[(s, k)]["loaded_over_idle"] for k in keys if (s, k) in by]
        ax.bar(xs, ys, width, label=s, color=COLORS.get(s))
    ax.axhline(MAX_LOADED_OVER_IDLE, color="k", ls="--", lw=1, label=f"{MAX_LOADED_OVER_IDLE:g}x limit")
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{k[0]} {k[1][:4]}\nB={k[3]} d={k[2]}" for k in keys], fontsize=7, rotation=90)
    ax.set_yscale("log")
    ax.set_ylabel("median call time, other cores busy / idle")
    ax.set_title(title)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
