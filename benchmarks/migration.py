"""Online placement as responses grow: greedy vs conservative vs Conduit's planner, step by step.

    python benchmarks/migration.py [--quick] [--out FILE]

A GRPO-shaped token buffer whose response length grows (512 → 16k tokens); each iteration writes a
step's responses and reads them back, consume-once (ids counted in and out). Real host tiers (pageable,
shm, disk), simulated budgets (host 40%, shm 70% of the end size): a policy over a budget is out of
memory, its point missing. Policies: ``greedy`` (fastest tier first, planned once), ``conservative`` (all
disk), ``conduit`` (planned, then ``Placer.grow`` at every size: re-plan with hysteresis, migrate online)
and ``best_static`` (each fixed placement that fits, on a fresh buffer; the fastest). Target: Conduit
never out of memory and within 1.1× of the best static at every size. Method:
``benchmarks/notes/migration.md``.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE))

import provenance  # noqa: E402
import report_ops  # noqa: E402
import script  # noqa: E402
from placement_workloads import budgeted  # noqa: E402

from conduit import Column, Schema  # noqa: E402
from conduit.batch import ColumnBatch, Ragged  # noqa: E402
from conduit.buffer.buffer import ExperienceBuffer  # noqa: E402
from conduit.build_buffer import build_buffer  # noqa: E402
from conduit.config import BufferConfig, RateLimit  # noqa: E402
from conduit.discovery import local_topology  # noqa: E402
from conduit.errors import CapacityError  # noqa: E402
from conduit.placement import Plan, greedy_fastest, plan, price  # noqa: E402
from conduit.placer import Placer, Traffic, column_fields, usable_tiers  # noqa: E402
from conduit.topology import Topology  # noqa: E402

FULL = {"lengths": [512, 1024, 2048, 4096, 8192, 16384], "capacity": 512, "batch": 128, "iters": 12}
QUICK = {"lengths": [512, 2048, 8192], "capacity": 256, "batch": 64, "iters": 5}


def schema(max_len: int) -> Schema:
    return Schema(
        [
            Column("id", torch.int64),
            Column("reward", torch.float32),
            Column("responses", torch.int64, ragged=True, max_len=max_len),
            Column("log_probs", torch.float32, ragged=True, max_len=max_len),
            Column("advantages", torch.float32, ragged=True, max_len=max_len),
        ]
    )


RAGGED = ("responses", "log_probs", "advantages")


def make_batch(first: int, n: int, length: int) -> ColumnBatch:
    """``n`` responses of exactly ``length`` tokens (random lengths would only add noise here)."""
    ids = torch.arange(first, first + n)
    lengths = torch.full((n,), length)
    return ColumnBatch(
        {
            "id": ids,
            "reward": torch.rand(n),
            "responses": Ragged.from_padded(torch.randint(0, 32000, (n, length)), lengths),
            "log_probs": Ragged.from_padded(torch.randn(n, length), lengths),
            "advantages": Ragged.from_padded(torch.randn(n, length), lengths),
        }
    )


class Run:
    """One policy's buffer through the whole growth, timing iterations and counting ids."""

    def __init__(self, name: str, buf: ExperienceBuffer, batch: int) -> None:
        self.name, self.buf, self.batch = name, buf, batch
        self.next_id = 0
        self.ids_out: list[torch.Tensor] = []

    def iteration(self, data: ColumnBatch) -> float:
        n = data.size
        stamped = ColumnBatch({**data.columns, "id": torch.arange(self.next_id, self.next_id + n)})
        self.next_id += n
        t0 = time.perf_counter()
        self.buf.extend(stamped)
        got = self.buf.sample(n)
        for name in RAGGED:  # the consumer's copy of the token fields
            col = got.batch.columns[name]
            assert isinstance(col, Ragged)
            col.values.clone()
        seconds = time.perf_counter() - t0
        self.ids_out.append(got.batch.columns["id"].clone())  # type: ignore[union-attr]
        return seconds

    def accounted(self) -> bool:
        ids = torch.cat(self.ids_out) if self.ids_out else torch.empty(0, dtype=torch.int64)
        return ids.numel() == self.next_id and torch.equal(torch.sort(ids).values, torch.arange(self.next_id))


def build(capacity: int, max_len: int, tiers: dict[str, str]) -> ExperienceBuffer:
    cfg = BufferConfig(
        capacity=capacity, tier="host", pins=tiers, sampler="fifo", rate_limit=RateLimit(timeout_s=30)
    )
    return build_buffer(cfg, schema(max_len))


def buffer_tiers(p: Plan, topo: Topology) -> dict[str, str]:
    back = {v: k for k, v in usable_tiers(topo).items()}
    return {c: back[t] for c, t in p.assignment.items()}


def interleaved(runs: dict[str, Run], length: int, iters: int, rng: random.Random) -> dict[str, list[float]]:
    """``iters`` timed iterations of every run, round-robin in a fresh random order each round, so
    that every system sees the same machine conditions; one untimed pass over each ring first."""
    first = next(iter(runs.values()))
    data = make_batch(0, first.batch, length)
    for run in runs.values():  # warm-up: one pass over the ring (page faults of fresh memory)
        for _ in range(-(-run.buf.capacity // run.batch)):
            run.iteration(data)
    return script.interleaved({n: lambda r=r: r.iteration(data) for n, r in runs.items()}, iters, rng)


def main(argv: list[str] | None = None) -> int:
    ap = script.parser(__doc__, quick="three sizes, fewer iterations (about a minute)")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    prov = provenance.start()
    lengths, capacity, batch, iters = cfg["lengths"], cfg["capacity"], cfg["batch"], cfg["iters"]
    work = Traffic(batch, batch)
    end_bytes = sum(f.nbytes for f in column_fields(schema(lengths[-1]), capacity, work, {"host": "h"}))
    host, shm = int(0.4 * end_bytes), int(0.7 * end_bytes)
    topo = budgeted(local_topology(), host=host, shm=shm)
    usable = usable_tiers(topo)
    print(
        f"== {topo.source}\n   end-size buffer {end_bytes / 2**20:.0f} MiB; host budget {host / 2**20:.0f} MiB, "
        f"shm {shm / 2**20:.0f} MiB; capacity {capacity} items, {batch} per iteration",
        flush=True,
    )

    def fields_at(length: int) -> list[Any]:
        return column_fields(schema(length), capacity, work, usable)

    start_fields = fields_at(lengths[0])
    runs = {
        "greedy": Run(
            "greedy",
            build(capacity, lengths[0], buffer_tiers(greedy_fastest(start_fields, topo), topo)),
            batch,
        ),
        "conservative": Run(
            "conservative", build(capacity, lengths[0], {c.name: "disk" for c in schema(8)}), batch
        ),
    }
    conduit_buf = build(capacity, lengths[0], buffer_tiers(plan(start_fields, topo), topo))
    placer = Placer(conduit_buf, topo, work)
    runs["conduit"] = Run("conduit", conduit_buf, batch)
    rows: list[dict[str, Any]] = []
    oom: dict[str, int] = {}
    rng = random.Random(0)
    for step, length in enumerate(lengths):
        print(f"-- step {step}: responses of {length} tokens", flush=True)
        base = {
            "step": step,
            "tokens": length,
            "capacity": capacity,
            "samples_per_iter": batch,
            "iters": iters,
        }
        live: dict[str, Run] = {}
        extra: dict[str, dict[str, Any]] = {}
        for name, run in runs.items():
            if name in oom:
                rows.append({"system": name, **base, "oom": True, "seconds": None})
                continue
            migration_s = pause_s = 0.0
            try:
                if step:
                    if name == "conduit":
                        before = len(placer.history)
                        t0 = time.perf_counter()
                        placer.resize(dict.fromkeys(RAGGED, length))
                        migration_s = time.perf_counter() - t0
                        pause_s = max((h.migration.max_pause_s for h in placer.history[before:]), default=0.0)
                    else:
                        run.buf.migrate({}, dict.fromkeys(RAGGED, length))
                current = {c: usable[t] for c, t in run.buf.storage.tiers.items()}  # type: ignore[attr-defined]
                priced = price(fields_at(length), topo, current)  # raises if over a simulated budget
            except CapacityError as e:
                oom[name] = step
                print(f"   {name:<13} out of memory at {length} tokens: {e}", flush=True)
                rows.append({"system": name, **base, "oom": True, "seconds": None, "error": str(e)[:200]})
                continue
            live[name] = run
            extra[name] = {
                "migration_s": migration_s,
                "max_pause_s": pause_s,
                "predicted_s": priced.predicted_s,
            }
        # fixed placements that fit at this size, each on a fresh buffer: the best of them is the best static
        candidates = {"planned": buffer_tiers(plan(fields_at(length), topo), topo)}
        for tier in ("host", "shm", "disk"):
            candidates[f"all_{tier}"] = {c.name: tier for c in schema(8)}
        for cname, tiers in candidates.items():
            try:
                priced = price(fields_at(length), topo, {c: usable[t] for c, t in tiers.items()})
            except CapacityError:
                continue
            live[f"static:{cname}"] = Run(cname, build(capacity, length, tiers), batch)
            extra[f"static:{cname}"] = {"predicted_s": priced.predicted_s}
        times = interleaved(live, length, iters, rng)
        for name, run in live.items():
            med = statistics.median(times[name])
            tiers = dict(run.buf.storage.tiers)  # type: ignore[attr-defined]
            rows.append(
                {
                    "system": name,
                    **base,
                    "oom": False,
                    "seconds": med,
                    "iteration_s": times[name],
                    "placement": tiers,
                    **extra[name],
                }
            )
            print(
                f"   {name:<18} {med * 1e3:8.2f} ms/iter  migration {extra[name].get('migration_s', 0) * 1e3:7.1f} ms"
                f"  tiers {sorted(set(tiers.values()))}",
                flush=True,
            )
        statics = [r for r in rows if r["step"] == step and r["system"].startswith("static:")]
        best = min(statics, key=lambda r: r["seconds"])
        rows.append(
            {
                "system": "best_static",
                **base,
                "oom": False,
                "seconds": best["seconds"],
                "which": best["system"],
            }
        )
        for name in [n for n in live if n.startswith("static:")]:
            del live[name]
        print(f"   best static: {best['system']} {best['seconds'] * 1e3:.2f} ms/iter", flush=True)

    summary = summarize(rows, runs, lengths)
    result = {
        "rows": rows,
        "summary": summary,
        "budgets": {"host": host, "shm": shm},
        "topology": topo.source,
        "history": [
            {"reason": h.reason, "moves": [m.__dict__ for m in h.migration.moves]} for h in placer.history
        ],
        "machine": script.machine(prov),
    }
    script.write_result("migration", args, result, lambda png: plot(rows, lengths, png), report_ops.migration)
    return 0


def summarize(rows: list[dict[str, Any]], runs: dict[str, Run], lengths: list[int]) -> dict[str, Any]:
    by = {(r["system"], r["tokens"]): r for r in rows}
    ratios = {}
    for length in lengths:
        best, c = by[("best_static", length)]["seconds"], by[("conduit", length)]
        ratios[str(length)] = None if c.get("oom") else round(c["seconds"] / best, 3)
    cumulative = {}
    for name in runs:
        mine = [by[(name, n)] for n in lengths]
        if any(r.get("oom") for r in mine):
            cumulative[name] = None
        else:
            cumulative[name] = sum(sum(r["iteration_s"]) + r.get("migration_s", 0.0) for r in mine)
    ok = [v for v in ratios.values() if v is not None]
    return {
        "conduit_over_best_static": ratios,
        "conduit_never_oom": all(v is not None for v in ratios.values()),
        "within_1_1x_everywhere": bool(ok) and len(ok) == len(ratios) and max(ok) <= 1.1,
        "oom_at_tokens": {
            n: next((r["tokens"] for r in rows if r["system"] == n and r.get("oom")), None) for n in runs
        },
        "cumulative_s": cumulative,
        "items_accounted": {n: r.accounted() for n, r in runs.items()},
    }


def plot(rows: list[dict[str, Any]], lengths: list[int], path: Path) -> None:
    plt = script.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in (("greedy", "o-"), ("conservative", "s-"), ("conduit", "D-"), ("best_static", "k--")):
        pts = [
            (r["tokens"], r["seconds"]) for r in rows if r["system"] == name and r.get("seconds") is not None
        ]
        if pts:
            a.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], style, label=name)
        ooms = [r["tokens"] for r in rows if r["system"] == name and r.get("oom")]
        if ooms:
            a.scatter(
                ooms, [a.get_ylim()[1] if a.get_ylim()[1] > 1 else 1.0] * len(ooms), marker="x", color="red"
            )
            a.annotate(f"{name}: OOM", (ooms[0], a.get_ylim()[1]), fontsize=8, color="red")
        cum, total = [], 0.0
        for n in lengths:
            r = next((r for r in rows if r["system"] == name and r["tokens"] == n), None)
            if name == "best_static" or r is None or r.get("seconds") is None:
                break
            total += sum(r["iteration_s"]) + r.get("migration_s", 0.0)
            cum.append((n, total))
        if cum:
            b.plot([p[0] for p in cum], [p[1] for p in cum], style, label=name)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("response length (tokens)")
        ax.legend(fontsize=8)
    a.set_yscale("log")
    a.set_ylabel("median iteration (ms, log)")
    a.set_title("per-step iteration latency (x: out of memory)")
    b.set_ylabel("cumulative seconds (iterations + migrations)")
    b.set_title("cumulative latency")
    fig.suptitle("migration.py: host tiers real, budgets simulated", fontsize=9)
    script.save_figure(fig, path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
