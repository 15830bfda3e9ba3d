"""GPU checks and delivery timings for Conduit's core, for a machine with CUDA and plain torch.

    python benchmarks/gpu/core_gpu.py [--out DIR]      (needs only torch; no pytest, ray or verl)

Checks (asserts): the ``cuda`` and ``pinned`` tiers store and return exactly what was written; the
prioritized sum tree runs on the GPU; delivery to ``cuda`` from host storage is correct in sync and
async mode. Then it times, side by side in one run, a DQN-shaped delivery of batch 256 × 16384 float32
values to the GPU from each tier — pageable host, pinned host, GPU HBM — with overlap off and on, and
writes ``core_gpu.json`` (per configuration: get() latency median/p95 in ms and GB/s) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import provenance  # noqa: E402

from conduit import BufferConfig, Column, ColumnBatch, Conduit, SchedulerConfig, Schema  # noqa: E402
from conduit.build_buffer import build_buffer

DIM, BATCH, CAPACITY = 16384, 256, 4096


def check_tiers() -> None:
    schema = Schema([Column("obs", torch.float32, (DIM,))])
    src = torch.randn(64, DIM)
    for tier in ("cuda", "pinned"):
        b = build_buffer(BufferConfig(capacity=128, tier=tier, sampler="fifo"), schema)
        b.extend(ColumnBatch({"obs": src}))
        assert torch.equal(b.sample(64).batch["obs"].cpu(), src), tier
    p = build_buffer(BufferConfig(capacity=128, tier="cuda", sampler="prioritized"), schema)
    p.extend(ColumnBatch({"obs": src.cuda()}))
    s = p.sample(32)
    assert s.slots.is_cuda and s.weights is not None and s.weights.is_cuda
    p.update_priorities(s.slots, s.generations, torch.rand(32, device="cuda"))
    print("tiers and GPU sum tree: ok", flush=True)


def time_delivery(tier: str, overlap: str, iters: int) -> dict[str, float | str]:
    schema = Schema([Column("obs", torch.float32, (DIM,))])
    c = Conduit(
        schema, BufferConfig(capacity=CAPACITY, tier=tier), SchedulerConfig(overlap=overlap), device="cuda"
    )
    dev = "cuda" if tier == "cuda" else "cpu"
    c.put(ColumnBatch({"obs": torch.randn(CAPACITY, DIM, device=dev)}))
    c.flush()
    weight = torch.randn(DIM, 1024, device="cuda")
    lat = []
    for _ in range(iters + 3):
        t0 = time.perf_counter()
        d = c.get(BATCH)
        lat.append(time.perf_counter() - t0)
        out = d.batch["obs"] @ weight  # learner compute the delivery can overlap with
        out.sum().item()
    c.close()
    lat = lat[3:]
    med = statistics.median(lat)
    return {
        "tier": tier,
        "overlap": overlap,
        "get_ms_median": med * 1e3,
        "get_ms_p95": sorted(lat)[int(0.95 * (len(lat) - 1))] * 1e3,
        "gb_per_s_median": BATCH * DIM * 4 / med / 1e9,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--iters", type=int, default=50)
    a = p.parse_args()
    prov = provenance.start()
    if not torch.cuda.is_available():
        print("core_gpu: no CUDA device on this machine; nothing to run", file=sys.stderr)
        sys.exit(2)
    check_tiers()
    rows = []
    for tier in ("host", "pinned", "cuda"):
        for overlap in ("sync", "async"):
            row = time_delivery(tier, overlap, a.iters)
            print(json.dumps(row), flush=True)
            rows.append(row)
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, **provenance.finish(prov)}
    (a.out / "core_gpu.json").write_text(json.dumps({"machine": meta, "rows": rows}, indent=2))
    print(f"wrote {a.out / 'core_gpu.json'}")


if __name__ == "__main__":
    main()
