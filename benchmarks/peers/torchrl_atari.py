"""The TorchRL cell of ``rllib_atari.py``; runs inside the TorchRL venv (``envs/setup_torchrl.sh``).

``TensorDictReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=...), sampler=
PrioritizedSampler(capacity, alpha, beta), batch_size=32)``: the storage TorchRL's DQN Atari recipe
(``sota-implementations/dqn``) gives its 1M buffer, with the prioritized sampler the issue names (the
recipe samples uniformly). Each transition holds what TorchRL's ``CatFrames(N=4, dim=-3)`` env emits:
the stacked pixels ``[4, H, W]`` and the next step's ``("next", "pixels")``, both uint8 (the recipe's
``ToTensorImage`` would make them float32, four times the bytes: uint8 is TorchRL's lightest layout),
with ``action``, ``("next", "reward" | "done" | "terminated")``. The episodes are the other cells'
(``atari_stream.episode_fragments``, same seed, same env steps); the stacks are built outside the
timed region (the env's work, as the native cell's ``EnvStacker``).

Measured like the other cells: ``extend`` of each 4-step fragment as one TensorDict (env steps per
second, the first extend, which creates the memmap files, not counted), then ``sample()`` (the batch of
stacked pixels gathered from the memmap into tensors) + ``update_priority`` with new priorities at
batch 32 (the fill's dirty pages written back first, untimed; 50 warm-up rounds, then ``rounds`` timed:
p50 / p99), the resident memory grown (VmRSS, anonymous and file-mapped) and the disk the memmap files
occupy (allocated blocks). A memmap larger than the page cache can hold makes a sample read the device
(its latency then measures that). A capacity whose memmap would not fit the scratch directory's free
disk is refused with what it needs.

Prints the row as one JSON line, last on stdout. Usage: ``python torchrl_atari.py --capacity N --dim D
--rounds R --scratch-dir DIR``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from atari_stream import episode_fragments, latency, memory, memory_growth  # noqa: E402

NUM_FRAMES, ALPHA, BETA, WARMUP = 4, 0.5, 0.4, 50  # alpha / beta: the Conduit cell's


def transition_bytes(dim: int) -> int:
    """Bytes one stored transition takes in the memmap files."""
    pixels = 2 * NUM_FRAMES * dim * dim  # pixels and ("next", "pixels"), uint8
    return pixels + 8 + 4 + 1 + 1 + 8  # action int64, reward f32, done, terminated, the sampler's index


def disk_bytes(root: Path) -> int:
    """Bytes the files under ``root`` occupy on disk (allocated blocks, not apparent sizes)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, files in os.walk(root) for f in files)


def transitions(dim: int, seed: int) -> Any:
    """``(n, TensorDict)`` per fragment of ``atari_stream``'s episodes, as TorchRL's ``CatFrames`` env
    hands them to the buffer: stacks of the last 4 frames (zeros before the episode's first frame)."""
    from tensordict import TensorDict

    def gen(steps: int):
        stacks = None
        for f in episode_fragments(steps, dim, seed):
            if f.t0 == 0:  # a new episode: its stacks [L + 1, 4, H, W], one window per observation
                frames = f.frames[..., 0]
                padded = np.concatenate([np.zeros((NUM_FRAMES - 1, dim, dim), np.uint8), frames])
                stacks = np.lib.stride_tricks.sliding_window_view(padded, NUM_FRAMES, axis=0)
                stacks = stacks.transpose(0, 3, 1, 2)
            assert stacks is not None
            n = f.t1 - f.t0
            done = torch.zeros(n, 1, dtype=torch.bool)
            done[-1] = f.terminated
            td = TensorDict(
                {
                    "pixels": torch.from_numpy(np.array(stacks[f.t0 : f.t1])),
                    "action": torch.from_numpy(f.actions.astype(np.int64)),
                    "next": {
                        "pixels": torch.from_numpy(np.array(stacks[f.t0 + 1 : f.t1 + 1])),
                        "reward": torch.from_numpy(f.rewards).unsqueeze(-1),
                        "done": done,
                        "terminated": done.clone(),
                    },
                },
                batch_size=[n],
            )
            yield n, td

    return gen


def torchrl_cell(capacity: int, dim: int, rounds: int, batch: int, scratch_dir: Path) -> dict[str, Any]:
    """Fill the memmap buffer to ``capacity`` transitions, then time prioritized sample + update."""
    from torchrl.data import LazyMemmapStorage, PrioritizedSampler, TensorDictReplayBuffer

    row: dict[str, Any] = {"system": "torchrl", "capacity": capacity, "dim": dim, "frames_tier": "disk"}
    scratch_dir.mkdir(parents=True, exist_ok=True)
    need, free = capacity * transition_bytes(dim), shutil.disk_usage(scratch_dir).free
    if need > 0.9 * free:
        row["refused"] = (
            f"does not fit: the memmap of {capacity:,} transitions (uint8 [{NUM_FRAMES}, {dim}, {dim}] pixels "
            f"and next pixels) needs {need / 2**30:.1f} GiB of disk, {scratch_dir} has {free / 2**30:.1f} GiB free"
        )
        return row
    torch.set_num_threads(1)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    scratch = Path(tempfile.mkdtemp(prefix="torchrl_memmap_", dir=scratch_dir))
    try:
        mem0 = memory()
        rb = TensorDictReplayBuffer(
            storage=LazyMemmapStorage(capacity, scratch_dir=str(scratch)),
            sampler=PrioritizedSampler(capacity, ALPHA, BETA),
            batch_size=batch,
        )
        add_s, steps, inserted = 0.0, 0, 0
        for i, (n, td) in enumerate(transitions(dim, seed=0)(capacity)):
            t0 = time.perf_counter()
            rb.extend(td)
            if i > 0:  # the first extend creates the memmap files
                add_s += time.perf_counter() - t0
                inserted += n
            steps += n
        os.sync()  # untimed: the fill's dirty pages written back, so the timed reads do not queue behind them
        rng = np.random.default_rng(1)
        prios = iter([torch.from_numpy(rng.random(batch).astype(np.float32)) for _ in range(rounds + WARMUP)])
        last: list[Any] = []

        def sample_update(buffer: Any = rb) -> None:
            sample = buffer.sample()
            buffer.update_priority(sample["index"], next(prios))
            last[:] = [sample]

        timed = latency(sample_update, rounds, WARMUP)
        sample = last[0]
        assert sample["pixels"].shape == (batch, NUM_FRAMES, dim, dim), sample["pixels"].shape
        pixels = 2 * capacity * NUM_FRAMES * dim * dim
        row.update(
            {
                "memory_budget": None,
                **memory_growth(mem0),
                "disk_gib": round(disk_bytes(scratch) / 2**30, 3),
                "frames_gib": round(pixels / 2**30, 3),
                "insert_steps_per_s": round(inserted / add_s),
                **timed,
                "batch": {
                    "pixels": list(sample["pixels"].shape),
                    "next.pixels": list(sample["next", "pixels"].shape),
                    "dtype": str(sample["pixels"].dtype),
                },
                "work": {
                    "env_steps": steps,
                    "inserted": int(rb.write_count),
                    "samples": rounds,
                    "updates": rounds,
                },
                "versions": versions(),
            }
        )
        last.clear()
        del rb, sample, sample_update
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return row


def versions() -> dict[str, str]:
    """The versions a TorchRL cell ran on (torch, torchrl, tensordict)."""
    import tensordict
    import torchrl

    return {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__}


def cell_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments every TorchRL cell script takes (capacity, dim, rounds, batch, scratch dir)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument(
        "--scratch-dir", type=Path, required=True, help="where the memmap files go (removed after)"
    )
    return ap


def parse_cell(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """``ap``'s arguments, refusing a count that is not positive."""
    args = ap.parse_args()
    for name in ("capacity", "dim", "rounds", "batch"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive, got {getattr(args, name)}")
    return args


def main() -> None:
    args = parse_cell(cell_parser(__doc__))
    row = torchrl_cell(args.capacity, args.dim, args.rounds, args.batch, args.scratch_dir)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
