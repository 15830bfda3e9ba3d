"""The workload of ``autotune.py`` (and ``granularity.py``): a real loop on the core. Per iteration a
producer does torch work (an MLP layer) and puts ``PUTS`` fragments of ``FRAG`` items (``dim`` float32
features and a reward); an ingestion operator normalises the features and discounts the rewards; the
consumer gets ``GETS`` batches of ``batch`` items and does torch work on each. Also the tuner's probes of
it (:class:`Probes`)."""

from __future__ import annotations

import statistics
import time

import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Operator, SchedulerConfig, Schema
from conduit.costmodel import Knobs

PUTS, GETS, FRAG, CAPACITY, HIDDEN = 8, 16, 32, 2048, 256
PREFILL = 256  # items put before a run is timed (sampling needs data; the ring fills as it runs)
EVAL_DIMS = (8, 64, 512, 2048, 8192)
PROBE_ITERS, PROBE_WARMUP = 3, 1  # iterations per probe of a candidate (warm-up: its first probe only)


def normalise(batch: ColumnBatch) -> ColumnBatch:
    """The ingestion operator: per-fragment feature normalisation and discounted rewards."""
    obs = batch["obs"]
    obs = (obs - obs.mean(0)) / (obs.std(0) + 1e-6)
    rew = batch["reward"]
    disc = torch.cumsum(rew.flip(0), 0).flip(0) * 0.99
    return ColumnBatch({"obs": obs, "reward": disc})


class SyntheticLoop:
    """One workload size: ``dim`` features per item, ``batch`` items per get, on ``device``."""

    def __init__(self, dim: int, batch: int, device: str, frag: int = FRAG) -> None:
        self.dim, self.batch, self.frag, self.device = dim, batch, frag, torch.device(device)
        g = torch.Generator().manual_seed(dim)
        self.x_prod = torch.randn(frag, HIDDEN, generator=g)
        self.w_prod = torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5
        self.w_in = (torch.randn(dim, HIDDEN, generator=g) / dim**0.5).to(self.device)
        self.w_out = (torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(self.device)
        self.fragment = ColumnBatch(
            {"obs": torch.randn(frag, dim, generator=g), "reward": torch.randn(frag, generator=g)}
        )
        self.schema = Schema([Column("obs", torch.float32, (dim,)), Column("reward", torch.float32)])

    @property
    def item_bytes(self) -> int:
        return 4 * self.dim + 4

    def produce(self) -> ColumnBatch:
        """The producer's compute for one fragment (a real layer), then the fragment."""
        torch.tanh(self.x_prod @ self.w_prod)
        return ColumnBatch({"obs": self.fragment["obs"] * 1.0, "reward": self.fragment["reward"] * 1.0})

    def consume(self, obs: torch.Tensor) -> None:
        """The consumer's compute on one delivered batch."""
        h = torch.relu(obs @ self.w_in)
        torch.relu(h @ self.w_out).sum().item()

    def compute_only(self, iters: int) -> tuple[float, float]:
        """Median producer and consumer seconds per iteration, without Conduit."""
        fake = torch.randn(self.batch, self.dim).to(self.device)
        prod, cons = [], []
        for _ in range(iters + 1):
            t0 = time.perf_counter()
            for _ in range(PUTS):
                self.produce()
            t1 = time.perf_counter()
            for _ in range(GETS):
                self.consume(fake)
            t2 = time.perf_counter()
            prod.append(t1 - t0)
            cons.append(t2 - t1)
        return statistics.median(prod[1:]), statistics.median(cons[1:])

    def open(self, knobs: Knobs) -> Conduit:
        """A ``Conduit`` under ``knobs`` holding ``PREFILL`` items (sampling needs data)."""
        sched = SchedulerConfig(knobs.overlap, knobs.depth, knobs.g_ing, knobs.g_del)
        buf = BufferConfig.uniform_replay(CAPACITY, timeout_s=60.0, tier=knobs.placement)
        conduit = Conduit(
            self.schema, buf, sched, ingest=[Operator("normalise", normalise)], device=self.device
        )
        conduit.put(ColumnBatch({"obs": torch.randn(PREFILL, self.dim), "reward": torch.randn(PREFILL)}))
        conduit.flush()
        return conduit

    def iterate(self, conduit: Conduit, iters: int, warmup: int) -> tuple[float, list[dict[str, float]]]:
        """Median seconds per iteration of ``iters`` iterations after ``warmup``, and their metrics."""
        walls, metrics = [], []
        for i in range(warmup + iters):
            conduit.end_iteration()
            t0 = time.perf_counter()
            for _ in range(PUTS):
                conduit.put(self.produce(), version=0)
            for _ in range(GETS):
                self.consume(conduit.get(self.batch).batch["obs"])
            wall = time.perf_counter() - t0
            if i >= warmup:
                walls.append(wall)
                metrics.append(conduit.end_iteration())
        return statistics.median(walls), metrics

    def run(self, knobs: Knobs, iters: int, warmup: int) -> tuple[float, list[dict[str, float]]]:
        """Median seconds per iteration under ``knobs`` (a fresh ``Conduit``) and the iterations' metrics."""
        conduit = self.open(knobs)
        try:
            return self.iterate(conduit, iters, warmup)
        finally:
            conduit.close(drain=False)


class Probes:
    """The tuner's measurements at one size: each candidate's ``Conduit`` is built once (with
    ``PROBE_WARMUP`` iterations) and kept open, so a repeated probe runs only ``PROBE_ITERS`` more;
    ``iterations`` counts every iteration run."""

    def __init__(self, loop: SyntheticLoop) -> None:
        self.loop = loop
        self.open: dict[Knobs, Conduit] = {}
        self.iterations = 0

    def __call__(self, knobs: Knobs) -> float:
        warmup = 0
        if knobs not in self.open:
            self.open[knobs], warmup = self.loop.open(knobs), PROBE_WARMUP
        self.iterations += PROBE_ITERS + warmup
        return self.loop.iterate(self.open[knobs], PROBE_ITERS, warmup)[0]

    def close(self) -> None:
        for conduit in self.open.values():
            conduit.close(drain=False)
        self.open.clear()
