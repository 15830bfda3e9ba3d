"""What every cell of ``rllib_atari.py`` shares, whichever venv runs it (numpy and the standard library
only): the Atari-shaped stand-in episodes (:func:`episode_fragments`: one seed, one stream, the same env
steps for every system), the latency timer and the memory readers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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


def latency(step: Callable[[], object], rounds: int, warmup: int = 50) -> dict[str, float]:
    """p50 / p99 milliseconds of ``rounds`` calls of ``step`` (a prioritized sample + priority update),
    after ``warmup`` calls not counted."""
    lat = []
    for i in range(rounds + warmup):
        t0 = time.perf_counter()
        step()
        if i >= warmup:
            lat.append(time.perf_counter() - t0)
    ms = np.asarray(lat) * 1e3
    p50, p99 = float(np.median(ms)), float(np.percentile(ms, 99))
    return {"sample_update_p50_ms": round(p50, 3), "sample_update_p99_ms": round(p99, 3)}


def meminfo(key: str) -> int:
    """``/proc/meminfo``'s ``key`` (``MemTotal``, ``MemAvailable``) in bytes, 0 where absent."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


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


__all__ = [
    "FRAGMENT",
    "MEAN_LIFE",
    "Fragment",
    "episode_fragments",
    "latency",
    "meminfo",
    "memory",
    "memory_growth",
]
