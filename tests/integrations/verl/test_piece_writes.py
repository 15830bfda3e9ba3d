"""PieceWrites: a piece's driver writes are kept, served back, and written once at the end."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit_verl.piece_writes import PieceWrites  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402


class _FakeTQ:
    """A dict-backed stand-in for the ``transfer_queue`` module (fields by name, whole key lists)."""

    def __init__(self, keys: list[str]) -> None:
        self.store = {"responses": torch.arange(len(keys)), "log_probs": torch.ones(len(keys))}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        self.calls.append(("get", tuple(select_fields)))
        return TensorDict({f: self.store[f][: len(keys)] for f in select_fields}, batch_size=[len(keys)])

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.calls.append(("put", tuple(sorted(fields.keys()))))
        self.store.update({k: fields[k] for k in fields.keys()})
        return KVBatchMeta(keys=list(keys), tags=[{}] * len(keys), partition_id=partition_id)

    def kv_clear(self, keys, partition_id):
        self.calls.append(("clear", ()))


@pytest.fixture
def setup():
    keys = ["a", "b", "c"]
    meta = KVBatchMeta(keys=keys, tags=[{"i": i} for i in range(3)], partition_id="train")
    tq = _FakeTQ(keys)
    return keys, meta, tq, PieceWrites(tq, meta)


def test_writes_are_served_back_and_flushed_once(setup) -> None:
    keys, meta, tq, w = setup
    out = w.kv_batch_put(keys, "train", fields=TensorDict({"old": torch.full((3,), 2.0)}, batch_size=[3]))
    assert out.keys == keys and out.tags == meta.tags and out.fields is None  # None: every field
    w.kv_batch_put(keys, "train", fields=TensorDict({"adv": torch.full((3,), 5.0)}, batch_size=[3]))
    got = w.kv_batch_get(keys, "train", select_fields=["old", "responses", "adv"])
    assert torch.equal(got["old"], torch.full((3,), 2.0)) and torch.equal(got["responses"], torch.arange(3))
    assert tq.calls == [("get", ("responses",))]  # only the field the piece did not write is fetched
    assert "old" not in tq.store  # nothing written yet
    w.flush()
    assert tq.calls[-1] == ("put", ("adv", "old")) and len([c for c in tq.calls if c[0] == "put"]) == 1
    assert torch.equal(tq.store["adv"], torch.full((3,), 5.0))
    assert w.puts_saved == 1  # two stage writes became one


def test_other_keys_and_calls_go_through(setup) -> None:
    keys, _, tq, w = setup
    w.kv_batch_put(keys, "train", fields=TensorDict({"old": torch.zeros(3)}, batch_size=[3]))
    # a read of other keys first writes what is kept (it might read those fields)
    w.kv_batch_get(keys[:2], "train", select_fields=["responses"])
    assert tq.calls[0] == ("put", ("old",)) and tq.calls[1] == ("get", ("responses",))
    w.kv_clear(keys=keys, partition_id="train")  # any other TQ call is the real module's
    assert tq.calls[-1] == ("clear", ())
