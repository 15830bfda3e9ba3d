"""PNGs of the verl CPU benchmark: stage breakdown per system, a reward curve, the paced sweep."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import script

PARTS = ("gen_busy", "gen_wait_exposed", "ingest_exposed", "update_critic", "update_actor", "update_weights")


def stage_bars(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    """One stacked bar per system: median of each part; 'other' fills up to the median wall time."""
    plt = script.pyplot()
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
    _finish(fig, ax, out, title, legend_size=7)


def rollout_title(rollout: str, tail: float | None = None, R: float | None = None) -> str:
    """How a figure's title names the rollout its rows ran on (their ``rollout``; a paced one with its
    ``tail`` and ``R`` where given): paced is a model of separate hardware and says so."""
    if rollout == "paced":
        model = ", ".join(f"{k} {v:g}" for k, v in (("tail", tail), ("R", R)) if v is not None)
        return "PACED rollout (modelled generation)" + (f", {model}" if model else "")
    return {"vllm": "vLLM rollout (vLLM's CPU build)", "hf": "hf rollout"}.get(rollout, f"{rollout} rollout")


def paced_sweep(sweep_ratios: dict[str, dict[str, Any]], out: Path, algo: str) -> None:
    """Speed-up of conduit over verl_sync_tuned (median wall ratio, inverted) against the response
    length tail, one line per R; paced rollout (modelled generation), labelled as such."""
    plt = script.pyplot()
    lines: dict[float, list[tuple[float, float]]] = {}
    for point, ratios in sweep_ratios.items():
        tail, r = (float(kv.split("=")[1]) for kv in point.split(","))
        if wall := ratios.get("wall/conduit_over_verl_sync_tuned"):
            lines.setdefault(r, []).append((tail, 1.0 / wall))
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (r, pts) in enumerate(sorted(lines.items())):
        pts.sort()
        ax.plot([t for t, _ in pts], [v for _, v in pts], marker="o", color=f"C{i}", label=f"R = {r:g}")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log", base=2)
    tails = sorted({t for pts in lines.values() for t, _ in pts})
    ax.set_xticks(tails, [f"{t:g}" for t in tails])
    ax.set_xlabel("response length tail (p99 / median)")
    ax.set_ylabel("speed-up, wall (verl_sync_tuned / conduit)")
    title = f"verl 0.9.1 CPU {algo}: conduit vs verl sync (poll-tuned)\nPACED rollout: modelled separate generation hardware"
    _finish(fig, ax, out, title, legend_size=8)


def reward_curve(curves: dict[str, list[tuple[int, float]]], out: Path, title: str, window: int = 10) -> None:
    """Mean score per iteration for each system (faint) and its ``window``-iteration moving mean."""
    plt = script.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (system, points) in enumerate(curves.items()):
        steps = [s for s, _ in points]
        scores = [v for _, v in points]
        ax.plot(steps, scores, color=f"C{i}", alpha=0.3, linewidth=0.8)
        smooth = [
            sum(scores[max(0, j - window + 1) : j + 1]) / len(scores[max(0, j - window + 1) : j + 1])
            for j in range(len(scores))
        ]
        style = ("-", "--", ":")[i % 3]  # identical runs overlap exactly: keep each visible
        ax.plot(steps, smooth, color=f"C{i}", linestyle=style, label=f"{system} ({window}-iteration mean)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("critic/score/mean")
    _finish(fig, ax, out, title, legend_size=8)


def _finish(fig: Any, ax: Any, out: Path, title: str, legend_size: int) -> None:
    """Title, legend, save as PNG, close."""
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    script.save_figure(fig, out)
