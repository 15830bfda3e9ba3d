"""Atari DQN replay at 100k and 1M transitions (issue 31): the buffer cells, Conduit, native RLlib and TorchRL.

    python benchmarks/rllib_atari.py [--quick] [--capacity N ...] [--dim 64|84]
        [--systems conduit native torchrl torchrl_frames] [--torchrl-python PY] [--setup-torchrl] [--out FILE]

Per capacity: Conduit's frame-once replay (``ConduitReplay`` with ``FrameStacking(num_frames=4)``), with
frames where the planner puts them and on the disk tier (a RAM budget holding only the transition rows);
native RLlib's ``PrioritizedEpisodeReplayBuffer`` with env-stacked float32 observations
(``rllib_atari_native.py``); TorchRL's memmapped prioritized buffer (``peers/torchrl_atari.py``, in the venv
of ``envs/setup_torchrl.sh``) laid out as its DQN recipe (both 4-frame stacks per transition), and TorchRL's
frame-once path, ``torchrl_frames`` (``peers/torchrl_atari_frames.py``: ``CatFrames``'s replay transform,
a prioritized slice sampler, single frames stored). Refused rows say why (no venv, not enough memory or
disk). Measured: insert rate, sample + priority update latency at batch 32 (p50 / p99, the training batch
built), resident memory, memmap disk and observation bytes, on Atari-shaped stand-in episodes
(``atari_stream.py``), not ALE. Ratios (peer ÷ Conduit) are refused where the work differs (a uniform
sampler included); ``targets_met`` judges the TorchRL target (the recipe layout's cell).
Method: ``benchmarks/notes/rllib_atari.md``. ``--quick`` (capacity 20k) writes to /tmp unless ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import script  # noqa: E402
from atari_stream import episode_fragments, latency, meminfo, memory, memory_growth  # noqa: E402
from rllib_atari_native import native_cell  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from torchrl_driver import DEFAULT_PYTHON, ensure_env  # noqa: E402

BATCH, N_STEP, NUM_FRAMES = 32, 3, 4


def fragments(steps: int, dim: int, seed: int):
    """Lists of one RLlib episode chunk per fragment of ``atari_stream.episode_fragments`` (4 steps
    each, episodes of geometric length) covering ``steps``: normalized float32 observations."""
    import gymnasium as gym
    from conduit_rllib.compat import SingleAgentEpisode

    space = gym.spaces.Box(-1.0, 1.0, (dim, dim, 1), np.float32)
    obs = None
    for f in episode_fragments(steps, dim, seed):
        if f.t0 == 0:  # a new episode: normalize its frames once
            obs = f.frames.astype(np.float32) / np.float32(128) - np.float32(1)
        assert obs is not None
        chunk = SingleAgentEpisode(
            id_=f.ep_id,
            observations=list(obs[f.t0 : f.t1 + 1]),
            actions=list(f.actions),
            rewards=list(f.rewards),
            terminated=f.terminated,
            observation_space=space,
            t_started=f.t0,
            len_lookback_buffer=0,
        )
        yield [chunk.to_numpy()]


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
    add_s, steps, inserted = 0.0, 0, 0
    for i, chunks in enumerate(fragments(capacity, dim, seed=0)):
        t0 = time.perf_counter()
        n = replay.add(chunks, version=0)
        if i > 0:  # the first add builds the stores and loads their kernels
            add_s += time.perf_counter() - t0
            inserted += n
        steps += n
    replay.flush()
    c = replay.conduits["default_policy"]
    store = replay.packers["default_policy"].store
    rng = np.random.default_rng(1)

    def sample_update() -> None:
        train = replay.sample(BATCH)
        replay.update_priorities(train, {"default_policy": rng.random(BATCH).astype(np.float32)})

    timed = latency(sample_update, rounds)
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
        "insert_steps_per_s": round(inserted / add_s),
        **timed,
        "work": {"env_steps": steps, "inserted": c.buffer.inserted, "samples": rounds, "updates": rounds},
    }
    replay.close()
    return row


PEERS = ("native", "torchrl", "torchrl_frames")
SYSTEMS = ("conduit", *PEERS)
#: the TorchRL venv's cells: system -> its script under ``peers/``
TORCHRL_CELLS = {"torchrl": "torchrl_atari.py", "torchrl_frames": "torchrl_atari_frames.py"}
#: what two cells' work must share for a ratio (a row whose work has no ``sampler`` sampled by priority)
WORK_KEYS = ("env_steps", "samples", "updates", "sampler")
TARGET_CAPACITY, TARGET_TORCHRL_P50 = 1_000_000, 3.0  # issue 31: Conduit >= 3x faster than TorchRL at 1M
TARGET_NAME = f"Conduit (frames on disk) p50 >= {TARGET_TORCHRL_P50:g}x faster than TorchRL's memmap at 1M"


def same_work(a: dict, b: dict) -> bool:
    """Whether two rows' work records agree on :data:`WORK_KEYS` (``sampler`` defaults to prioritized)."""
    wa, wb = ({"sampler": "prioritized"} | r["work"] for r in (a, b))
    return all(wa[k] == wb[k] for k in WORK_KEYS)


def ratios(rows: list[dict]) -> dict[str, object]:
    """Each peer (native RLlib, TorchRL's recipe layout, TorchRL's frame-once path) ÷ Conduit per capacity
    and Conduit frame tier (latency p50 / p99, resident memory; insert rate Conduit ÷ peer), refused where
    the work (env steps, samples, updates, prioritized or uniform sampler) differs or the peer's cell was
    refused."""
    out: dict[str, object] = {}
    for peer in PEERS:
        others = {r["capacity"]: r for r in rows if r["system"] == peer}
        for c in (r for r in rows if r["system"] == "conduit"):
            key = f"{c['capacity']}/frames_on_{c['frames_tier']}"
            n = others.get(c["capacity"])
            if n is None:
                continue
            if "refused" in n:
                out[f"refused/{peer}/{key}"] = f"{peer}: {n['refused']}"
                continue
            if not same_work(n, c):
                out[f"refused/{peer}/{key}"] = f"work differs: {peer} {n['work']}, conduit {c['work']}"
                continue
            for m in ("sample_update_p50_ms", "sample_update_p99_ms", "rss_gib"):
                if c[m]:
                    out[f"{m}/{peer}_over_conduit/{key}"] = round(n[m] / c[m], 2)
            out[f"insert_steps_per_s/conduit_over_{peer}/{key}"] = round(
                c["insert_steps_per_s"] / n["insert_steps_per_s"], 2
            )
    return out


def targets(rows: list[dict], ratio: dict[str, object]) -> dict[str, object]:
    """The issue's TorchRL target: met / missed from the p50 ratio at 1M with Conduit's frames on the disk
    tier, or why it is not judged (a cell not run, refused, or with different work)."""
    key = f"{TARGET_CAPACITY}/frames_on_disk"
    value = ratio.get(f"sample_update_p50_ms/torchrl_over_conduit/{key}")
    if isinstance(value, (int, float)):
        return {TARGET_NAME: value >= TARGET_TORCHRL_P50}
    why = ratio.get(f"refused/torchrl/{key}")
    if why is None:
        ran = {(r["system"], r["capacity"], r.get("frames_tier")) for r in rows}
        missing = [
            c
            for c in (("conduit", TARGET_CAPACITY, "disk"), ("torchrl", TARGET_CAPACITY, "disk"))
            if c not in ran
        ]
        why = f"not run: {', '.join(f'{s} at {c:,} (frames on {t})' for s, c, t in missing)}"
    return {TARGET_NAME: f"not judged ({why})"}


def torchrl_row(
    python: Path, cap: int, dim: int, rounds: int, disk: str, why_not: str | None, system: str = "torchrl"
) -> dict:
    """A TorchRL cell (``system``: a key of :data:`TORCHRL_CELLS`) in a process of the TorchRL venv (its
    row comes back as JSON), or a refused row saying why the venv cannot run it."""
    row = {"system": system, "capacity": cap, "dim": dim, "frames_tier": "disk"}
    if why_not:
        return row | {"refused": why_not}
    argv = [str(python), str(Path(__file__).resolve().parent / "peers" / TORCHRL_CELLS[system])]
    argv += ["--capacity", str(cap), "--dim", str(dim), "--rounds", str(rounds), "--scratch-dir", disk]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the main venv's paths stay out
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"cell {system} {cap} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    ax[1].set_xscale("log")  # sub-ms cells beside a memmap that reads the device
    ax[1].set_xlabel("prioritized sample + update, batch 32 (ms, log scale)")
    ax[1].legend(fontsize=8)
    ax[0].set_yticks(y, labels)
    ax[0].invert_yaxis()
    script.save_figure(fig, png)


def cli() -> argparse.ArgumentParser:
    """The command line (its defaults: both capacities, every system of :data:`SYSTEMS`)."""
    p = script.parser(__doc__, quick="capacity 20k (a check)", out=None)
    p.add_argument("--capacity", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=64, choices=[64, 84])
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS, help="cells to run")
    p.add_argument(
        "--torchrl-python", type=Path, default=DEFAULT_PYTHON, help="python of the TorchRL venv (its cell)"
    )
    p.add_argument(
        "--setup-torchrl", action="store_true", help="build the TorchRL venv first if it is missing"
    )
    p.add_argument(
        "--disk-dir", type=Path, default=None, help="the disk tier's directory (default: a temporary one)"
    )
    p.add_argument("--cell", nargs=3, metavar=("SYSTEM", "CAPACITY", "FRAMES"), help=argparse.SUPPRESS)
    return p


def main() -> None:
    p = cli()
    args = p.parse_args()
    if min(args.capacity) <= 0 or args.rounds <= 0:
        p.error(f"--capacity and --rounds must be positive, got {args.capacity} and {args.rounds}")
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
    cells = [("conduit", c, f) for c in args.capacity for f in ("auto", "disk") if "conduit" in args.systems]
    cells += [("native", c, "auto") for c in args.capacity if "native" in args.systems]
    cells += [(s, c, "disk") for s in TORCHRL_CELLS for c in args.capacity if s in args.systems]
    torchrl_why_not = (
        ensure_env(args.torchrl_python, args.setup_torchrl)
        if set(TORCHRL_CELLS) & set(args.systems)
        else None
    )
    if torchrl_why_not:
        print(f"!! torchrl UNAVAILABLE: {torchrl_why_not}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="conduit_frames_", dir=args.disk_dir) as disk:
        for system, cap, frames in cells:  # each cell in a process of its own: its memory is its own
            if system in TORCHRL_CELLS:  # in the TorchRL venv
                why = torchrl_why_not
                rows.append(torchrl_row(args.torchrl_python, cap, args.dim, args.rounds, disk, why, system))
                print(rows[-1], flush=True)
                continue
            argv = [sys.executable, __file__, "--cell", system, str(cap), frames, "--dim", str(args.dim)]
            argv += ["--rounds", str(args.rounds), "--disk-dir", disk]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"cell {system} {cap} {frames} failed:\n{proc.stderr[-3000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    ratio = ratios(rows)
    record = {"rows": rows, "ratios": ratio, "targets_met": targets(rows, ratio)}
    # MemTotal bounds the page cache a memmap's reads can hit
    record["machine"] = script.machine(tok, mem_total_gib=round(meminfo("MemTotal") / 2**30, 1))
    print(record["ratios"], record["targets_met"])
    script.write_result("rllib_atari", args, record, lambda png: plot(rows, png))


if __name__ == "__main__":
    main()
