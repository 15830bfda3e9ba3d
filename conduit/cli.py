"""The ``conduit`` command.

conduit topology                          this machine: tiers, free capacity, measured links
conduit topology --recalibrate            measure the links again instead of using the cache
conduit topology --file topologies/h200x8.toml --png h200.png
                                          a described topology, as a table and as a graph
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from conduit.discovery import discover
from conduit.errors import ConfigError
from conduit.topology import Topology, load


def format_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _table(rows: Sequence[Sequence[str]], right: tuple[int, ...]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, row in enumerate(rows):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def _standing_for(topo: Topology) -> str:
    n = topo.node_count or len(topo.nodes)
    return f" written, standing for {n} ({topo.gpu_count} GPUs)" if n > len(topo.nodes) else ""


def format_table(topo: Topology) -> str:
    """The topology as two text tables: tiers with capacity, links with GB/s and µs."""
    order = {t.name: i for i, t in enumerate(topo.tiers)}
    lines = [
        f"topology: {topo.source}",
        f"{len(topo.nodes)} node(s){_standing_for(topo)}, {len(topo.tiers)} tiers, {len(topo.links)} links",
        "",
    ]
    tiers = [(t.name, t.kind, t.node, t.device or "-", format_bytes(t.capacity_bytes)) for t in topo.tiers]
    lines += _table([("tier", "kind", "node", "device", "capacity")] + tiers, right=(4,))
    lines.append("")
    links = sorted(topo.links, key=lambda lk: (order[lk.src], order[lk.dst]))
    rows = [(lk.src, lk.dst, _num(lk.gb_per_s), _num(lk.latency_us)) for lk in links]
    lines += _table([("src", "dst", "GB/s", "µs")] + rows, right=(2, 3))
    missing = topo.missing_links()
    if missing:
        a, b = missing[0]
        lines += ["", f"{len(missing)} ordered tier pair(s) have no link, e.g. {a} -> {b}"]
    return "\n".join(lines)


def _layout(topo: Topology) -> tuple[dict[str, tuple[float, float]], float]:
    """Tier positions and the spacing of nodes: nodes side by side; in a node, GPUs on an ellipse (or in
    a row) above, the other tiers on a two-column grid below."""
    many = max(sum(t.kind == "hbm" for t in topo.tiers_on(n)) for n in topo.nodes) > 2
    width = 8.0 if many else 6.0
    pos: dict[str, tuple[float, float]] = {}
    for i, node in enumerate(topo.nodes):
        x0, tiers = width * i, topo.tiers_on(node)
        gpus = [t for t in tiers if t.kind == "hbm"]
        for k, t in enumerate(gpus):
            if len(gpus) <= 2:
                pos[t.name] = (x0 + 1.6 * (2 * k - len(gpus) + 1), 2.2)
            else:
                angle = math.pi / 2 + 2 * math.pi * k / len(gpus)
                pos[t.name] = (x0 + 2.9 * math.cos(angle), 4.4 + 2.5 * math.sin(angle))
        for k, t in enumerate(t for t in tiers if t.kind != "hbm"):
            pos[t.name] = (x0 + (-1.6 if k % 2 == 0 else 1.6), -0.4 - 2.0 * (k // 2))
    return pos, width


def draw_png(topo: Topology, out: str) -> None:
    """Draw the topology as a graph: tiers as boxes (capacity, self-copy rate), links as edges labelled
    in GB/s ("a / b": a from the tier listed first in the table, b back); links between two nodes are
    drawn as one arc labelled with their range."""
    try:
        from matplotlib import colormaps
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure
        from matplotlib.patches import PathPatch, Rectangle
        from matplotlib.path import Path
    except ImportError as e:
        raise ConfigError(
            f"--png needs matplotlib ({e}); install it, e.g. pip install 'conduit-rl[bench]'"
        ) from None
    (pos, width), order = _layout(topo), {t.name: i for i, t in enumerate(topo.tiers)}
    top = max(y for _, y in pos.values()) + 1.2  # the nodes' frames end here; arcs between nodes above
    rates = [lk.gb_per_s for lk in topo.links] or [1.0]
    norm, cmap = LogNorm(vmin=min(rates), vmax=max(rates) * 1.0001), colormaps["viridis"]
    fig = Figure(figsize=(max(7.0, 0.9 * width * len(topo.nodes)), 9.0))
    ax = fig.add_subplot()
    placed: list[tuple[float, float, str]] = []

    def label(x: float, y: float, text: str) -> bool:
        if any(abs(x - px) < 0.55 and abs(y - py) < 0.22 for px, py, _ in placed):
            return False
        placed.append((x, y, text))
        box = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85}
        ax.text(x, y, text, fontsize=6, ha="center", va="center", zorder=4, bbox=box)
        return True

    cross: dict[tuple[str, str], list[float]] = {}
    for a in topo.tiers:
        for b in topo.tiers:
            if order[a.name] >= order[b.name]:
                continue
            there, back = topo.link(a.name, b.name), topo.link(b.name, a.name)
            gbs = [lk.gb_per_s for lk in (there, back) if lk is not None]
            if not gbs:
                continue
            if a.node != b.node:
                cross.setdefault((a.node, b.node), []).extend(gbs)
                continue
            (x1, y1), (x2, y2) = pos[a.name], pos[b.name]
            ax.plot([x1, x2], [y1, y2], color=cmap(norm(max(gbs))), lw=0.6 + 1.6 * norm(max(gbs)), zorder=1)
            text = _num(gbs[0]) if len(set(gbs)) == 1 else " / ".join(_num(g) for g in gbs)
            for f in (0.5, 0.35, 0.65, 0.25, 0.75):
                if label(x1 + f * (x2 - x1), y1 + f * (y2 - y1), text):
                    break
    nodes = list(topo.nodes)
    for (na, nb), gbs in cross.items():
        xa, xb = width * nodes.index(na), width * nodes.index(nb)
        h = 0.9 * abs(nodes.index(nb) - nodes.index(na))
        verts = [(xa, top), ((xa + xb) / 2, top + 2 * h), (xb, top)]
        curve = Path(verts, [Path.MOVETO, Path.CURVE3, Path.CURVE3])
        ax.add_patch(PathPatch(curve, fc="none", ec=cmap(norm(max(gbs))), lw=1.5, zorder=1))
        lo, hi = min(gbs), max(gbs)
        label((xa + xb) / 2, top + h, f"{_num(lo)}–{_num(hi)}" if lo != hi else _num(lo))
    for i, node in enumerate(nodes):
        x0 = width * i - width / 2 + 0.2
        frame = Rectangle((x0, -3.0), width - 0.4, top + 3.0, fc="#f4f4f4", ec="#999999", zorder=0)
        ax.add_patch(frame)
        ax.text(x0 + 0.2, top - 0.15, node, ha="left", va="top", fontsize=9, weight="bold")
    for t in topo.tiers:
        x, y = pos[t.name]
        self_link = topo.link(t.name, t.name)
        lines = [t.name.split("/", 1)[-1], format_bytes(t.capacity_bytes)]
        if self_link is not None:
            lines.append(f"copy {_num(self_link.gb_per_s)}")
        color = {
            "hbm": "#c9e4ff",
            "pinned": "#ffe7c2",
            "host": "#ffd9d9",
            "shm": "#e6d9ff",
            "disk": "#dddddd",
        }
        box = {"boxstyle": "round,pad=0.3", "fc": color[t.kind], "ec": "#333333"}
        ax.text(x, y, "\n".join(lines), ha="center", va="center", fontsize=7, zorder=5, bbox=box)
    ax.set_xlim(-width / 2, width * (len(nodes) - 0.5))
    ax.set_ylim(-3.2, top + 0.3 + 0.9 * (len(nodes) - 1))
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(
        f"{topo.source}\nedge labels: GB/s per direction (a / b: from the earlier tier, back)", fontsize=8
    )
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.5, label="GB/s")
    fig.savefig(out, dpi=150, bbox_inches="tight")


def _topology(args: Any) -> int:
    if args.file and args.recalibrate:
        raise ConfigError("--recalibrate measures this machine; it does not apply to --file")
    if args.file:
        topo = load(args.file)
    else:
        topo = discover(cache_dir=args.cache_dir, recalibrate=args.recalibrate, seconds=args.seconds)
    if args.png:
        draw_png(topo, args.png)
    print(format_table(topo) + (f"\n\nwrote {args.png}" if args.png else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conduit", description="Conduit's command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    topo = sub.add_parser(
        "topology",
        help="show this machine's topology (or a described one) as a table and a graph",
        description="Tiers with free capacity and links with bandwidth and latency: measured on this "
        "machine (cached per machine fingerprint), or loaded from a described topology file.",
    )
    topo.add_argument("--file", metavar="F", help="a described topology (TOML, e.g. topologies/h200x8.toml)")
    topo.add_argument("--png", metavar="OUT", help="also draw the topology as a graph into this PNG")
    topo.add_argument(
        "--recalibrate", action="store_true", help="measure the links again, ignoring the cache"
    )
    topo.add_argument("--seconds", type=float, default=3.0, help="calibration time budget (default 3)")
    topo.add_argument(
        "--cache-dir", metavar="D", help="calibration cache directory (default ~/.cache/conduit)"
    )
    args = parser.parse_args(argv)
    try:
        return _topology(args)
    except ConfigError as e:
        print(f"conduit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. piped into head
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
