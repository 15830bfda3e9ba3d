"""What every cell of ``rllib_atari.py`` shares, whichever venv runs it (numpy and the standard library
only: TorchRL's cell imports it from its own venv): the Atari-shaped stand-in episodes and the resident
memory readers.

``episode_fragments(steps, dim, seed)`` yields the same fragments, in the same order, to every system:
episodes of geometric length (mean ``MEAN_LIFE``, a life) of random uint8 ``dim`` x ``dim`` frames, cut
into fragments of ``FRAGMENT`` env steps as RLlib's Atari DQN example samples them. One seed gives one
stream, so each system inserts the same env steps (the rows' ``work`` can be compared).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

FRAGMENT, MEAN_LIFE = 4, 60


class Fragment(NamedTuple):
    """Env steps ``t0 .. t1 - 1`` of episode ``ep_id``: ``frames`` is the whole episode's ``[L + 1, dim,
    dim, 1]`` uint8 observations (shared by its fragments), the fragment's observations are
    ``frames[t0 : t1 + 1]``."""

    ep_id: str
    frames: np.ndarray
    t0: int
    t1: int
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool


def episode_fragments(steps: int, dim: int, seed: int) -> Iterator[Fragment]:
    """Fragments of whole episodes covering at least ``steps`` env steps (the last episode is finished)."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < steps:
        length = int(rng.geometric(1 / MEAN_LIFE))
        frames = rng.integers(0, 256, (length + 1, dim, dim, 1), dtype=np.uint8)
        ep_id = f"ep{seed}-{done}"
        for t0 in range(0, length, FRAGMENT):
            t1 = min(length, t0 + FRAGMENT)
            actions = rng.integers(0, 6, t1 - t0)
            rewards = (rng.random(t1 - t0) < 0.05).astype(np.float32)
            yield Fragment(ep_id, frames, t0, t1, actions, rewards, t1 == length)
        done += length


def memory() -> dict[str, int]:
    """This process's resident memory in bytes (``/proc/self/status``): ``rss`` (VmRSS), ``anon``
    (RssAnon), ``file`` (RssFile: mapped file pages, e.g. a disk tier's memmap, which the kernel can
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


__all__ = ["FRAGMENT", "MEAN_LIFE", "Fragment", "episode_fragments", "memory", "memory_growth"]
