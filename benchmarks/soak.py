"""Load and soak: several producers and consumers at full speed through one on-policy Conduit.

    python benchmarks/soak.py [--quick] [--minutes M] [--out FILE]

Each overlap mode (``sync``, then ``async``) runs half of ``--minutes`` (default 10, ``--quick`` 1) with
``P`` producer and ``C`` consumer threads on a consume-once buffer. Checked per mode: items in == out and
a 64-bit checksum of the ids (nothing lost or duplicated); every delivered item equals what its producer
wrote; throughput and RSS over time (growth after warm-up ~0); put/get p50/p99 from a constant-memory
histogram. Method: ``benchmarks/notes/soak.md``. Writes a JSON and a PNG.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import provenance  # noqa: E402
import report_ops  # noqa: E402
import script  # noqa: E402

from conduit import (  # noqa: E402
    BufferConfig,
    Column,
    ColumnBatch,
    Conduit,
    InsufficientDataError,
    Metrics,
    Ragged,
    SchedulerConfig,
    Schema,
)

PRODUCERS = CONSUMERS = 2  # threads each
OBS_DIM = 64
MAX_TOKENS = 32
BATCH = 256
CAPACITY = 16 * BATCH
SCHEMA = Schema(
    [
        Column("id", torch.int64),
        Column("producer", torch.int64),
        Column("obs", torch.float32, (OBS_DIM,)),
        Column("reward", torch.float32, check_finite=True),
        Column("tokens", torch.int64, ragged=True, max_len=MAX_TOKENS),
    ]
)
HASH_MUL = 6364136223846793005  # Knuth's MMIX multiplier: the product wraps in int64
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """Resident memory of this process, MiB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def checksum(ids: torch.Tensor) -> int:
    """A wrapping 64-bit sum of a multiplicative hash of ``ids`` (order-free: in and out compare)."""
    return int((ids * HASH_MUL + (ids >> 7)).sum())


def make_batch(producer: int, first: int, n: int) -> ColumnBatch:
    """Items ``first..first+n`` of ``producer``: contents are a function of the id (checked on delivery)."""
    ids = torch.arange(first, first + n) + (producer << 40)
    lengths = ids % MAX_TOKENS + 1
    return ColumnBatch(
        {
            "id": ids,
            "producer": torch.full((n,), producer),
            "obs": expected_obs(ids),
            "reward": (ids % 1000).float(),
            "tokens": Ragged.from_lengths(torch.arange(int(lengths.sum())) % 50_000, lengths),
        }
    )


def expected_obs(ids: torch.Tensor) -> torch.Tensor:
    return ((ids.unsqueeze(1) * 31 + torch.arange(OBS_DIM)) % 9973).float()


def contents_ok(batch: ColumnBatch) -> bool:
    """Whether every fixed column and every token length is what the producer wrote for these ids."""
    ids = batch["id"]
    tokens = batch["tokens"]
    assert isinstance(ids, torch.Tensor) and isinstance(tokens, Ragged)
    return (
        torch.equal(batch["obs"], expected_obs(ids))
        and torch.equal(batch["reward"], (ids % 1000).float())
        and torch.equal(tokens.lengths, ids % MAX_TOKENS + 1)
    )


class Latency:
    """A log-spaced histogram of call latencies from 1 µs to 100 s (constant memory)."""

    BINS = 400
    LO, HI = math.log(1e-6), math.log(100.0)

    def __init__(self) -> None:
        self.counts = np.zeros(self.BINS + 1, dtype=np.int64)

    def add(self, seconds: float) -> None:
        x = (math.log(max(seconds, 1e-6)) - self.LO) / (self.HI - self.LO)
        self.counts[min(int(x * self.BINS), self.BINS)] += 1

    def merge(self, other: Latency) -> None:
        self.counts += other.counts

    def quantile(self, q: float) -> float | None:
        total = int(self.counts.sum())
        if total == 0:
            return None
        i = int(np.searchsorted(np.cumsum(self.counts), q * total))
        return math.exp(self.LO + (i + 0.5) / self.BINS * (self.HI - self.LO))


class Tally:
    """What one thread put or got: counts and checksums per producer, bad contents, latencies."""

    def __init__(self, producers: int) -> None:
        self.items = 0
        self.per_producer = torch.zeros(producers, dtype=torch.int64)
        self.checksum = 0
        self.bad_contents = 0
        self.latency = Latency()

    def record(self, batch: ColumnBatch, seconds: float) -> None:
        self.latency.add(seconds)
        self.items += batch.size
        self.per_producer += torch.bincount(batch["producer"], minlength=len(self.per_producer))  # type: ignore[arg-type]
        self.checksum = (self.checksum + checksum(batch["id"])) % 2**64  # type: ignore[arg-type]


def run_mode(overlap: str, seconds: float, producers: int, consumers: int, sample_s: float) -> dict[str, Any]:
    """One soak run; returns its row (totals, checks, latencies, timeline)."""
    cfg = BufferConfig.on_policy(CAPACITY, timeout_s=2.0)
    # no trace timeline: it grows (up to Metrics.max_trace_events) and would hide a leak in the data path
    conduit = Conduit(SCHEMA, cfg, SchedulerConfig(overlap=overlap, depth=4), metrics=Metrics(trace=False))
    stop, drained = threading.Event(), threading.Event()
    puts = [Tally(producers) for _ in range(producers)]
    gets = [Tally(producers) for _ in range(consumers)]
    errors: list[str] = []

    def produce(p: int) -> None:
        first = 0
        try:
            while not stop.is_set():
                batch = make_batch(p, first, BATCH)
                t0 = time.perf_counter()
                conduit.put(batch)
                puts[p].record(batch, time.perf_counter() - t0)
                first += BATCH
        except Exception as e:  # noqa: BLE001 — reported in the row
            errors.append(f"producer {p}: {e!r}")

    def consume(c: int) -> None:
        try:
            while not drained.is_set():
                t0 = time.perf_counter()
                try:
                    batch = conduit.get(BATCH).batch
                except InsufficientDataError:
                    continue  # producers slower than consumers for a moment, or the run is ending
                gets[c].record(batch, time.perf_counter() - t0)
                gets[c].bad_contents += not contents_ok(batch)
        except Exception as e:  # noqa: BLE001 — reported in the row
            errors.append(f"consumer {c}: {e!r}")

    threads = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,), daemon=True) for c in range(consumers)]
    timeline: list[dict[str, float]] = []
    rss_start = rss_mb()
    t0 = time.monotonic()
    for t in threads:
        t.start()
    last_out, last_t = 0, t0
    while (now := time.monotonic()) - t0 < seconds and not errors:
        time.sleep(min(sample_s, max(0.0, t0 + seconds - now)))
        now = time.monotonic()
        out = sum(g.items for g in gets)
        timeline.append(
            {"t_s": round(now - t0, 2), "items_per_s": (out - last_out) / (now - last_t), "rss_mb": rss_mb()}
        )
        last_out, last_t = out, now
    stop.set()
    for t in threads[:producers]:
        t.join(30)
    put_in = sum(p.items for p in puts)
    deadline = time.monotonic() + 60
    while sum(g.items for g in gets) < put_in and time.monotonic() < deadline and not errors:
        time.sleep(0.05)  # consumers drain what is left
    drained.set()
    for t in threads[producers:]:
        t.join(30)
    wall = time.monotonic() - t0
    conduit.close(drain=False)
    return summarize(overlap, puts, gets, timeline, errors, wall, rss_start, producers, consumers)


def summarize(
    overlap: str,
    puts: list[Tally],
    gets: list[Tally],
    timeline: list[dict[str, float]],
    errors: list[str],
    wall: float,
    rss_start: float,
    producers: int,
    consumers: int,
) -> dict[str, Any]:
    put_lat, get_lat = Latency(), Latency()
    for p in puts:
        put_lat.merge(p.latency)
    for g in gets:
        get_lat.merge(g.latency)
    items_in, items_out = sum(p.items for p in puts), sum(g.items for g in gets)
    per_in = sum((p.per_producer for p in puts), torch.zeros(producers, dtype=torch.int64))
    per_out = sum((g.per_producer for g in gets), torch.zeros(producers, dtype=torch.int64))
    sum_in = sum(p.checksum for p in puts) % 2**64
    sum_out = sum(g.checksum for g in gets) % 2**64
    warm = timeline[len(timeline) // 5 :] or timeline
    rss = [s["rss_mb"] for s in warm]
    return {
        "overlap": overlap,
        "work": {
            "batch_size": BATCH,
            "item_bytes": SCHEMA.nbytes_per_item,
            "capacity": CAPACITY,
            "producers": producers,
            "consumers": consumers,
        },
        "wall_s": round(wall, 2),
        "items_in": items_in,
        "items_out": items_out,
        "lost": max(0, items_in - items_out),
        "duplicated": max(0, items_out - items_in),
        "per_producer_match": bool(torch.equal(per_in, per_out)),
        "checksum_match": sum_in == sum_out,
        "bad_contents_batches": sum(g.bad_contents for g in gets),
        "errors": errors,
        "throughput_items_per_s_median": statistics.median(s["items_per_s"] for s in warm) if warm else None,
        "put_latency_s": {"p50": put_lat.quantile(0.5), "p99": put_lat.quantile(0.99)},
        "get_latency_s": {"p50": get_lat.quantile(0.5), "p99": get_lat.quantile(0.99)},
        "rss_mb": {
            "start": round(rss_start, 1),
            "after_warmup": round(rss[0], 1) if rss else None,
            "end": round(rss[-1], 1) if rss else None,
            "growth_after_warmup": round(rss[-1] - rss[0], 1) if rss else None,
        },
        "timeline": timeline,
    }


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """async / sync throughput, refused (None, with the reason) when the per-item work differs."""
    by = {r["overlap"]: r for r in rows}
    if {"sync", "async"} - set(by):
        return {}
    if by["sync"]["work"] != by["async"]["work"]:
        return {"async_over_sync_throughput": None, "refused": "the work differs between the rows"}
    a, s = by["async"]["throughput_items_per_s_median"], by["sync"]["throughput_items_per_s_median"]
    return {"async_over_sync_throughput": a / s if a and s else None}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, (top, bottom) = script.pyplot().subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in rows:
        t = [s["t_s"] for s in r["timeline"]]
        top.plot(t, [s["items_per_s"] / 1e3 for s in r["timeline"]], label=r["overlap"])
        bottom.plot(t, [s["rss_mb"] for s in r["timeline"]], label=r["overlap"])
    top.set_ylabel("items out / s (thousands)")
    bottom.set_ylabel("resident memory (MiB)")
    bottom.set_xlabel("seconds into the run")
    top.set_title("Soak: producers and consumers at full speed, consume-once buffer")
    top.legend()
    bottom.legend()
    script.save_figure(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = script.parser(__doc__, quick="1 minute in all (30 s per mode)")
    ap.add_argument("--minutes", type=float, default=None, help="total run time, split over the modes (10)")
    args = ap.parse_args(argv)
    tok = provenance.start()
    minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 10.0)
    modes = ("sync", "async")
    seconds = minutes * 60 / len(modes)
    sample_s = 1.0 if seconds <= 120 else 5.0
    rows = []
    for mode in modes:
        print(f"-- {mode}: {seconds:.0f}s, {PRODUCERS} producers, {CONSUMERS} consumers", flush=True)
        rows.append(run_mode(mode, seconds, PRODUCERS, CONSUMERS, sample_s))
    ratio = ratios(rows)
    ok = all(
        r["lost"] == 0
        and r["duplicated"] == 0
        and r["checksum_match"]
        and r["per_producer_match"]
        and not r["bad_contents_batches"]
        and not r["errors"]
        for r in rows
    )
    doc = {
        "minutes": minutes,
        "all_items_once": ok,
        "rows": rows,
        "ratios": ratio,
        "machine": script.machine(tok),
    }
    script.write_result("soak", args, doc, lambda png: plot(rows, png), report_ops.soak)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
