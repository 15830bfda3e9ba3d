"""Where should Conduit's background work run: a thread or a separate process over shared memory?

    python benchmarks/overlap_executors.py [--quick] [--steps 300] [--rounds 3] [--out FILE]

A learner step (MLP 64→256→256→1, batch 256, one torch thread) hands one fragment per step to
background ingestion (n-step returns over 1 000 × 64, a write into a 100 000-slot ring), at most one in
flight. Setups, interleaved round by round: the learner alone, ingestion on a *thread*, ingestion in a
forked *process* over shared memory. Reported: median learner step, slowdown versus alone, fragments
ingested per second. Method: ``benchmarks/notes/overlap_executors.md``. Writes JSON and a PNG.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import report_tables  # noqa: E402
import script  # noqa: E402

DIM, FRAG, CAP, BATCH, NSTEP = 64, 1000, 100_000, 256, 3
KERNEL = 0.99 ** torch.arange(NSTEP, dtype=torch.float32)


def ingest(
    frag: torch.Tensor, reward: torch.Tensor, ring: torch.Tensor, ret_ring: torch.Tensor, k: int
) -> None:
    """The background work: n-step returns (vectorised) and one ring write."""
    ret = torch.nn.functional.pad(reward, (0, NSTEP - 1)).unfold(0, NSTEP, 1) @ KERNEL
    slots = (k * FRAG + torch.arange(FRAG)) % CAP
    ring.index_copy_(0, slots, frag)
    ret_ring.index_copy_(0, slots, ret)


def learner_steps(n: int, before_step=None) -> list[float]:  # noqa: ANN001
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(DIM, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, DIM), torch.randn(BATCH, 1)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        if before_step is not None:
            before_step(i)
        loss = (net(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out


def run_alone(steps: int) -> dict[str, float]:
    return {"step_s": statistics.median(learner_steps(steps)), "fragments_per_s": 0.0}


def run_thread(steps: int) -> dict[str, float]:
    ring, ret_ring = torch.zeros(CAP, DIM), torch.zeros(CAP)
    frag, reward = torch.randn(FRAG, DIM), torch.randn(FRAG)
    cond, pending, done = threading.Condition(), [0], [0]

    def worker() -> None:
        k = 0
        while True:
            with cond:
                cond.wait_for(lambda: pending[0] != 0)
                if pending[0] < 0:
                    return
            ingest(frag, reward, ring, ret_ring, k)
            k += 1
            with cond:
                pending[0] -= 1
                done[0] += 1

    def hand_over(_: int) -> None:  # one fragment per learner step, one in flight at most
        with cond:
            if pending[0] == 0:
                pending[0] = 1
                cond.notify()

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    t0 = time.perf_counter()
    times = learner_steps(steps, before_step=hand_over)
    elapsed = time.perf_counter() - t0
    with cond:
        pending[0] = -(10**9)
        cond.notify()
    t.join(10)
    return {"step_s": statistics.median(times), "fragments_per_s": done[0] / elapsed}


def _process_worker(conn, staging, reward, ring, ret_ring) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    while True:
        k = conn.recv()
        if k is None:
            return
        ingest(staging[k % 2], reward, ring, ret_ring, k)
        conn.send(k)


def run_process(steps: int) -> dict[str, float]:
    ring, ret_ring = torch.zeros(CAP, DIM).share_memory_(), torch.zeros(CAP).share_memory_()
    staging = torch.zeros(2, FRAG, DIM).share_memory_()
    reward = torch.randn(FRAG).share_memory_()
    frag = torch.randn(FRAG, DIM)
    parent, child = mp.get_context("fork").Pipe()
    p = mp.get_context("fork").Process(target=_process_worker, args=(child, staging, reward, ring, ret_ring))
    p.start()
    sent, done = [0], [0]

    def hand_over(_: int) -> None:
        # keep one fragment in flight: collect the finished one, copy the next into staging, send it
        while parent.poll():
            parent.recv()
            done[0] += 1
        if sent[0] - done[0] < 1:
            staging[sent[0] % 2].copy_(frag)
            parent.send(sent[0])
            sent[0] += 1

    t0 = time.perf_counter()
    times = learner_steps(steps, before_step=hand_over)
    elapsed = time.perf_counter() - t0
    parent.send(None)
    p.join(30)
    return {"step_s": statistics.median(times), "fragments_per_s": done[0] / elapsed}


def plot(summary: dict[str, dict[str, float]], path: Path) -> None:
    fig, ax = script.pyplot().subplots(1, 2, figsize=(9, 3.5))
    names = list(summary)
    ax[0].bar(names, [summary[n]["step_s"] * 1e3 for n in names], color=["grey", "tab:blue", "tab:orange"])
    ax[0].set_ylabel("learner step, median (ms)")
    ax[1].bar(names[1:], [summary[n]["fragments_per_s"] for n in names[1:]], color=["tab:blue", "tab:orange"])
    ax[1].set_ylabel("background fragments ingested / s")
    fig.suptitle("Background ingestion: thread vs process (2-core CPU)")
    script.save_figure(fig, path)


def main() -> None:
    p = script.parser(__doc__, quick="50 steps, one round (a check)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    prov = provenance.start()
    torch.set_num_threads(1)
    steps, rounds = (50, 1) if a.quick else (a.steps, a.rounds)
    setups = {"alone": run_alone, "thread": run_thread, "process": run_process}
    rows = []
    for r in range(rounds):
        for name, fn in setups.items():
            res = fn(steps)
            rows.append({"round": r, "setup": name, **res})
            print(
                f"round {r}  {name:8s} step {res['step_s'] * 1e3:7.3f} ms  "
                f"ingested {res['fragments_per_s']:8.1f} fragments/s",
                flush=True,
            )
    summary = {}
    for name in setups:
        step = statistics.median(x["step_s"] for x in rows if x["setup"] == name)
        frag = statistics.median(x["fragments_per_s"] for x in rows if x["setup"] == name)
        summary[name] = {"step_s": step, "fragments_per_s": frag}
    for name in ("thread", "process"):
        summary[name]["slowdown_vs_alone"] = summary[name]["step_s"] / summary["alone"]["step_s"]
    doc = {"machine": script.machine(prov, cores=mp.cpu_count()), "rows": rows, "summary": summary}
    script.write_result(
        "overlap_executors", a, doc, lambda png: plot(summary, png), report_tables.overlap_executors
    )


if __name__ == "__main__":
    main()
