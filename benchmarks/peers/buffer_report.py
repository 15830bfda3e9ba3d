"""The PNG plots of the rows (the table is ``report_tables.buffer_throughput``, printed by the script too)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import script
from analysis import MAX_LOADED_OVER_IDLE, index_rows

SYSTEMS = ("conduit", "conduit_dqn", "torchrl", "rllib", "memcpy")
PANELS = (("sample", "prioritized"), ("sample", "uniform"), ("insert", "prioritized"), ("insert", "uniform"))
COLORS = {
    "conduit": "tab:blue",
    "conduit_dqn": "tab:cyan",
    "torchrl": "tab:orange",
    "rllib": "tab:red",
    "memcpy": "tab:gray",
}


def plot(rows: list[Mapping[str, Any]], path: Path, title: str) -> None:
    """Grouped bars of median-round items/s (log scale), best round as a tick, per cell and system."""
    plt = script.pyplot()
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
    script.save_figure(fig, path, rect=(0, 0, 1, 0.98))


def plot_load(load_ratios: list[Mapping[str, Any]], path: Path, title: str) -> None:
    """Bars of loaded ÷ idle median call time per cell and system, with the 1.5x limit drawn."""
    plt = script.pyplot()
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
    script.save_figure(fig, path)
