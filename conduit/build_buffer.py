"""Building a buffer from its configuration: storage on the configured tier (or planned ones), writer,
sampler and rate limiter. Kept apart from :mod:`conduit.config`, which only describes and validates."""

from __future__ import annotations

import logging

import torch

from conduit.buffer.base import Sampler
from conduit.buffer.buffer import ExperienceBuffer
from conduit.buffer.rate_limiter import RateLimiter
from conduit.buffer.samplers import FifoSampler, PrioritizedSampler, UniformSampler
from conduit.buffer.storage import RingStorage
from conduit.buffer.writers import GroupedWriter, RingWriter
from conduit.config import BufferConfig
from conduit.discovery import local_topology
from conduit.errors import ConfigError
from conduit.metrics import Metrics
from conduit.placer import Placer, Traffic, initial_tiers, pinned_ram_bytes, within_memory_budget
from conduit.schema import Schema
from conduit.topology import Topology

log = logging.getLogger("conduit.placement")


def build_buffer(
    config: BufferConfig,
    schema: Schema,
    metrics: Metrics | None = None,
    seed: int | None = None,
    reader: str = "host",
    topology: Topology | None = None,
) -> ExperienceBuffer:
    """The buffer ``config`` describes for ``schema``: storage on ``config.tier``, writer, sampler and
    rate limiter.

    With ``tier="auto"`` the columns are planned for producers on the host and a consumer on
    ``reader`` (e.g. ``cuda:0``) on ``topology`` (default: this machine's, ``local_topology()``) within
    ``config.memory_budget``; the plan is logged, and ``buffer.placer`` keeps it current.
    """
    unknown = sorted(set(config.pins) - set(schema.names))
    if unknown:
        raise ConfigError(f"pins name unknown column(s) {unknown}; the schema has {list(schema.names)}")
    if config.tier == "auto":
        # Shared memory pays only where another process maps a column, which a buffer's own
        # traffic never does; pageable host is the same DRAM (their measured links differ by noise)
        # and, unlike shm here, gets transparent huge pages. So shm is planned only when pinned.
        topology = local_topology() if topology is None else topology
        if "shm" not in config.pins.values():
            topology = topology.without("shm")
        pinned = pinned_ram_bytes(schema, config.capacity, config.pins)
        topology = within_memory_budget(topology, config.memory_budget, config.pins, pinned)
        traffic = Traffic(config.capacity, config.capacity, readers=(reader,))
        tiers, chosen = initial_tiers(schema, config.capacity, topology, traffic, config.pins)
        log.info("conduit: buffer placement at start\n%s", chosen.explain())
        home = "host"
    else:
        tiers, home = dict(config.pins), config.tier
    storage = RingStorage(schema, config.capacity, home, config.disk_path, config.capacity_bytes, tiers=tiers)
    device = storage.device
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    sampler: Sampler
    if config.sampler == "uniform":
        sampler = UniformSampler(config.capacity, device, generator)
    elif config.sampler == "fifo":
        on_stale = "error" if config.rate_limit.mode == "error" else "evict"
        sampler = FifoSampler(config.capacity, device, config.rate_limit.max_staleness, on_stale)
    else:
        sampler = PrioritizedSampler(
            config.capacity, device, config.alpha, config.beta, config.priority_eps, generator
        )
    writer = (
        GroupedWriter(config.capacity, device, config.group_size)
        if config.writer == "grouped"
        else RingWriter(config.capacity, device)
    )
    buffer = ExperienceBuffer(
        storage,
        sampler,
        writer=writer,
        limiter=RateLimiter(config.rate_limit),
        metrics=metrics,
        nonfinite=config.nonfinite,
    )
    if config.tier == "auto":
        assert topology is not None  # planned above
        buffer.placer = Placer(buffer, topology, traffic, config.pins, memory_budget=config.memory_budget)
    return buffer
