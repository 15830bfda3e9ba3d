"""What the benchmark scripts do alike: their command line, their figures and their result file.

Scripts import it as they import ``provenance`` (``benchmarks/`` on ``sys.path``)::

    args = script.parser(__doc__, quick="few iterations (a check)").parse_args()
    token = provenance.start()
    ...
    record = {"iterations": iters, **data, "machine": script.machine(token)}
    # writes the JSON and the figure, prints the table BENCHMARKS.md shows and what it wrote
    out = script.write_result("granularity", args, record, lambda png: plot(data, png), report_tables.granularity)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import provenance

RESULTS = Path(__file__).resolve().parent / "results"
K = TypeVar("K")
V = TypeVar("V")


def parser(doc: str | None, quick: str, out: Path | None = None) -> argparse.ArgumentParser:
    """A benchmark's command line: ``doc`` as its description (laid out as written), ``--quick`` (``quick``
    says what it shortens) and ``--out``, the result JSON (default ``out``; None: the script's file
    under ``benchmarks/results``, see :func:`write_result`)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=quick)
    where = out if out is not None else "benchmarks/results/<benchmark>[_quick].json"
    p.add_argument("--out", type=Path, default=out, help=f"result JSON (default {where})")
    return p


def facts(**extra: Any) -> dict[str, Any]:
    """The machine: CPUs, platform, Python, torch's and Ray's versions where the run imported them, then
    ``extra`` (settings, package versions)."""
    out: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    out["python"] = platform.python_version()
    out |= {m: sys.modules[m].__version__ for m in ("torch", "ray") if m in sys.modules}
    return {**out, **extra}


def machine(token: provenance.Start, **extra: Any) -> dict[str, Any]:
    """A result's ``machine`` record: :func:`facts` (with ``extra``), then ``provenance.finish(token)``."""
    return {**facts(**extra), **provenance.finish(token)}


def version(dist: str) -> str | None:
    """An installed distribution's version (``importlib.metadata``), or None where it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ('unknown' where unavailable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def show(lines: list[str]) -> None:
    """Print a report renderer's lines (``report_*.py``): the console shows the table BENCHMARKS.md shows."""
    print("\n".join(lines), flush=True)


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """``fn`` as a step of :func:`interleaved`: it returns the seconds one call took."""

    def step() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return step


def interleaved(steps: Mapping[K, Callable[[], V]], rounds: int, rng: random.Random) -> dict[K, list[V]]:
    """What each step returned (its seconds, or whatever it measured; :func:`timed` wraps a plain call)
    in each of ``rounds`` rounds, the steps round-robin in a fresh random order each round, so that a
    change of the machine's load falls on every step alike."""
    out: dict[K, list[V]] = {name: [] for name in steps}
    for _ in range(rounds):
        order = list(steps)
        rng.shuffle(order)
        for name in order:
            out[name].append(steps[name]())
    return out


def pyplot() -> Any:
    """matplotlib's ``pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110, rect: tuple[float, ...] | None = None) -> None:
    """Lay ``fig`` out (inside ``rect``, figure fractions, if given), write it to ``path`` and close it."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def write_result(
    name: str,
    args: argparse.Namespace,
    record: dict[str, Any],
    plot: Callable[[Path], None],
    table: Callable[[dict[str, Any]], list[str]] | None = None,
) -> Path:
    """Write ``{"benchmark": name, "quick": args.quick, **record}`` to ``args.out`` (default
    ``benchmarks/results/<name>[_quick].json``) and its figure beside it (``plot(<out>.png)``), print the
    table BENCHMARKS.md shows of it (``table``, a ``report_*.py`` renderer, given the written record) and
    what was written."""
    out: Path = args.out or RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, "quick": args.quick, **record}
    out.write_text(json.dumps(doc, indent=1, default=str))
    png = out.with_suffix(".png")
    plot(png)
    if table is not None:
        show(table(doc))
    print(f"wrote {out}" + (f" and {png}" if png.exists() else ""), flush=True)
    return out
