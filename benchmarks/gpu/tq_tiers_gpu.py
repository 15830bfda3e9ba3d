"""GPU checks and timings of the TransferQueue backend's tiers and of CUDA-IPC reads, for a lent GPU.

    python benchmarks/gpu/tq_tiers_gpu.py [--out DIR] [--samples 256] [--tokens 4096] [--iters 20]

Needs torch with CUDA, numba and tensordict (not Ray, verl or TransferQueue): it drives the backend's
``NodeStore`` directly, as a storage actor does. Under 8 minutes on one GPU at the defaults.

1. **Tiers**: a GRPO-shaped batch put into a store whose fields all sit on one tier (``shm``, ``pinned``,
   ``cuda``), read back and checked equal, then ``put`` and ``get`` timed.
2. **CUDA IPC**: a second process reads a batch of rows' valid prefixes of a GPU-owned field into its own
   GPU tensor (a) through CUDA IPC, one gather on the device, (b) without it, through shared host memory
   (two PCIe crossings); both checked equal, timed per read with the device synchronised.

Writes ``tq_tiers_gpu.json`` (provenance, one row per measurement with GB/s of payload) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "integrations" / "verl"), str(ROOT / "benchmarks")]

import provenance  # noqa: E402
from conduit_verl.tq_store.columns import column_of  # noqa: E402
from conduit_verl.tq_store.store import NodeStore  # noqa: E402
from tq_batch import make_arrays, make_batch, payload_bytes  # noqa: E402

from conduit.buffer.columns import from_wire, to_wire  # noqa: E402
from conduit.buffer.ragged_kernels import gather_tokens  # noqa: E402

FIELDS = ("input_ids", "responses", "response_mask", "old_log_probs", "rm_scores")


def grpo_batch(samples: int, tokens: int, seed: int) -> dict[str, Any]:
    """The batch of ``tq_batch.py`` in wire form (what a storage actor receives) and its flat
    values, for checking."""
    arrays = make_arrays(samples, tokens, seed)
    td = make_batch(arrays)
    wires = {k: to_wire(column_of(k, td.get(k))) for k in FIELDS}
    return {"wires": wires, "flat": arrays["values"], "scores": arrays["rm_scores"],
            "offsets": arrays["offsets"], "bytes": payload_bytes(arrays)}  # fmt: skip


def check_store(store: NodeStore, gis: np.ndarray, batch: dict[str, Any], tier: str) -> None:
    got = {k: from_wire(w) for k, w in store.get(gis, list(FIELDS)).items()}
    for name, values in batch["flat"].items():
        col = got[name].data
        assert torch.equal(col.offsets, batch["offsets"]), (tier, name, "offsets")
        assert torch.equal(col.values, values), (tier, name, "values")
    assert torch.equal(got["rm_scores"].data, batch["scores"]), (tier, "rm_scores")
    assert all(store.fields[n].tier == tier for n in FIELDS), {n: store.fields[n].tier for n in FIELDS}


def time_tier(tier: str, batch: dict[str, Any], samples: int, iters: int) -> list[dict[str, Any]]:
    store = NodeStore(placement=dict.fromkeys(FIELDS, tier), default_tier=tier)
    gis = np.arange(samples, dtype=np.int64)
    store.put(gis, batch["wires"])
    check_store(store, gis, batch, tier)
    puts, gets = [], []
    for i in range(iters + 2):
        keys = gis + samples * (1 + i % 2)  # fresh keys each put, as TQ's global indexes are
        t0 = time.perf_counter()
        store.put(keys, batch["wires"])
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        store.get(keys, list(FIELDS))
        t2 = time.perf_counter()
        store.clear(keys)
        if i >= 2:
            puts.append(t1 - t0)
            gets.append(t2 - t1)
    store.close()
    return [row(f"tier:{tier}", op, batch["bytes"], xs) for op, xs in (("put", puts), ("get", gets))]


def row(what: str, op: str, nbytes: int, seconds: list[float]) -> dict[str, Any]:
    med = statistics.median(seconds)
    return {"what": what, "op": op, "bytes": nbytes, "ms_median": med * 1e3,
            "ms_p95": sorted(seconds)[int(0.95 * (len(seconds) - 1))] * 1e3,
            "gb_per_s": nbytes / med / 1e9, "n": len(seconds)}  # fmt: skip


def field_on_gpu(samples: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``[4 * samples, tokens]`` int64 field on the GPU, the rows of one batch, and its offsets."""
    g = torch.Generator().manual_seed(1)
    array = torch.randint(0, 151_936, (4 * samples, tokens), generator=g).cuda()
    rows = torch.randperm(4 * samples, generator=g)[:samples]
    lengths = torch.randint(max(tokens // 2, 1), tokens + 1, (samples,), generator=g)
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return array, rows, offsets


def reader(inbox: Any, outbox: Any, iters: int) -> None:
    """The second process: reads through IPC, then through host memory, and reports its timings."""
    t0 = time.perf_counter()
    array, rows, offsets, expected = inbox.get()  # CUDA tensors arrive as IPC handles, opened here
    torch.cuda.synchronize()
    opened = time.perf_counter() - t0
    ipc = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        out = gather_tokens(array, rows, offsets)
        torch.cuda.synchronize()
        if i >= 2:
            ipc.append(time.perf_counter() - t0)
    ok = bool(torch.equal(out, expected))
    host = []
    for i in range(iters + 2):
        shared = inbox.get()  # the owner's gather, in shared host memory
        t0 = time.perf_counter()
        got = shared.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            host.append(time.perf_counter() - t0)
        ok = ok and bool(torch.equal(got, expected))
        outbox.put("next")
    del array, expected
    outbox.put({"open_s": opened, "ipc_s": ipc, "h2d_s": host, "equal": ok})


def time_ipc(samples: int, tokens: int, iters: int) -> list[dict[str, Any]]:
    array, rows, offsets = field_on_gpu(samples, tokens)
    expected = gather_tokens(array, rows, offsets)
    nbytes = int(expected.nbytes)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=reader, args=(inbox, outbox, iters))
    proc.start()
    handed = (array, rows.cuda(), offsets.cuda(), expected)  # kept alive while the reader uses them
    inbox.put(handed)
    shared = torch.empty(expected.shape, dtype=expected.dtype).share_memory_()
    d2h = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        shared.copy_(gather_tokens(array, rows, offsets), non_blocking=True)
        torch.cuda.synchronize()
        if i >= 2:
            d2h.append(time.perf_counter() - t0)
        inbox.put(shared)
        assert outbox.get(timeout=120) == "next"
    got = outbox.get(timeout=120)
    proc.join(timeout=60)
    del handed
    assert got["equal"], "a read through IPC or host memory differs from the owner's gather"
    both = [a + b for a, b in zip(d2h, got["h2d_s"])]
    return [
        {**row("ipc", "open_handle", 0, [got["open_s"]]), "gb_per_s": None},
        row("ipc", "read", nbytes, got["ipc_s"]),
        row("host", "read (owner gather + D2H, reader H2D)", nbytes, both),
        row("host", "owner gather + D2H", nbytes, d2h),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("tq_tiers_gpu: no CUDA device on this machine; nothing to run", file=sys.stderr)
        sys.exit(2)
    prov = provenance.start()
    batch = grpo_batch(a.samples, a.tokens, seed=0)
    rows: list[dict[str, Any]] = []
    for tier in ("shm", "pinned", "cuda"):
        rows += time_tier(tier, batch, a.samples, a.iters)
        print(f"tier {tier}: stored and read back equal", flush=True)
    rows += time_ipc(a.samples, a.tokens, a.iters)
    for r in rows:
        gbs = "" if r["gb_per_s"] is None else f"{r['gb_per_s']:8.2f} GB/s"
        print(f"{r['what']:>12} {r['op']:<40} {r['ms_median']:9.3f} ms {gbs}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, **provenance.finish(prov)}
    cells = {"samples": a.samples, "tokens": a.tokens, "iters": a.iters}
    (a.out / "tq_tiers_gpu.json").write_text(
        json.dumps({"machine": meta, "setup": cells, "rows": rows}, indent=1)
    )
    print(f"wrote {a.out / 'tq_tiers_gpu.json'}")


if __name__ == "__main__":
    main()
