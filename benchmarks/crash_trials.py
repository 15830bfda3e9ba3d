"""Crash trials: SIGKILL a producing process at random moments, recover, and check what survived.

    .venv/bin/python benchmarks/crash_trials.py [--quick] [--trials N]

Core: a producer ``Conduit`` (prioritized, journal on, periodic checkpoints) is killed at a random
moment and recovered with ``Conduit.load``; the items must be exactly ``0..M-1``, once each, with their
priorities, and the committed experience lost is measured. RLlib: a DQN with Conduit replay is killed
*inside* an ``algo.save()`` (within the save's measured duration; at most three attempts per kill that
lands inside); the restored buffer must be exactly one a save wrote. Method:
``benchmarks/notes/crash_trials.md``. Writes ``benchmarks/results/crash_trials[_quick].json`` (with
provenance) and prints its table.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cartpole  # noqa: E402
import provenance  # noqa: E402
import report_ops  # noqa: E402
import script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BATCH, CAPACITY, CKPT_EVERY = 64, 400_000, 200


def priority_of(ids: Any) -> Any:
    """The priority the producer gives item ``id`` (recomputed by the checker)."""
    return (ids % 7 + 1).to(ids.dtype) if hasattr(ids, "to") else ids % 7 + 1


# -- core producer (a child process) -----------------------------------------------------------------


def conduit_for(work: Path) -> Any:
    import torch

    from conduit import BufferConfig, Column, Conduit, Schema

    schema = Schema([Column("id", torch.int64), Column("obs", torch.float32, (16,))])
    cfg = BufferConfig.prioritized_replay(CAPACITY, journal={"path": str(work / "journal")})
    return Conduit(schema, cfg, seed=0)


def produce(work: Path) -> None:
    """Put numbered items with priorities forever, printing ``<items> <monotonic time>`` after each put."""
    import torch

    from conduit import ColumnBatch

    torch.set_num_threads(1)
    c = conduit_for(work)
    if (work / "ckpt").is_dir():
        c.load(work / "ckpt")
    n = c.buffer.inserted
    print("READY", n, flush=True)
    puts = 0
    while True:
        ids = torch.arange(n, n + BATCH)
        c.put(ColumnBatch({"id": ids, "obs": ids[:, None].float().expand(BATCH, 16)}))
        slots = c.buffer.storage.generation.new_tensor(range(n % CAPACITY, n % CAPACITY + BATCH))
        c.update_priorities_at(slots, ids + 1, priority_of(ids).double())  # generation = id + 1
        n += BATCH
        puts += 1
        print(n, time.monotonic(), flush=True)
        if puts % CKPT_EVERY == 0:
            c.save(work / "ckpt")
        time.sleep(0.002)


def check_core(work: Path, restarts: list[int]) -> dict[str, Any]:
    """Recover in this process and check items, checksum and priorities."""
    import torch

    t0 = time.perf_counter()
    c = conduit_for(work)  # replays the journal
    if (work / "ckpt").is_dir():
        c.load(work / "ckpt")  # the checkpoint, then the journal's later records
    recover_s = time.perf_counter() - t0
    m = c.buffer.inserted
    ids = c.buffer.storage.data["id"][:m]
    expected = torch.arange(m)
    exact = bool(torch.equal(ids, expected))
    crc = zlib.crc32(ids.numpy().tobytes()) == zlib.crc32(expected.numpy().tobytes())
    tree = c.buffer.sampler.tree.state_dict()["priorities"][:m]
    sampler = c.buffer.sampler
    want = (priority_of(expected).double() + sampler.eps).pow(sampler.alpha)
    # the batch put last before each kill may be recovered without its priority update (killed
    # between the two calls): it keeps the priority new items get; every other item must be exact
    exact_prio = torch.ones(m, dtype=torch.bool)
    for b in {*restarts, m}:
        tail = slice(max(0, b - BATCH), b)
        got = tree[tail]
        if not torch.allclose(got, want[tail]) and torch.allclose(got, got[:1].expand_as(got)):
            exact_prio[tail] = False
    prio_ok = bool(torch.allclose(tree[exact_prio], want[exact_prio]))
    c.close()
    return {
        "recovered": m,
        "exact_once": exact,
        "checksum_ok": crc,
        "priorities_ok": prio_ok,
        "recover_s": recover_s,
    }


def core_trial(rng: random.Random) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="conduit-crash-") as tmp:
        work = Path(tmp)
        log: list[tuple[int, float]] = []
        restarts: list[int] = []
        # two runs: kill, recover and go on, kill again (recovery twice in a row)
        for _ in range(2):
            child = subprocess.Popen(
                [sys.executable, __file__, "--produce", str(work)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            assert child.stdout is not None
            ready = child.stdout.readline()
            assert ready.startswith("READY"), ready
            restarts.append(int(ready.split()[1]))
            deadline = time.monotonic() + rng.uniform(0.5, 3.0)
            while time.monotonic() < deadline:
                line = child.stdout.readline().split()
                if len(line) == 2:
                    log.append((int(line[0]), float(line[1])))
            os.kill(child.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            for line in child.stdout:
                parts = line.split()
                if len(parts) == 2:
                    log.append((int(parts[0]), float(parts[1])))
            child.wait()
        out = check_core(work, restarts)
        committed = max(n for n, _ in log)
        # seconds of committed experience lost: from the first put that is missing to the kill
        missing = [t for n, t in log if n > out["recovered"]]
        out["committed"] = committed
        out["lost_items"] = committed - out["recovered"]
        out["lost_s"] = (killed_at - min(missing)) if missing else 0.0
        out["ok"] = (
            out["exact_once"] and out["checksum_ok"] and out["priorities_ok"] and out["lost_items"] >= 0
        )
        return out


# -- RLlib ---------------------------------------------------------------------------------------------

RLLIB_CHILD = """
import os, sys, ray, torch
sys.path.insert(0, {bench!r})
torch.set_num_threads(1)
ray.init(address={address!r}, log_to_driver=False)
from crash_trials import dqn, rllib_checksum
algo = dqn()
if os.path.isdir({path!r}):
    algo.restore({path!r})
print("READY", flush=True)
while True:
    algo.train()
    print("SAVING", *rllib_checksum(algo), flush=True)  # the state this save writes
    algo.save({path!r})
    print("SAVED", *rllib_checksum(algo), flush=True)
"""


def dqn() -> Any:
    import conduit_rllib

    return conduit_rllib.enable(cartpole.dqn_config(), overlap="sync").build_algo()


def rllib_checksum(algo: Any) -> tuple[int, int]:
    """``(inserted, crc32 of every slot's data, generation, priority and the counters)``."""
    state = algo.conduit_path.conduits["default_policy"].state_dict()["buffer"]
    crc = 0
    for key in sorted(state["storage"]):
        crc = zlib.crc32(state["storage"][key].contiguous().numpy().tobytes(), crc)
    tree = state["sampler"]["tree"]
    crc = zlib.crc32(tree["priorities"].numpy().tobytes(), crc)
    crc = zlib.crc32(
        repr((state["inserted"], state["sampled"], state["sampler"]["max_priority"])).encode(), crc
    )
    return int(state["inserted"]), crc


def _next(child: subprocess.Popen, want: str) -> tuple[list[str], float]:
    """The child's next line starting with ``want`` (its words) and when it was read."""
    assert child.stdout is not None
    for line in child.stdout:
        parts = line.split()
        if parts and parts[0] == want:
            return parts, time.monotonic()
    raise RuntimeError(f"the child ended before printing {want}")


def rllib_trials(n: int, rng: random.Random) -> list[dict[str, Any]]:
    """Kill attempts until ``n`` kills landed inside ``algo.save()`` (at most ``3 n`` attempts)."""
    import ray
    from conduit_rllib.local_ray import init_local_ray

    init_local_ray(log_to_driver=False)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="conduit-crash-rllib-") as tmp:
        path = str(Path(tmp) / "ck")
        child_code = RLLIB_CHILD.format(
            bench=str(Path(__file__).resolve().parent),
            path=path,
            address=ray.get_runtime_context().gcs_address,
        )
        algo = dqn()
        previous: tuple[int, int] | None = None  # the last save that completed
        save_s: list[float] = []
        try:
            while sum(r["killed_during_save"] for r in rows) < n and len(rows) < 3 * n:
                child = subprocess.Popen(
                    [sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True, cwd=ROOT
                )
                _next(child, "READY")
                _, t0 = _next(child, "SAVING")  # one complete save (timed), then a kill inside the next
                first, t1 = _next(child, "SAVED")
                previous = (int(first[1]), int(first[2]))
                save_s.append(t1 - t0)
                pending, started = _next(child, "SAVING")
                new = (int(pending[1]), int(pending[2]))
                window = sorted(save_s)[len(save_s) // 2]
                time.sleep(max(0.0, started + rng.uniform(0.0, window) - time.monotonic()))
                os.kill(child.pid, signal.SIGKILL)
                killed = time.monotonic()
                assert child.stdout is not None
                finished = False
                for line in child.stdout:
                    parts = line.split()
                    if parts and parts[0] == "SAVED":
                        finished = True
                child.wait()
                left = sorted(p.name for p in Path(tmp).iterdir() if p.name != "ck")
                row: dict[str, Any] = {
                    "killed_during_save": not finished,
                    "kill_after_save_start_s": killed - started,
                    "save_window_s": window,
                    "leftovers": left,
                }
                if not os.path.isdir(path):
                    row.update(restored=False, ok=False)
                else:
                    algo.restore(path)
                    got = rllib_checksum(algo)
                    which = "new" if got == new else "previous" if got == previous else "neither"
                    row.update(
                        restored=True, inserted=got[0], restored_checkpoint=which, ok=which != "neither"
                    )
                rows.append(row)
                print(
                    f"rllib trial {len(rows)}: kill {row['kill_after_save_start_s']:.3f}s into a save "
                    f"(window {window:.3f}s), inside: {row['killed_during_save']}, "
                    f"restored: {row.get('restored_checkpoint')}",
                    flush=True,
                )
        finally:
            algo.stop()
            ray.shutdown()
    return rows


# -- main ----------------------------------------------------------------------------------------------


def summary(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": len(rows), "ok": sum(bool(r["ok"]) for r in rows)}
    for k in keys:
        vals = sorted(float(r[k]) for r in rows if r.get(k) is not None)
        if vals:
            out[f"{k}_median"] = vals[len(vals) // 2]
            out[f"{k}_max"] = vals[-1]
    return out


def main() -> None:
    ap = script.parser(__doc__, quick="5 core and 3 RLlib trials")
    ap.add_argument("--trials", type=int, default=None, help="trials per kind (default 20)")
    ap.add_argument("--produce", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.produce is not None:
        produce(args.produce)
        return
    prov = provenance.start()
    rng = random.Random(0)
    n_core = args.trials or (5 if args.quick else 20)
    n_rllib = args.trials or (3 if args.quick else 20)
    core = [core_trial(rng) for _ in range(n_core)]
    rllib = rllib_trials(n_rllib, rng)
    from conduit.config import JournalConfig

    doc = {
        "journal_flush_interval_s": JournalConfig("x").flush_interval_s,
        "core": {"summary": summary(core, ["lost_s", "lost_items", "recover_s"]), "trials": core},
        "rllib": {
            "summary": {
                **summary(rllib, ["kill_after_save_start_s", "save_window_s"]),
                "killed_during_save": sum(bool(r["killed_during_save"]) for r in rllib),
            },
            "trials": rllib,
        },
        "machine": script.machine(prov),
    }
    script.write_result("crash_trials", args, doc, lambda png: None, report_ops.crash_trials)


if __name__ == "__main__":
    main()
