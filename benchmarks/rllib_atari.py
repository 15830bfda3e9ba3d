"""Atari DQN replay at 100k and 1M transitions (issue 31): the buffer cells, Conduit and native RLlib.

    python benchmarks/rllib_atari.py [--quick] [--capacity N ...] [--dim 64|84] [--frames auto disk]
        [--systems conduit native] [--out FILE]

Per capacity, Conduit's frame-once replay (``ConduitReplay`` with RLlib's ``FrameStacking(num_frames=4)``:
each frame stored once as uint8, stacks built at delivery), twice (``--frames``): frames where the
planner puts them (host on this machine), and frames on the disk tier (a RAM budget that holds only the
transition rows: ``enable(..., memory_budget=...)``; ``disk_gib`` is the memmap's size); then native
RLlib's ``PrioritizedEpisodeReplayBuffer`` with env-stacked float32 observations
(``rllib_atari_native.py``; a capacity that does not fit this machine is refused with what it needs).
Measured: the insert rate (env steps per second through ``add``), prioritized sample + priority update
latency at batch 32 (p50 / p99, the training batch of stacked observations built: Conduit's delivery,
native's learner connector), resident memory (VmRSS growth) and the bytes the observations take. The
episodes are Atari-shaped stand-ins, not ALE: normalized float32 frames ``u / 128 - 1`` of random codes
(what ``wrap_atari_for_new_api_stack`` yields), life-length episodes, fragments of 4 steps as RLlib's
Atari DQN example samples them; a buffer cell measures the buffer, so no env runs. Every row carries its
work (env steps inserted, samples, priority updates).

Not written yet: TorchRL's ``LazyMemmapStorage`` + ``PrioritizedSampler`` in its own venv
(``notes/torchrl-baseline.md``), iteration wall / exposed time on ALE, learning curves. ``--quick``
(capacity 20k, 300 rounds) writes to /tmp unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import script  # noqa: E402
from rllib_atari_native import native_cell  # noqa: E402

BATCH, N_STEP, NUM_FRAMES, FRAGMENT, MEAN_LIFE = 32, 3, 4, 4, 60


def memory() -> dict[str, int]:
    """This process's resident memory in bytes (``/proc/self/status``): ``rss`` (VmRSS), ``anon``
    (RssAnon), ``file`` (RssFile: mapped file pages, e.g. the disk tier's memmap, which the kernel can
    drop) and ``peak`` (VmHWM)."""
    keys = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"}
    out = dict.fromkeys(keys.values(), 0)
    for line in Path("/proc/self/status").read_text().splitlines():
        name = line.split(":")[0]
        if name in keys:
            out[keys[name]] = int(line.split()[1]) * 1024
    return out


def memory_growth(before: dict[str, int]) -> dict[str, float]:
    """Resident memory grown since ``before`` (GiB): all, anonymous, file-mapped; and the peak."""
    now = memory()
    gib = {f"{k}_gib": round((now[k] - before[k]) / 2**30, 3) for k in ("anon", "file")}
    return {
        "rss_gib": round((now["rss"] - before["rss"]) / 2**30, 3),
        **{f"rss_{k}": v for k, v in gib.items()},
    } | {"peak_rss_gib": round(now["peak"] / 2**30, 3)}


def fragments(steps: int, dim: int, seed: int):
    """Lists of episode chunks (``FRAGMENT`` steps each, episodes of geometric length) covering ``steps``."""
    import gymnasium as gym
    from conduit_rllib.compat import SingleAgentEpisode

    rng = np.random.default_rng(seed)
    space = gym.spaces.Box(-1.0, 1.0, (dim, dim, 1), np.float32)
    done = 0
    while done < steps:
        length = int(rng.geometric(1 / MEAN_LIFE))
        frames = rng.integers(0, 256, (length + 1, dim, dim, 1), dtype=np.uint8)
        obs = frames.astype(np.float32) / np.float32(128) - np.float32(1)
        ep_id = f"ep{seed}-{done}"
        for t0 in range(0, length, FRAGMENT):
            t1 = min(length, t0 + FRAGMENT)
            chunk = SingleAgentEpisode(
                id_=ep_id,
                observations=list(obs[t0 : t1 + 1]),
                actions=list(rng.integers(0, 6, t1 - t0)),
                rewards=list((rng.random(t1 - t0) < 0.05).astype(np.float32)),
                terminated=t1 == length,
                observation_space=space,
                t_started=t0,
                len_lookback_buffer=0,
            )
            yield [chunk.to_numpy()]
        done += length


def frames_on_disk_budget(capacity: int) -> int:
    """A RAM budget that holds the transition rows (frame references) but not the frames: the planner
    then puts the frame column on the disk tier (memmap)."""
    import torch
    from conduit_rllib.replay import ROW_BOOKKEEPING, transition_schema

    rows = transition_schema(torch.int64, (NUM_FRAMES,)).nbytes_per_item + ROW_BOOKKEEPING
    return rows * capacity + (16 << 20)


def conduit_cell(capacity: int, dim: int, rounds: int, frames: str, disk_dir: Path) -> dict:
    """Fill a frame-once replay to ``capacity`` transitions, then time prioritized sample + update;
    ``frames="disk"`` gives it a RAM budget that sends the frames to the disk tier under ``disk_dir``."""
    import torch
    from conduit_rllib.replay import ConduitReplay
    from conduit_rllib.settings import ConduitSettings

    from conduit import BufferConfig

    torch.set_num_threads(1)
    mem0 = memory()
    budget = frames_on_disk_budget(capacity) if frames == "disk" else None
    replay = ConduitReplay(
        ConduitSettings(overlap="sync", memory_budget=budget, disk_path=str(disk_dir)),
        BufferConfig.prioritized_replay(capacity, alpha=0.5, beta=0.4),
        n_step=N_STEP,
        gamma=0.99,
        device="cpu",
        num_learners=0,
        seed=0,
        frame_stack=NUM_FRAMES,
    )
    add_s, steps, timed = 0.0, 0, 0
    for i, chunks in enumerate(fragments(capacity, dim, seed=0)):
        t0 = time.perf_counter()
        n = replay.add(chunks, version=0)
        if i > 0:  # the first add builds the stores and loads their kernels
            add_s += time.perf_counter() - t0
            timed += n
        steps += n
    replay.flush()
    c = replay.conduits["default_policy"]
    store = replay.packers["default_policy"].store
    rng = np.random.default_rng(1)
    lat = []
    for i in range(rounds + 50):
        t0 = time.perf_counter()
        train = replay.sample(BATCH)
        replay.update_priorities(train, {"default_policy": rng.random(BATCH).astype(np.float32)})
        if i >= 50:  # warm-up rounds not counted
            lat.append(time.perf_counter() - t0)
    ms = np.asarray(lat) * 1e3
    store.wait_placement()
    on_disk = store.tier == "disk"
    if frames == "disk" and not on_disk:
        raise SystemExit(
            f"the frames were planned on {store.tier}, not on disk, under a budget of {budget} bytes"
        )
    row = {
        "system": "conduit",
        "capacity": capacity,
        "dim": dim,
        "frames_tier": store.tier,
        "memory_budget": budget,
        **memory_growth(mem0),
        "disk_gib": round(store.nbytes() / 2**30, 3) if on_disk else 0.0,
        "frames_gib": round(store.nbytes() / 2**30, 3),
        "rows_gib": round(c.buffer.storage.nbytes / 2**30, 3),
        "insert_steps_per_s": round(timed / add_s),
        "sample_update_p50_ms": round(float(np.median(ms)), 3),
        "sample_update_p99_ms": round(float(np.percentile(ms, 99)), 3),
        "work": {"env_steps": steps, "inserted": c.buffer.inserted, "samples": rounds, "updates": rounds},
    }
    replay.close()
    return row


def ratios(rows: list[dict]) -> dict[str, object]:
    """Native ÷ Conduit per capacity and Conduit frame tier (latency p50 / p99, resident memory, insert
    rate Conduit ÷ native), refused where the work (env steps, samples, updates) differs or native was
    refused."""
    out: dict[str, object] = {}
    native = {r["capacity"]: r for r in rows if r["system"] == "native"}
    for c in (r for r in rows if r["system"] == "conduit"):
        key = f"{c['capacity']}/frames_on_{c['frames_tier']}"
        n = native.get(c["capacity"])
        if n is None:
            continue
        if "refused" in n:
            out[f"refused/{key}"] = f"native: {n['refused']}"
            continue
        keys = ("env_steps", "samples", "updates")
        if any(n["work"][k] != c["work"][k] for k in keys):
            out[f"refused/{key}"] = f"work differs: native {n['work']}, conduit {c['work']}"
            continue
        for m in ("sample_update_p50_ms", "sample_update_p99_ms", "rss_gib"):
            if c[m]:
                out[f"{m}/native_over_conduit/{key}"] = round(n[m] / c[m], 2)
        out[f"insert_steps_per_s/conduit_over_native/{key}"] = round(
            c["insert_steps_per_s"] / n["insert_steps_per_s"], 2
        )
    return out


def plot(rows: list[dict], png: Path) -> None:
    """Resident memory (anonymous and file-mapped) and sample + update latency (p50 bar, p99 tick) per cell."""
    plt = script.pyplot()
    rows = [r for r in rows if "refused" not in r]
    labels = [f"{r['system']} {r['capacity']:,}, frames on {r['frames_tier']}" for r in rows]
    y = np.arange(len(rows))
    fig, ax = plt.subplots(1, 2, figsize=(11, 0.5 * len(rows) + 1.6), sharey=True)
    anon = [r.get("rss_anon_gib", r["rss_gib"]) for r in rows]
    ax[0].barh(y, anon, label="anonymous")
    ax[0].barh(y, [r.get("rss_file_gib", 0.0) for r in rows], left=anon, label="file-mapped (memmap)")
    ax[0].set_xlabel("resident memory grown (GiB)")
    ax[0].legend(fontsize=8)
    ax[1].barh(y, [r["sample_update_p50_ms"] for r in rows], label="p50")
    ax[1].plot([r["sample_update_p99_ms"] for r in rows], y, "k|", markersize=14, label="p99")
    ax[1].set_xlabel("prioritized sample + update, batch 32 (ms)")
    ax[1].legend(fontsize=8)
    ax[0].set_yticks(y, labels)
    ax[0].invert_yaxis()
    script.save_figure(fig, png)


def main() -> None:
    p = script.parser(__doc__, quick="capacity 20k (a check)", out=None)
    p.add_argument("--capacity", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=64, choices=[64, 84])
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument(
        "--frames",
        nargs="+",
        default=["auto", "disk"],
        choices=["auto", "disk"],
        help="auto: the planner places the frames (host here); disk: a RAM budget holding only the rows",
    )
    p.add_argument(
        "--systems",
        nargs="+",
        default=["conduit", "native"],
        choices=["conduit", "native"],
        help="cells to run",
    )
    p.add_argument(
        "--disk-dir", type=Path, default=None, help="the disk tier's directory (default: a temporary one)"
    )
    p.add_argument("--cell", nargs=3, metavar=("SYSTEM", "CAPACITY", "FRAMES"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cell:  # one cell, in this process: its row as the last line of stdout
        system, cap, frames = args.cell[0], int(args.cell[1]), args.cell[2]
        if system == "conduit":
            row = conduit_cell(cap, args.dim, args.rounds, frames, args.disk_dir)
        else:
            row = native_cell(cap, args.dim, args.rounds, BATCH, NUM_FRAMES, fragments, memory, memory_growth)
        print(json.dumps(row))
        return
    if args.quick:
        args.capacity, args.rounds = [20_000], 300
        args.out = args.out or Path("/tmp/rllib_atari_quick.json")
    tok = provenance.start()
    cells = [("conduit", c, f) for c in args.capacity for f in args.frames if "conduit" in args.systems]
    cells += [("native", c, "auto") for c in args.capacity if "native" in args.systems]
    rows = []
    with tempfile.TemporaryDirectory(prefix="conduit_frames_", dir=args.disk_dir) as disk:
        for system, cap, frames in cells:  # each cell in a process of its own: its memory is its own
            argv = [sys.executable, __file__, "--cell", system, str(cap), frames, "--dim", str(args.dim)]
            argv += ["--rounds", str(args.rounds), "--disk-dir", disk]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"cell {system} {cap} {frames} failed:\n{proc.stderr[-3000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    record = {"rows": rows, "ratios": ratios(rows), "machine": provenance.finish(tok)}
    print(record["ratios"])
    print(script.write_result("rllib_atari", args, record, lambda png: plot(rows, png)))


if __name__ == "__main__":
    main()
