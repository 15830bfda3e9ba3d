"""Checkpoint pause: how long a save of a full buffer holds the buffer's lock while ingestion runs.

    .venv/bin/python benchmarks/checkpoint_pause.py [--quick] [--out FILE]

A 1 GiB prioritized buffer (1 KiB items) is saved three times, a full save and two incremental ones,
while a producer thread puts and a consumer thread samples. Each row: the pause (longest hold of the
lock; ``locked_s``: all holds), the longest put and sample during a save and without one, bytes written,
segments written/reused; medians over 3 repeats. Method: ``benchmarks/notes/checkpoint_pause.md``.
Writes ``benchmarks/results/checkpoint_pause[_quick].json`` (with provenance) and its PNG.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_ops  # noqa: E402
import script  # noqa: E402

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Schema  # noqa: E402

ITEM_FLOATS, BATCH = 256, 64  # 1 KiB items
KINDS = ("full", "incremental", "incremental 2")


class Load:
    """A producer and a consumer thread; records the longest put and sample while running."""

    def __init__(self, c: Conduit) -> None:
        self.c, self.stop = c, threading.Event()
        self.put_max = self.get_max = 0.0
        self.puts = 0
        self.batch = ColumnBatch({"obs": torch.randn(BATCH, ITEM_FLOATS)})
        self.threads = [threading.Thread(target=self._put), threading.Thread(target=self._get)]

    def _put(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.c.put(self.batch)
            self.put_max = max(self.put_max, time.perf_counter() - t)
            self.puts += 1
            time.sleep(0.005)  # about 12k items/s

    def _get(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.c.get(64)
            self.get_max = max(self.get_max, time.perf_counter() - t)
            time.sleep(0.001)

    def __enter__(self) -> Load:
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for th in self.threads:
            th.join()


def run(gib: float, repeats: int) -> list[dict[str, Any]]:
    capacity = int(gib * 2**30) // (ITEM_FLOATS * 4)
    schema = Schema([Column("obs", torch.float32, (ITEM_FLOATS,))])
    c = Conduit(schema, BufferConfig.prioritized_replay(capacity), seed=0)
    chunk = 1 << 16
    for s in range(0, capacity, chunk):
        n = min(chunk, capacity - s)
        c.put(ColumnBatch({"obs": torch.randn(n, ITEM_FLOATS)}))
    rows = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="conduit-ckpt-") as tmp:
            with Load(c) as idle:
                time.sleep(1.0)
            for kind in KINDS:
                with Load(c) as load:
                    time.sleep(0.2)
                    report = c.save(tmp)
                rows.append(
                    {
                        "repeat": r,
                        "kind": kind,
                        "buffer_bytes": c.buffer.storage.nbytes,
                        "items": report.items,
                        "pause_s": report.pause_s,
                        "locked_s": report.locked_s,
                        "save_s": report.total_s,
                        "bytes_written": report.bytes_written,
                        "segments_written": report.segments_written,
                        "segments_reused": report.segments_reused,
                        "segments_linked": report.segments_linked,
                        "put_max_during_save_s": load.put_max,
                        "get_max_during_save_s": load.get_max,
                        "put_max_idle_s": idle.put_max,
                        "get_max_idle_s": idle.get_max,
                        "puts_during_save": load.puts,
                    }
                )
    c.close()
    return rows


def medians(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        out[kind] = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("kind", "repeat")}
    return out


def plot(med: dict[str, dict[str, float]], path: Path) -> None:
    kinds = list(med)
    fig, ax = script.pyplot().subplots(figsize=(6, 3.5))
    x = range(len(kinds))
    ax.bar([i - 0.2 for i in x], [med[k]["pause_s"] * 1e3 for k in kinds], 0.4, label="lock held (pause)")
    ax.bar([i + 0.2 for i in x], [med[k]["save_s"] * 1e3 for k in kinds], 0.4, label="whole save")
    ax.axhline(50, color="red", linestyle="--", linewidth=1, label="50 ms target")
    ax.set_xticks(list(x), kinds)
    ax.set_ylabel("ms (median)")
    ax.set_yscale("log")
    ax.set_title(f"checkpoint of a {med['full']['buffer_bytes'] / 2**30:.2f} GiB buffer under load")
    ax.legend()
    script.save_figure(fig, path, dpi=100)


def main() -> None:
    ap = script.parser(__doc__, quick="a 64 MiB buffer, one repeat")
    args = ap.parse_args()
    prov = provenance.start()
    torch.set_num_threads(1)
    gib, repeats = (1 / 16, 1) if args.quick else (1.0, 3)
    rows = run(gib, repeats)
    med = medians(rows)
    doc = {"gib": gib, "rows": rows, "median": med, "machine": script.machine(prov)}
    script.write_result(
        "checkpoint_pause", args, doc, lambda png: plot(med, png), report_ops.checkpoint_pause
    )


if __name__ == "__main__":
    main()
