"""Iteration latency against the operator granularities ``g_ing`` and ``g_del``, and overlap on/off.

    python benchmarks/granularity.py [--quick] [--device cpu|cuda] [--out FILE]

The workload is ``autotune.py``'s loop (:class:`autotune_loop.SyntheticLoop`). Sweeps, median seconds
per iteration: ``g_ing`` in 1..16 (async, ``g_del`` 1, depth 2); ``g_del`` in 1..16 (sync and async,
``g_ing`` 4, depth ``2 * g_del``); overlap off (sync, ``g_del`` 1) against on (async, ``g_ing`` 4,
``g_del`` 2, depth 4) across item sizes. Rows carry their work counters. JSON and a three-panel PNG
under ``benchmarks/results/``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_tables  # noqa: E402
import script  # noqa: E402
from autotune_loop import EVAL_DIMS, FRAG, GETS, PUTS, SyntheticLoop  # noqa: E402

from conduit.costmodel import Knobs  # noqa: E402

SIZES = ((32, 64), (32, 2048), (128, 64), (128, 2048))  # (batch, dim)
GRAINS = (1, 2, 4, 8, 16)


def row(loop: SyntheticLoop, knobs: Knobs, iters: int, warmup: int) -> dict[str, Any]:
    seconds, _ = loop.run(knobs, iters, warmup)
    return {
        "batch": loop.batch,
        "dim": loop.dim,
        "item_bytes": loop.item_bytes,
        **knobs.__dict__,
        "seconds": seconds,
        "work": {"puts": PUTS, "gets": GETS, "items_in": PUTS * FRAG, "items_out": GETS * loop.batch},
    }


def plot(data: dict[str, list[dict[str, Any]]], path: Path) -> None:
    plt = script.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for batch, dim in dict.fromkeys((r["batch"], r["dim"]) for r in data["g_ing"]):
        pts = [r for r in data["g_ing"] if (r["batch"], r["dim"]) == (batch, dim)]
        axes[0].plot(
            [r["g_ing"] for r in pts], [r["seconds"] * 1e3 for r in pts], "o-", label=f"B={batch} d={dim}"
        )
        for mode, style in (("sync", "o-"), ("async", "s--")):
            pts = [r for r in data["g_del"] if (r["batch"], r["dim"], r["overlap"]) == (batch, dim, mode)]
            axes[1].plot(
                [r["g_del"] for r in pts],
                [r["seconds"] * 1e3 for r in pts],
                style,
                label=f"{mode} B={batch} d={dim}",
            )
    for mode in ("sync", "async"):
        pts = [r for r in data["overlap"] if r["overlap"] == mode]
        axes[2].plot([r["item_bytes"] for r in pts], [r["seconds"] * 1e3 for r in pts], "o-", label=mode)
    axes[0].set(title="async: latency vs g_ing", xlabel="g_ing (fragments per call)", ylabel="ms / iteration")
    axes[1].set(title="latency vs g_del", xlabel="g_del (batches per call)", ylabel="ms / iteration")
    axes[2].set(title="overlap off/on", xlabel="bytes per item", ylabel="ms / iteration", xscale="log")
    for ax in axes:
        ax.set_xscale("log", base=2) if ax is not axes[2] else None
        ax.legend(fontsize=6)
    script.save_figure(fig, path)


def main() -> None:
    parser = script.parser(__doc__.split("\n\n")[0], quick="few iterations and sizes (a check)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    token = provenance.start()
    torch.set_num_threads(1)
    iters, warmup = (4, 1) if args.quick else (25, 3)
    sizes = SIZES[:2] if args.quick else SIZES
    data: dict[str, list[dict[str, Any]]] = {"g_ing": [], "g_del": [], "overlap": []}
    for batch, dim in sizes:
        loop = SyntheticLoop(dim, batch, args.device)
        for g in GRAINS:
            data["g_ing"].append(row(loop, Knobs("async", 2, g, 1), iters, warmup))
            for mode in ("sync", "async"):
                data["g_del"].append(row(loop, Knobs(mode, 2 * g, 4, g), iters, warmup))
        best_ing = min(
            (r for r in data["g_ing"] if r["dim"] == dim and r["batch"] == batch), key=lambda r: r["seconds"]
        )
        print(f"B={batch:4} d={dim:5}: best g_ing {best_ing['g_ing']} ({best_ing['seconds'] * 1e3:.2f} ms)")
    for dim in EVAL_DIMS:
        loop = SyntheticLoop(dim, 32, args.device)
        off = row(loop, Knobs("sync", 2, 1, 1), iters, warmup)
        on = row(loop, Knobs("async", 4, 4, 2), iters, warmup)
        data["overlap"] += [off, on]
    record = {
        "iterations": iters,
        **data,
        "machine": script.machine(token, device=args.device, torch_threads=1),
    }
    script.write_result("granularity", args, record, lambda png: plot(data, png), report_tables.granularity)


if __name__ == "__main__":
    main()
