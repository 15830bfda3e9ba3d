"""Calls on a data port (``conduit.port``) from a test: one signed call as a client makes it, and a raw
socket that signs nothing (what a stranger on the network holds)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import zmq

from conduit.port import DataPort, PortClient


async def never_dead() -> None:
    """The liveness check of a port whose target never dies."""


def call(port: DataPort, method: str, *args: Any) -> Any:
    """``method(*args)`` on ``port`` from a client of its own (10 s to answer); its result or error."""

    async def main() -> Any:
        client = PortClient(port.address, port.key, port.protocol)
        try:
            return await client.call(method, args, 10, never_dead)
        finally:
            client.close()

    return asyncio.run(main())


@contextlib.contextmanager
def raw_socket(address: str) -> Iterator[zmq.Socket]:
    """A DEALER socket connected to ``address``, closed with its context on exit."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()
