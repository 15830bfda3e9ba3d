"""The consume-once Conduit the core's runtime tests build: a FIFO buffer that readers wait on."""

from __future__ import annotations

from typing import Any

from conduit import BufferConfig, Conduit, RateLimit, SchedulerConfig, Schema


def fifo_conduit(
    schema: Schema,
    overlap: str,
    capacity: int,
    timeout_s: float,
    *,
    mode: str = "block",
    g_ing: int = 1,
    g_del: int = 1,
    **kw: Any,
) -> Conduit:
    """A Conduit over ``schema`` on a FIFO buffer of ``capacity`` items: a get waits (``mode`` block) up
    to ``timeout_s`` for its items, from the first item on; the queue depth covers ``g_ing`` and
    ``g_del``. ``kw`` go to ``Conduit`` (operators, device, ...)."""
    buf = BufferConfig(
        capacity=capacity, sampler="fifo", rate_limit=RateLimit(min_size=0, mode=mode, timeout_s=timeout_s)
    )
    sched = SchedulerConfig(overlap=overlap, g_ing=g_ing, g_del=g_del, depth=max(2, g_ing, g_del))
    return Conduit(schema, buf, sched, **kw)
