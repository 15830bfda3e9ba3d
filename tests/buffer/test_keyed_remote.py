"""The core's keyed store served to other processes: a column's wire form (``conduit.buffer.columns``),
the checked calls in wire form (``conduit.buffer.keyed_service``) and the caller's side that routes keys
over several stores, writes in place on its node and merges reads (``conduit.buffer.keyed_client``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from conduit.batch import Ragged
from conduit.buffer.columns import JAGGED, OBJECT, SCALAR, Column, from_wire, to_wire
from conduit.buffer.keyed import KeyedStore
from conduit.buffer.keyed_client import KeyedClient
from conduit.buffer.keyed_service import KeyedService
from conduit.errors import ConduitError, DTypeError, SchemaError


def ragged(lengths: list[int], start: int = 0) -> Ragged:
    return Ragged.from_lengths(torch.arange(start, start + sum(lengths)), torch.tensor(lengths))


def rows(c: Column) -> list:
    if c.kind == JAGGED:
        return [x.tolist() for x in c.data.values.split(c.data.lengths.tolist())]  # type: ignore[union-attr]
    return c.data.tolist() if c.kind == SCALAR else list(c.data)  # type: ignore[union-attr]


def test_columns_round_trip_the_wire_select_cat_and_merge():
    cols = [
        Column.of(ragged([2, 0, 3])),
        Column.of(torch.tensor([1.5, 2.5, 3.5])),
        Column.of(["a", {"b": 1}, None]),
    ]
    assert [c.kind for c in cols] == [JAGGED, SCALAR, OBJECT]
    for c in cols:
        back = from_wire(to_wire(c), writable=True)
        assert back.kind == c.kind and rows(back) == rows(c)
        picked = [c.select(torch.tensor([2])), c.select(torch.tensor([0, 1]))]
        assert rows(Column.cat(picked)) == [rows(c)[2], rows(c)[0], rows(c)[1]]
        merged = Column.merge(picked, [torch.tensor([2]), torch.tensor([0, 1])], 3)
        assert rows(merged) == rows(c)
    assert cols[0].plan_spec() == (JAGGED, "torch.int64", (), 3)


@pytest.mark.parametrize(
    ("form", "error", "match"),
    [
        ((SCALAR, "float32", np.zeros((2, 2), np.float32)), SchemaError, "a scalar column is 1-d"),
        ((SCALAR, "float32", np.zeros(2, np.float64)), DTypeError, "travels as float32"),
        ((SCALAR, "complex64", np.zeros(2, np.float32)), DTypeError, "is not one of"),
        ((JAGGED, "int64", np.zeros(3, np.int64), np.array([0, 2, 1, 3])), SchemaError, "without going back"),
        ((JAGGED, "int64", np.zeros(3, np.int64), np.array([0, 4])), SchemaError, "without going back"),
        (("pickle", b"x"), SchemaError, "malformed column"),
    ],
)
def test_a_malformed_wire_column_is_refused_by_class(form, error, match):
    with pytest.raises(error, match=match):
        from_wire(form)


class Refusal(ConduitError):
    pass


def test_the_service_checks_keys_and_columns_and_raises_one_class(tmp_path):
    svc = KeyedService(KeyedStore(default_tier="shm", directory=str(tmp_path)), max_key=100)
    svc.put(
        np.array([3, 1]), {"r": to_wire(Column.of(ragged([2, 1]))), "v": to_wire(Column.of(torch.ones(2)))}
    )
    got = svc.get(np.array([1, 3]), ["r", "v"])
    assert rows(from_wire(got["r"])) == [[2], [0, 1]] and rows(from_wire(got["v"])) == [1.0, 1.0]
    with pytest.raises(SchemaError, match=r"key 100 is outside \[0, 100\)"):
        svc.get(np.array([100]), ["v"])
    with pytest.raises(SchemaError, match="names some of its 2 keys twice"):
        svc.put(np.array([5, 5]), {"v": to_wire(Column.of(torch.ones(2)))})
    with pytest.raises(
        SchemaError, match=r"column 'v' holds scalar torch.float32 \(\); a write brought scalar torch.int64"
    ):
        svc.put(np.array([5]), {"v": to_wire(Column.of(torch.ones(1, dtype=torch.int64)))})
    strict = KeyedService(KeyedStore(), error=Refusal)
    with pytest.raises(Refusal, match="column 'v': a scalar column is 1-d"):
        strict.put(np.array([0]), {"v": (SCALAR, "float32", np.zeros((1, 1), np.float32))})
    with pytest.raises(Refusal, match=r"column 'v' is not stored for keys \[0\]"):
        strict.read_plan(np.array([0]), ["v"], same_node=True)
    svc.close()
    strict.close()


def test_the_client_routes_writes_in_place_on_its_node_and_merges_a_read(tmp_path):
    services = [KeyedService(KeyedStore(default_tier="shm", directory=str(tmp_path))) for _ in range(2)]

    async def call(i: int, method: str, *args):
        return getattr(services[i], method)(*args)

    async def run() -> dict[str, Column]:
        client = KeyedClient(call, ["here", "there"], "here", direct_min_bytes=0)
        keys = torch.arange(5)
        await client.put(keys, {"r": Column.of(ragged([1, 2, 3, 4, 5])), "o": Column.of(list("abcde"))})
        got = await client.get(torch.tensor([4, 1, 2]), ["r", "o"])
        await client.clear(torch.tensor([4]))
        return got

    got = asyncio.run(run())
    assert rows(got["r"]) == [list(range(10, 15)), [1, 2], [3, 4, 5]] and rows(got["o"]) == ["e", "b", "c"]
    here, there = (s.keyed.stats() for s in services)
    assert here["bytes_put_direct"] > 0 and "bytes_put_direct" not in there  # store 1 is on another node
    assert here["bytes_get_mapped"] > 0 and there["bytes_get_copied"] > 0
    assert services[0].keyed.columns["r"].missing(torch.tensor([4, 0])) == [4]
    for s in services:
        s.close()
