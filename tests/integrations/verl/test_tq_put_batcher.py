"""The TQ backend's put batcher (conduit.port.Coalescer): puts queued behind an in-flight call go together, each caller answered for its own put."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")

from conduit_verl.errors import StorageBackendError  # noqa: E402
from conduit_verl.tq_store.columns import column_of  # noqa: E402

from conduit.buffer.keyed_client import put_batcher  # noqa: E402


def cols(k: int, dtype=torch.int64) -> dict:
    nt = torch.nested.nested_tensor_from_jagged(torch.arange(k + 1).to(dtype), torch.tensor([0, k + 1]))
    return {
        "responses": column_of("responses", nt),
        "rm_scores": column_of("rm_scores", torch.tensor([float(k)])),
    }


class FakeStore:
    """Records each call; refuses a call carrying a float32 ``responses`` (as a dtype clash would)."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.stored: dict[int, list[int]] = {}

    async def send(self, gis: np.ndarray, columns: dict) -> None:
        await asyncio.sleep(0.01)  # a call in flight: later puts queue behind it
        self.calls.append(gis.tolist())
        if columns["responses"].dtype != torch.int64:
            raise StorageBackendError("field 'responses' holds jagged torch.int64")
        r = columns["responses"].data
        for i, g in enumerate(gis.tolist()):
            self.stored[g] = r.values[int(r.offsets[i]) : int(r.offsets[i + 1])].tolist()


def test_puts_queued_behind_two_calls_in_flight_go_in_one_call_and_each_is_stored():
    store = FakeStore()

    async def main() -> None:
        b = put_batcher(store.send)
        await asyncio.gather(*(b.put(np.array([k]), cols(k)) for k in range(10)))

    asyncio.run(main())
    # two calls go at once; the eight puts queued behind them go in the next call, together
    assert store.calls == [[0], [1], list(range(2, 10))]
    assert store.stored == {k: list(range(k + 1)) for k in range(10)}


def test_a_bad_put_fails_alone_and_the_others_in_its_call_are_stored():
    store = FakeStore()
    outcomes: dict[int, object] = {}

    async def one(b, k: int) -> None:
        try:
            await b.put(np.array([k]), cols(k, torch.float32 if k == 4 else torch.int64))
            outcomes[k] = "ok"
        except StorageBackendError as e:
            outcomes[k] = e

    async def main() -> None:
        b = put_batcher(store.send)
        await asyncio.gather(*(one(b, k) for k in range(8)))

    asyncio.run(main())
    assert isinstance(outcomes.pop(4), StorageBackendError)
    assert set(outcomes.values()) == {"ok"} and sorted(store.stored) == [0, 1, 2, 3, 5, 6, 7]


def test_puts_behind_a_call_in_flight_wait_for_it_and_the_same_key_or_other_fields_are_not_combined():
    store = FakeStore()

    async def main() -> None:
        b = put_batcher(store.send)
        first = asyncio.ensure_future(b.put(np.array([0]), cols(0)))
        await asyncio.sleep(0)  # the first call is in flight
        await asyncio.gather(
            b.put(np.array([1]), cols(1)),
            b.put(np.array([1]), cols(5)),  # same key again: after the first, in order
            b.put(np.array([2]), {"responses": cols(2)["responses"]}),  # other fields
        )
        await first

    asyncio.run(main())
    assert store.calls == [[0], [1], [1], [2]]
    assert store.stored[1] == list(range(6))  # the later put of key 1 won
