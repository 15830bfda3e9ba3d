"""A short demo of the core: a DQN-shaped loop with Conduit's overlap off (inline) and on.

Each iteration an "actor" hands over a fragment (n-step returns at ingestion), the learner samples a
prioritized batch, trains a small MLP and sends priorities back; ``sync`` runs inline, ``async`` on
background workers, interleaved in one process. The table compares the exposed latency per iteration.

Run: ``python benchmarks/core_demo.py [--iters 60] [--batch 256] [--dim 64] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Operator, RateLimit, SchedulerConfig, Schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402


def nstep_returns(n: int, gamma: float) -> Operator:
    """n-step discounted returns inside one fragment, vectorised (no loop over transitions)."""
    kernel = gamma ** torch.arange(n, dtype=torch.float32)

    def fn(b: ColumnBatch) -> ColumnBatch:
        r = b["reward"]
        assert isinstance(r, torch.Tensor)
        padded = torch.nn.functional.pad(r, (0, n - 1))
        ret = padded.unfold(0, n, 1) @ kernel
        return b.with_columns(nstep_return=ret)

    return Operator("nstep_returns", fn)


def run(
    overlap: str, iters: int, batch: int, dim: int, fragment: int, seed: int
) -> list[tuple[float, float]]:
    torch.manual_seed(seed)
    schema = Schema([Column("obs", torch.float32, (dim,)), Column("reward", torch.float32)])
    stored = schema.with_column(Column("nstep_return", torch.float32))
    conduit = Conduit(
        schema,
        BufferConfig(capacity=50_000, sampler="prioritized", rate_limit=RateLimit(min_size=batch)),
        SchedulerConfig(overlap=overlap, depth=2, g_ing=1, g_del=1),
        ingest=[nstep_returns(3, 0.99)],
        stored_schema=stored,
        seed=seed,
    )
    net = torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    rows = []
    for it in range(iters):
        t0 = time.perf_counter()
        frag = ColumnBatch({"obs": torch.randn(fragment, dim), "reward": torch.randn(fragment)})
        conduit.put(frag, version=it)
        if it == 0:
            conduit.flush()
        d = conduit.get(batch)
        obs, ret = d.batch["obs"], d.batch["nstep_return"]
        assert isinstance(obs, torch.Tensor) and isinstance(ret, torch.Tensor) and d.weights is not None
        td = net(obs).squeeze(1) - ret
        loss = (d.weights * td.pow(2)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        conduit.update_priorities(d, td.detach().abs())
        m = conduit.end_iteration()
        rows.append((time.perf_counter() - t0, m["exposed_s"]))
    conduit.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--fragment", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3, help="interleaved sync/async rounds")
    p.add_argument("--out", type=Path, default=Path("demo_results"))
    a = p.parse_args(argv)
    prov = provenance.start()
    torch.set_num_threads(1)
    results: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}
    for r in range(a.rounds):
        for mode in ("sync", "async"):
            print(f"round {r + 1}/{a.rounds}: overlap={mode} ({a.iters} iterations)", flush=True)
            results[mode] += run(mode, a.iters, a.batch, a.dim, a.fragment, seed=r)[5:]
    med = {
        k: (statistics.median(w for w, _ in v), statistics.median(e for _, e in v))
        for k, v in results.items()
    }
    print(f"\n{'overlap':<8} {'iter ms (median)':>18} {'exposed ms (median)':>20} {'exposed share':>14}")
    for k, (w, e) in med.items():
        print(f"{k:<8} {w * 1e3:>18.2f} {e * 1e3:>20.2f} {e / w:>13.1%}")
    print(
        f"\nasync / sync: exposed x{med['async'][1] / med['sync'][1]:.2f}, "
        f"end-to-end x{med['async'][0] / med['sync'][0]:.2f}"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, object] = {
        k: {
            "iter_s_median": w,
            "exposed_s_median": e,
            "work": {"iterations": len(results[k]), "items_per_iteration": a.batch},
        }
        for k, (w, e) in med.items()
    }
    out["provenance"] = provenance.finish(prov)
    (a.out / "demo.json").write_text(json.dumps(out, indent=2))
    print(f"wrote {a.out / 'demo.json'}")


if __name__ == "__main__":
    main()
