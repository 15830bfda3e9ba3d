"""The ``torchrl_frames`` cell of ``rllib_atari.py``: TorchRL's frame-once path, in the TorchRL venv.

TorchRL 0.14.1's own API for stacks built at sample time: ``CatFrames(N=4, dim=-3, in_keys=["pixels"],
out_keys=["pixels_stack"]).make_rb_transform_and_sampler(batch_size=32, traj_key="episode", ...)`` gives
the buffer transform (reshape each sampled slice to ``[32, 4]``, unfold ``CatFrames`` along it, keep the
last step; on write, drop the stacked keys) and a ``SliceSampler(slice_len=4)``. The sampler is swapped
for its prioritized twin ``PrioritizedSliceSampler(capacity, 0.5, 0.4, slice_len=4, ...)``, as TorchRL's
docs pair a slice sampler with a buffer batch of ``32 * 4`` (the helper's multiplier lives in
``SliceSampler.sample``, which the prioritized sampler overrides). ``ReplayBuffer(LazyMemmapStorage(
capacity, scratch_dir=...), ...)``: a plain buffer, as the docs use (a ``TensorDictReplayBuffer`` cannot
set the ``[128]`` sample index on the ``[32]`` batch). Each transition stores single uint8 frames
``pixels`` and ``("next", "pixels")`` ``[1, H, W]`` (no stacks), ``action``, ``episode`` (the trajectory
key) and ``("next", "reward" | "done" | "terminated")``.

Priorities: the sampler draws slice *starts* by priority, so a transition's new priority is written at
its slice's start (three steps back), which makes it the probability of training on that transition.
Trajectory boundaries are cached between writes (``cache_values=True``, which TorchRL 0.14.1 drops on
every write: here no write falls between timed samples, the setting most favourable to TorchRL);
``--per-sample-boundaries`` recomputes them per sample, as a loop writing between samples pays.
``--sampler uniform`` keeps the helper's ``SliceSampler`` (no priority update; ratios refused).

Measured as ``torchrl_atari.py`` (same stream, timers, warm-up, write-back and disk check). Prints the
row as one JSON line, last on stdout. Usage: ``python torchrl_atari_frames.py --capacity N --dim D
--rounds R --scratch-dir DIR [--sampler prioritized|uniform] [--per-sample-boundaries]``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from atari_stream import episode_fragments, latency, memory, memory_growth  # noqa: E402
from torchrl_atari import ALPHA, BETA, NUM_FRAMES, WARMUP, cell_parser, disk_bytes, parse_cell, versions  # noqa: E402

SYSTEM, N_STEP = "torchrl_frames", 1


def transition_bytes(dim: int) -> int:
    """Bytes one stored transition takes: two uint8 frames (pixels, next pixels), action int64, episode
    int64, reward float32, done, terminated."""
    return 2 * dim * dim + 8 + 8 + 4 + 1 + 1


def columns(steps: int, dim: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """Per fragment of ``atari_stream``'s episodes (the other cells' stream), the columns one ``extend``
    writes: single frames ``pixels`` / ``next_pixels`` ``[n, 1, dim, dim]`` uint8, ``action``, ``episode``
    (a number per episode), ``reward`` ``[n, 1]`` and ``done`` ``[n, 1]`` (the episode's last step)."""
    episode = -1
    for f in episode_fragments(steps, dim, seed):
        if f.t0 == 0:  # a new episode
            episode += 1
        n = f.t1 - f.t0
        done = np.zeros((n, 1), bool)
        done[-1] = f.terminated
        yield {
            "pixels": f.frames[f.t0 : f.t1].transpose(0, 3, 1, 2),
            "next_pixels": f.frames[f.t0 + 1 : f.t1 + 1].transpose(0, 3, 1, 2),
            "action": f.actions.astype(np.int64),
            "episode": np.full(n, episode, np.int64),
            "reward": f.rewards[:, None],
            "done": done,
        }


def work_record(env_steps: int, inserted: int, rounds: int, prioritized: bool, stored: int) -> dict[str, Any]:
    """What the cell did: the counters the ratios compare (``env_steps``, ``samples``, ``updates``,
    ``sampler``) and what it stored (``bytes_per_transition``) and trained on (1-step)."""
    return {
        "env_steps": env_steps,
        "inserted": inserted,
        "samples": rounds,
        "updates": rounds if prioritized else 0,
        "sampler": "prioritized" if prioritized else "uniform",
        "n_step": N_STEP,
        "bytes_per_transition": stored,
    }


def refusal(capacity: int, dim: int, scratch_dir: Path) -> str | None:
    """Why a memmap of ``capacity`` transitions does not fit the scratch directory's free disk, or None."""
    need, free = capacity * transition_bytes(dim), shutil.disk_usage(scratch_dir).free
    if need <= 0.9 * free:
        return None
    return (
        f"does not fit: the memmap of {capacity:,} transitions (uint8 [1, {dim}, {dim}] pixels and next "
        f"pixels) needs {need / 2**30:.1f} GiB of disk, {scratch_dir} has {free / 2**30:.1f} GiB free"
    )


def make_buffer(capacity: int, batch: int, scratch: Path, prioritized: bool, cache: bool) -> Any:
    """TorchRL's frame-once buffer: the ``CatFrames`` helper's transform, its slice sampler (or the
    prioritized one), on a ``LazyMemmapStorage``."""
    from torchrl.data import LazyMemmapStorage, PrioritizedSliceSampler, ReplayBuffer
    from torchrl.envs import CatFrames

    # reset_key given: its default is looked up on a parent env, and this transform has none
    catframes = CatFrames(
        N=NUM_FRAMES, dim=-3, in_keys=["pixels"], out_keys=["pixels_stack"], reset_key="_reset"
    )
    kw = {"traj_key": "episode", "strict_length": True, "cache_values": cache}
    kw |= {"truncated_key": None, "init_key": None}  # the DQN batch needs neither marker
    transform, sampler = catframes.make_rb_transform_and_sampler(batch_size=batch, **kw)
    if prioritized:
        sampler = PrioritizedSliceSampler(capacity, ALPHA, BETA, slice_len=NUM_FRAMES, **kw)
    storage = LazyMemmapStorage(capacity, scratch_dir=str(scratch))
    size = batch * NUM_FRAMES if prioritized else batch  # the helper's sampler multiplies by N itself
    return ReplayBuffer(storage=storage, sampler=sampler, transform=transform, batch_size=size)


def check_stacks(sample: Any, batch: int, dim: int) -> dict[str, Any]:
    """The batch's shapes; fails unless each stack ends on its step's frame and the next stack is the
    stack shifted by one frame."""
    stack, nxt = sample["pixels_stack"], sample["next", "pixels_stack"]
    assert stack.shape == nxt.shape == (batch, NUM_FRAMES, dim, dim), (stack.shape, nxt.shape)
    assert torch.equal(stack[:, -1:], sample["pixels"]) and torch.equal(nxt[:, -1:], sample["next", "pixels"])
    assert torch.equal(stack[:, 1:], nxt[:, :-1])
    return {"pixels": list(stack.shape), "next.pixels": list(nxt.shape), "dtype": str(stack.dtype)}


def frames_cell(
    capacity: int, dim: int, rounds: int, batch: int, scratch_dir: Path, sampler: str, cache: bool
) -> dict[str, Any]:
    """Fill the frame-once buffer to ``capacity`` transitions, then time sample (+ priority update)."""
    row: dict[str, Any] = {"system": SYSTEM, "capacity": capacity, "dim": dim, "frames_tier": "disk"}
    scratch_dir.mkdir(parents=True, exist_ok=True)
    why = refusal(capacity, dim, scratch_dir)
    if why:
        return row | {"refused": why}
    from tensordict import TensorDict

    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)  # PrioritizedSampler draws its masses with np.random
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="The last dimension of the tensordict should be marked")
    prioritized = sampler == "prioritized"
    scratch = Path(tempfile.mkdtemp(prefix="torchrl_memmap_", dir=scratch_dir))
    try:
        mem0 = memory()
        rb = make_buffer(capacity, batch, scratch, prioritized, cache)
        add_s, steps, inserted = 0.0, 0, 0
        for i, c in enumerate(columns(capacity, dim, seed=0)):
            t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in c.items()}
            n = len(t["action"])
            nxt = {"pixels": t["next_pixels"], "reward": t["reward"], "done": t["done"]}
            td = TensorDict(
                {
                    **{k: t[k] for k in ("pixels", "action", "episode")},
                    "next": nxt | {"terminated": t["done"].clone()},
                },
                batch_size=[n],
            )
            t0 = time.perf_counter()
            rb.extend(td)
            if i > 0:  # the first extend creates the memmap files
                add_s += time.perf_counter() - t0
                inserted += n
            steps += n
        os.sync()  # untimed: the fill's dirty pages written back, as the recipe cell
        rng = np.random.default_rng(1)
        prios = iter([torch.from_numpy(rng.random(batch).astype(np.float32)) for _ in range(rounds + WARMUP)])
        last: list[Any] = []

        def sample_update(buffer: Any = rb) -> None:
            sample, info = buffer.sample(return_info=True)
            if prioritized:  # each slice's start: the position the sampler drew by priority
                index = info["index"][0] if isinstance(info["index"], tuple) else info["index"]
                buffer.update_priority(index.reshape(batch, NUM_FRAMES)[:, 0], next(prios))
            last[:] = [sample]

        timed = latency(sample_update, rounds, WARMUP)
        stored = rb.storage._storage  # the memmap TensorDict: what a transition holds on disk
        keys = [k if isinstance(k, tuple) else (k,) for k in stored.keys(True, True)]
        assert not any("pixels_stack" in k for k in keys), keys  # no stacks stored
        per = sum(v.numel() // capacity * v.element_size() for v in stored.values(True, True))
        row.update(
            {
                "memory_budget": None,
                **memory_growth(mem0),
                "disk_gib": round(disk_bytes(scratch) / 2**30, 3),
                "frames_gib": round(2 * capacity * dim * dim / 2**30, 3),
                "insert_steps_per_s": round(inserted / add_s),
                **timed,
                "batch": check_stacks(last[0], batch, dim),
                "work": work_record(steps, int(rb.write_count), rounds, prioritized, per),
                "sampler": {
                    "class": type(rb.sampler).__name__,
                    "slice_len": NUM_FRAMES,
                    "cache_values": cache,
                },
                "versions": versions(),
            }
        )
        last.clear()
        del rb, sample_update, stored
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return row


def main() -> None:
    ap = cell_parser(__doc__)
    ap.add_argument("--sampler", choices=["prioritized", "uniform"], default="prioritized")
    ap.add_argument(
        "--per-sample-boundaries", action="store_true", help="cache_values=False: boundaries found per sample"
    )
    args = parse_cell(ap)
    cache = not args.per_sample_boundaries
    row = frames_cell(args.capacity, args.dim, args.rounds, args.batch, args.scratch_dir, args.sampler, cache)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
