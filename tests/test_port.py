"""The core's data port (``conduit.port`` over ``conduit.wire``) serving a plain object: calls round trip
with arrays, tensors and records; the target's errors come back by class; unsigned frames run nothing."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

pytest.importorskip("zmq")

from port_calls import call, raw_socket  # noqa: E402

from conduit import wire  # noqa: E402
from conduit.buffer.keyed_client import Coalescer  # noqa: E402
from conduit.errors import CapacityError, ConduitError, DTypeError  # noqa: E402
from conduit.port import DataPort, Protocol  # noqa: E402


@dataclass(frozen=True)
class Where:
    name: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and isinstance(self.shape, tuple)):
            raise ValueError("a malformed Where")


class Target:
    def __init__(self) -> None:
        self.rows: dict[int, torch.Tensor] = {}

    def put(self, keys: np.ndarray, values: torch.Tensor) -> Where:
        if len(self.rows) + len(keys) > 4:
            raise CapacityError(f"{len(keys)} rows do not fit")
        self.rows.update(zip(keys.tolist(), values))
        return Where("rows", tuple(values.shape))

    def get(self, keys: np.ndarray) -> dict[str, object]:
        return {"values": torch.stack([self.rows[k] for k in keys.tolist()]), "keys": keys}


PROTOCOL = Protocol({"put": ("keys", "values"), "get": ("keys",)}, errors=(CapacityError,), records=(Where,))


@pytest.fixture
def port():
    server = DataPort(Target(), PROTOCOL, threading.Lock(), "127.0.0.1")
    yield server
    server.close()


def test_a_call_round_trips_arrays_tensors_and_records(port):
    values = torch.tensor([[1.5, 2.5], [3.0, -1.0]], dtype=torch.bfloat16)
    assert call(port, "put", np.array([3, 4]), values) == Where("rows", (2, 2))
    got = call(port, "get", np.array([4, 3]))
    assert got["values"].dtype == torch.bfloat16 and torch.equal(got["values"], values.flip(0))
    assert got["keys"].tolist() == [4, 3]


def test_errors_travel_by_class_and_what_is_not_data_is_refused_by_the_writer(port):
    with pytest.raises(CapacityError, match="5 rows do not fit"):
        call(port, "put", np.arange(5), torch.zeros(5))
    with pytest.raises(ConduitError, match=r"KeyError: 9"):  # not in the protocol's errors: the base class
        call(port, "get", np.array([9]))
    with pytest.raises(ConduitError, match=r"put values holds a .*object"):
        call(port, "put", np.array([0]), object())
    with pytest.raises(ConduitError, match="does not answer 'close'"):
        call(port, "close")


def test_unsigned_frames_run_nothing_and_the_port_keeps_serving(port):
    with raw_socket(port.address) as raw:
        raw.send_multipart([b"junk", b"more"])
        assert not raw.poll(300)
    assert port.refused["unsigned"] == 1 and not port.target.rows
    assert call(port, "put", np.array([1]), torch.ones(1, 3)).shape == (1, 3)


def test_dtypes_are_looked_up_in_the_fixed_list_only():
    assert wire.torch_dtype("float32") is torch.float32
    for name in ("load", "torch.load", "complex64", 3):
        with pytest.raises(DTypeError, match="is not one of"):
            wire.torch_dtype(name)
    bad = {"@": "r", "n": "Where", "v": {"@": "d", "k": ["name", "shape"], "v": ["x", [1]]}}
    with pytest.raises(ValueError, match="a malformed Where"):  # a record is checked by its class
        wire.decode(bad, [], (Where,))


def test_calls_queued_behind_calls_in_flight_go_together_and_each_caller_gets_its_own_error():
    calls: list[list[int]] = []

    async def send(keys: np.ndarray, payload: list[str]) -> None:
        await asyncio.sleep(0.01)
        if "bad" in payload:
            raise CapacityError("a bad item")
        calls.append(keys.tolist())

    async def main() -> dict[int, object]:
        c = Coalescer(send, join=lambda parts: [x for p in parts for x in p], signature=len)
        out = await asyncio.gather(
            *(c.put(np.array([k]), ["bad" if k == 5 else "ok"]) for k in range(8)), return_exceptions=True
        )
        return dict(enumerate(out))

    outcomes = asyncio.run(main())
    assert isinstance(outcomes.pop(5), CapacityError) and set(outcomes.values()) == {None}
    assert calls[:2] == [[0], [1]] and sorted(k for c in calls for k in c) == [0, 1, 2, 3, 4, 6, 7]
