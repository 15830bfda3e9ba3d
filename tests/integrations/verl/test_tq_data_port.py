"""The storage actor's data port without Ray: a NodeStore answered over ZMQ, calls matched by id."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")

from conduit_verl.errors import StorageBackendError  # noqa: E402
from conduit_verl.tq_store.columns import column_of, field_of  # noqa: E402
from conduit_verl.tq_store.store import PROTOCOL, NodeStore  # noqa: E402
from port_calls import call, never_dead, raw_socket  # noqa: E402

import conduit.port as data_port  # noqa: E402
from conduit.buffer.columns import from_wire, to_wire  # noqa: E402
from conduit.port import DataPort, PortClient  # noqa: E402


def jagged(lengths: list[int], start: int = 0) -> torch.Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return torch.nested.nested_tensor_from_jagged(torch.arange(start, start + int(offsets[-1])), offsets)


@pytest.fixture
def port():
    store = NodeStore(default_tier="shm")
    server = DataPort(store, PROTOCOL, threading.Lock(), "127.0.0.1")
    yield server
    server.close()
    store.close()


def test_calls_round_trip_and_many_in_flight_are_matched_by_id(port):
    async def main() -> list:
        client = PortClient(port.address, port.key, PROTOCOL)
        puts = [
            client.call(
                "put",
                (np.array([k]), {"r": to_wire(column_of("r", jagged([k + 1], 100 * k)))}),
                10,
                never_dead,
            )
            for k in range(20)
        ]
        await asyncio.gather(*puts)
        gets = [client.call("get", (np.array([k]), ["r"]), 10, never_dead) for k in reversed(range(20))]
        out = await asyncio.gather(*gets)
        client.close()
        return out

    out = asyncio.run(main())
    for k, wires in zip(reversed(range(20)), out):
        assert field_of(from_wire(wires["r"], writable=True)).values().tolist() == list(
            range(100 * k, 100 * k + k + 1)
        )


def test_the_stores_error_is_raised_at_the_caller_and_unknown_methods_are_refused(port):
    async def main() -> None:
        client = PortClient(port.address, port.key, PROTOCOL)
        with pytest.raises(StorageBackendError, match=r"field 'r' is not stored for global indexes \[5\]"):
            await client.call("get", (np.array([5]), ["r"]), 10, never_dead)
        with pytest.raises(StorageBackendError, match="does not answer 'close'"):
            await client.call("close", (), 10, never_dead)
        client.close()

    asyncio.run(main())


def test_a_silent_port_asks_whether_the_store_lives_then_times_out(monkeypatch):
    monkeypatch.setattr(data_port, "LIVENESS_SLICE_S", 0.1)
    asked: list[int] = []

    async def alive() -> None:
        asked.append(1)

    async def main() -> None:
        client = PortClient("tcp://127.0.0.1:9", bytes(32), PROTOCOL)  # nobody answers there
        with pytest.raises(TimeoutError, match="get unanswered after 0.5s"):
            await client.call("get", (np.array([0]), ["r"]), 0.5, alive)
        client.close()

    asyncio.run(main())
    assert len(asked) >= 4

    class Dead(Exception):
        pass

    async def dead() -> None:
        raise Dead("the store's actor died")

    async def main_dead() -> None:
        client = PortClient("tcp://127.0.0.1:9", bytes(32), PROTOCOL)
        with pytest.raises(Dead):
            await client.call("get", (np.array([0]), ["r"]), 30, dead)
        client.close()

    asyncio.run(main_dead())


def test_garbage_on_the_port_is_not_answered_and_the_port_keeps_serving(port):
    with raw_socket(port.address) as raw:
        raw.send_multipart([b"not a pickle", b"junk"])
        assert not raw.poll(500), "the port answered a frame without a MAC"
    assert port.refused["unsigned"] == 1
    call(port, "clear", np.array([0]))  # still serving
