"""What the benchmark scripts do alike: their command line, their figures and their result file.

Scripts import it as they import ``provenance`` (``benchmarks/`` on ``sys.path``)::

    args = script.parser(__doc__, quick="few iterations (a check)").parse_args()
    ...
    out = script.write_result("granularity", args, {"iterations": iters, **data}, lambda png: plot(data, png))
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def parser(doc: str | None, quick: str, out: Path | None = None) -> argparse.ArgumentParser:
    """A benchmark's command line: ``doc`` as its description (laid out as written), ``--quick`` (``quick``
    says what it shortens) and ``--out``, the result JSON (default ``out``; None: the script's file
    under ``benchmarks/results``, see :func:`write_result`)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=quick)
    where = out if out is not None else "benchmarks/results/<benchmark>[_quick].json"
    p.add_argument("--out", type=Path, default=out, help=f"result JSON (default {where})")
    return p


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
    name: str, args: argparse.Namespace, record: dict[str, Any], plot: Callable[[Path], None]
) -> Path:
    """Write ``{"benchmark": name, "quick": args.quick, **record}`` to ``args.out`` (default
    ``benchmarks/results/<name>[_quick].json``) and its figure beside it (``plot(<out>.png)``)."""
    out: Path = args.out or RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": name, "quick": args.quick, **record}, indent=1, default=str))
    plot(out.with_suffix(".png"))
    return out
