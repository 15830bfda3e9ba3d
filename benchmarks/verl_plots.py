"""PNGs of the verl CPU benchmark: stage breakdown per system, and a reward curve."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

PARTS = ("gen_busy", "gen_wait_exposed", "ingest_exposed", "update_critic", "update_actor", "update_weights")


def stage_bars(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """One stacked bar per system: median of each part; 'other' fills up to the median wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, system in enumerate(systems):
        mine = [r for r in rows if r["system"] == system]
        bottom = 0.0
        for j, part in enumerate((*PARTS, "other")):
            if part == "other":
                wall = statistics.median(r["wall_s"] for r in mine)
                value = max(0.0, wall - bottom)
            else:
                value = statistics.median(r["stages"].get(part, 0.0) for r in mine)
            ax.bar(i, value, bottom=bottom, color=f"C{j}", label=part if i == 0 else None)
            bottom += value
    ax.set_xticks(range(len(systems)), systems, rotation=15)
    ax.set_ylabel("seconds per iteration (median)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def reward_curve(steps: list[int], scores: list[float], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, scores, marker=".")
    ax.set_xlabel("iteration")
    ax.set_ylabel("critic/score/mean")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
