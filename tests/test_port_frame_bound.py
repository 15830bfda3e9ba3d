"""Issue 49, item 3: a data port never buffers a frame larger than its bound (``ZMQ_MAXMSGSIZE``): the
frame is refused unread, signed or not, and the port goes on serving; a client refuses to send one."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("zmq")

import zmq  # noqa: E402
from port_calls import call, never_dead, raw_socket  # noqa: E402

from conduit.errors import ConduitError, ConfigError  # noqa: E402
from conduit.port import MAX_FRAME_BYTES, DataPort, PortClient, Protocol  # noqa: E402

BOUND = 64 << 10  # a small bound keeps the frames of this test small


class Rows:
    def __init__(self) -> None:
        self.rows: dict[int, torch.Tensor] = {}

    def put(self, keys: np.ndarray, values: torch.Tensor) -> int:
        self.rows.update(zip(keys.tolist(), values))
        return len(self.rows)


PROTOCOL = Protocol({"put": ("keys", "values")})


@pytest.fixture
def port():
    server = DataPort(Rows(), PROTOCOL, threading.Lock(), "127.0.0.1", max_frame_bytes=BOUND)
    yield server
    server.close()


def put_unchecked(port: DataPort, values: torch.Tensor, timeout_s: float) -> object:
    """A signed ``put`` from a client that would send frames up to 64 times the port's bound."""

    async def main() -> object:
        client = PortClient(port.address, port.key, port.protocol, max_frame_bytes=64 * BOUND)
        try:
            return await client.call("put", (np.arange(len(values)), values), timeout_s, never_dead)
        finally:
            client.close()

    return asyncio.run(main())


def test_the_socket_refuses_frames_over_the_bound_before_reading_them(port):
    assert port.socket.getsockopt(zmq.MAXMSGSIZE) == BOUND
    default = DataPort(Rows(), PROTOCOL, threading.Lock(), "127.0.0.1")
    try:
        assert default.socket.getsockopt(zmq.MAXMSGSIZE) == MAX_FRAME_BYTES == 1 << 30
    finally:
        default.close()


def test_a_frame_just_over_the_bound_is_dropped_unread_and_the_port_keeps_serving(port):
    with raw_socket(port.address) as raw:  # unsigned: never reaches the MAC check
        raw.send_multipart([b"m" * 32, b"{}", b"x" * (BOUND + 1)])
        assert not raw.poll(300)
    over = torch.zeros(1, BOUND // 4 + 1)  # one row: a frame of BOUND + 4 bytes, signed
    with pytest.raises(TimeoutError):
        put_unchecked(port, over, timeout_s=1.0)
    assert not port.target.rows and sum(port.refused.values()) == 0  # nothing of either was read
    assert call(port, "put", np.arange(2), torch.ones(2, 3)) == 2  # valid signed requests still served
    at = torch.zeros(1, BOUND // 4)  # a frame of exactly the bound
    assert put_unchecked(port, at, timeout_s=10.0) == 2


def test_a_client_refuses_to_send_a_frame_over_the_bound_naming_it(port):
    async def main() -> None:
        client = PortClient(port.address, port.key, port.protocol, max_frame_bytes=BOUND)
        try:
            await client.call("put", (np.arange(1), torch.zeros(1, BOUND)), 5, never_dead)
        finally:
            client.close()

    with pytest.raises(ConduitError, match=rf"a frame of {4 * BOUND} bytes.*at most {BOUND} bytes per frame"):
        asyncio.run(main())
    assert call(port, "put", np.arange(1), torch.ones(1)) == 1


def test_the_bound_must_be_a_size():
    for bad in (0, 10, True, 1.5):
        with pytest.raises(ConfigError, match="max_frame_bytes"):
            DataPort(Rows(), PROTOCOL, threading.Lock(), "127.0.0.1", max_frame_bytes=bad)
