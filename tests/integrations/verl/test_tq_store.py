"""The Conduit TransferQueue backend's store, without Ray: columns, slots, growth, tiers, budgets, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")

from conduit_verl.errors import StorageBackendError  # noqa: E402
from conduit_verl.tq_store.columns import column_of, field_of  # noqa: E402
from conduit_verl.tq_store.store import NodeStore  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

from conduit.buffer.columns import JAGGED, OBJECT, SCALAR, Column, from_wire, to_wire  # noqa: E402
from conduit.buffer.mapped import StaleLayoutError, read_mapped  # noqa: E402


def jagged(lengths: list[int], dtype=torch.int64, start: int = 0) -> torch.Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    values = torch.arange(start, start + int(offsets[-1])).to(dtype)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def wires(td: TensorDict) -> dict:
    return {k: to_wire(column_of(k, td.get(k))) for k in td.keys()}


def rows(nt: torch.Tensor) -> list[list]:
    return [x.tolist() for x in nt.unbind()]


def test_columns_keep_shapes_and_round_trip_the_wire():
    td = TensorDict(
        {
            "responses": jagged([2, 0, 3]),
            "input_ids": torch.arange(12).view(3, 4),
            "rm_scores": torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
            "uid": NonTensorStack("a", "b", "c"),
        },
        batch_size=[3],
    )
    cols = {k: column_of(k, td.get(k)) for k in td.keys()}
    assert (cols["responses"].kind, cols["input_ids"].kind, cols["rm_scores"].kind, cols["uid"].kind) == (
        JAGGED,
        JAGGED,
        SCALAR,
        OBJECT,
    )
    back = {k: from_wire(to_wire(c)) for k, c in cols.items()}
    assert rows(field_of(back["responses"])) == [[0, 1], [], [2, 3, 4]]
    assert (
        rows(field_of(back["input_ids"])) == td["input_ids"].tolist()
    )  # dense rows come back jagged, as TQ does
    assert field_of(back["rm_scores"]).dtype == torch.bfloat16
    assert field_of(back["uid"]).tolist() == ["a", "b", "c"]
    with pytest.raises(StorageBackendError, match="0-d tensor"):
        column_of("x", torch.tensor(1.0))


def test_put_get_overwrite_and_clear_by_global_index():
    s = NodeStore()
    s.put(
        np.array([5, 1, 9]),
        wires(TensorDict({"r": jagged([2, 1, 3]), "v": torch.tensor([0.5, 1.5, 2.5])}, [3])),
    )
    got = s.get(np.array([9, 5]), ["r", "v"])
    assert rows(field_of(from_wire(got["r"]))) == [[3, 4, 5], [0, 1]]
    assert from_wire(got["v"]).data.tolist() == [2.5, 0.5]
    s.put(np.array([1]), wires(TensorDict({"r": jagged([4], start=100)}, [1])))  # an upsert of one field
    assert rows(field_of(from_wire(s.get(np.array([1]), ["r"])["r"]))) == [[100, 101, 102, 103]]
    s.clear(np.array([1, 9]))
    with pytest.raises(StorageBackendError, match=r"field 'r' is not stored for global indexes \[1\]"):
        s.get(np.array([5, 1]), ["r"])
    with pytest.raises(StorageBackendError, match="field 'nope'"):
        s.get(np.array([5]), ["nope"])
    s.close()


def test_growth_keeps_contents_and_a_stale_layout_is_detected():
    s = NodeStore()
    s.put(np.array([0, 1]), wires(TensorDict({"r": jagged([2, 3])}, [2])))
    plan = s.read_plan(np.array([1]), ["r"], same_node=True)["r"]
    assert plan[0] == "mapped"
    _, kind, layout, lengths, plan_rows = plan
    got = read_mapped(layout, torch.as_tensor(plan_rows), torch.as_tensor(lengths))
    assert kind == JAGGED and got.values.tolist() == [2, 3, 4]
    s.put(
        np.array([500]), wires(TensorDict({"r": jagged([200], start=7)}, [1]))
    )  # grows capacity and max_len
    assert rows(field_of(from_wire(s.get(np.array([1, 500]), ["r"])["r"]))) == [
        [2, 3, 4],
        list(range(7, 207)),
    ]
    stale = type(layout)(layout.path, layout.inode + 1, layout.dtype, layout.shape)
    with pytest.raises(StaleLayoutError):
        read_mapped(stale, torch.as_tensor(plan_rows), torch.as_tensor(lengths))
    s.close()


def test_shared_memory_leaves_no_file_behind():
    before = set(os.listdir("/dev/shm"))
    s = NodeStore()
    s.put(np.array([0]), wires(TensorDict({"r": jagged([3])}, [1])))
    assert set(os.listdir("/dev/shm")) == before  # unlinked at once; readers open the store's descriptor
    s.close()


def test_placement_budgets_spill_and_errors(tmp_path):
    with pytest.raises(StorageBackendError, match="unknown field 'old_logprobs'"):
        NodeStore(placement={"old_logprobs": "host"})
    with pytest.raises(StorageBackendError, match="unknown tier"):
        NodeStore(placement={"old_log_probs": "ssd"})
    with pytest.raises(StorageBackendError, match="unknown tier"):
        NodeStore(budgets={"gpu": 10})
    s = NodeStore(
        placement={"old_log_probs": "host"},
        budgets={"shm": 1024},
        default_tier="shm",
        directory=str(tmp_path),
    )
    s.put(
        np.array([0]),
        wires(TensorDict({"responses": jagged([4]), "old_log_probs": jagged([4], torch.float32)}, [1])),
    )
    fields = s.stats()["fields"]
    assert fields["old_log_probs"]["tier"] == "host"
    assert fields["responses"]["tier"] == "host" and fields["responses"]["spilled"]  # shm budget too small
    s.close()
    tight = NodeStore(default_tier="disk", budgets={"disk": 10}, directory=str(tmp_path))
    with pytest.raises(StorageBackendError, match=r"field 'responses' needs \d+ bytes"):
        tight.put(np.array([0]), wires(TensorDict({"responses": jagged([4])}, [1])))


def test_auto_plans_the_most_read_field_into_shm_and_the_rest_to_disk(tmp_path):
    """default_tier=auto: with room in shm for one of two equal fields, the one read more stays in
    shm (mapped reads) once the fields grow; the other goes to disk, planned rather than spilled."""
    s = NodeStore(budgets={"shm": 40_000}, directory=str(tmp_path))  # one grown field (32 KiB) fits
    td = TensorDict({"responses": jagged([4] * 4), "advantages": jagged([4] * 4)}, [4])
    s.put(np.arange(4), wires(td))
    for _ in range(5):
        s.get(np.arange(4), ["advantages"])
    s.put(
        np.arange(4), wires(TensorDict({"responses": jagged([64] * 4), "advantages": jagged([64] * 4)}, [4]))
    )
    fields = s.stats()["fields"]
    assert fields["advantages"]["tier"] == "shm", fields
    assert fields["responses"]["tier"] == "disk" and not fields["responses"]["spilled"], fields
    got = s.get(np.arange(4), ["responses", "advantages"])
    assert set(got) == {"responses", "advantages"}
    s.close()


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool, torch.bfloat16])
def test_puts_that_overwrite_longer_rows_read_back_exactly(dtype):
    """One-pass scatter and gather (every token width: 8, 4, 1, 2 bytes): a put of shorter rows into
    slots that held longer ones reads back as the new rows only, in the order asked."""
    lengths = [5, 1, 9, 3]
    s = NodeStore(default_tier="shm")
    s.put(np.array([3, 0, 7, 2]), wires(TensorDict({"r": jagged([12, 12, 12, 12], dtype)}, [4])))
    s.put(np.array([3, 0, 7, 2]), wires(TensorDict({"r": jagged(lengths, dtype, start=1)}, [4])))
    got = rows(field_of(from_wire(s.get(np.array([0, 2, 3, 7]), ["r"])["r"])))
    s.close()
    want = rows(jagged(lengths, dtype, start=1))
    assert got == [want[1], want[3], want[0], want[2]]


def test_a_put_of_another_dtype_is_refused_whole():
    s = NodeStore()
    s.put(np.array([0]), wires(TensorDict({"a": jagged([2]), "b": jagged([2])}, [1])))
    bad = TensorDict({"a": jagged([2]), "b": jagged([2], torch.float32)}, [1])
    with pytest.raises(StorageBackendError, match="field 'b' holds jagged torch.int64"):
        s.put(np.array([1]), wires(bad))
    with pytest.raises(StorageBackendError, match="field 'a' is not stored"):  # nothing of the bad put landed
        s.get(np.array([1]), ["a"])


def test_a_jagged_view_with_holes_is_stored_as_its_lengths_say():
    holes = torch.nested.narrow(
        torch.arange(12).view(3, 4),
        1,
        torch.zeros(3, dtype=torch.int64),
        torch.tensor([1, 3, 2]),
        layout=torch.jagged,
    )
    s = NodeStore()
    s.put(np.array([0, 1, 2]), wires(TensorDict({"responses": holes}, [3])))
    assert rows(field_of(from_wire(s.get(np.array([0, 1, 2]), ["responses"])["responses"]))) == [
        [0],
        [4, 5, 6],
        [8, 9],
    ]
    s.close()


def test_growing_one_dimension_leaves_the_other_alone():
    s = NodeStore()
    s.put(np.array([0]), wires(TensorDict({"r": jagged([4])}, [1])))
    f = s.fields["r"]
    cap = f.capacity
    s.put(np.array([1]), wires(TensorDict({"r": jagged([1000])}, [1])))  # longer: max_len grows only
    assert f.capacity == cap and f.max_len >= 1000
    length = f.max_len
    s.put(np.array([5000]), wires(TensorDict({"r": jagged([2])}, [1])))  # a far index takes a free row
    assert f.capacity == cap and f.max_len == length
    more = np.arange(10, 10 + cap)  # more new indexes than free rows: capacity grows only
    s.put(more, wires(TensorDict({"r": jagged([2] * cap, start=9)}, [cap])))
    assert f.capacity > cap and f.max_len == length
    got = rows(field_of(from_wire(s.get(np.array([0, 1, 5000, 10 + cap - 1]), ["r"])["r"])))
    assert got == [[0, 1, 2, 3], list(range(1000)), [0, 1], [9 + 2 * cap - 2, 9 + 2 * cap - 1]]
    s.close()


def test_field_schema_equals_transfer_queues_own():
    from conduit_verl.tq_store.columns import field_schema
    from transfer_queue.metadata import extract_field_schema

    holes = torch.nested.narrow(
        torch.arange(12).view(3, 4), 1, torch.zeros(3, dtype=torch.int64), torch.tensor([1, 3, 2]),
        layout=torch.jagged,
    )  # fmt: skip
    td = TensorDict(
        {
            "responses": jagged([2, 0, 3]),
            "old_log_probs": jagged([2, 5, 1], torch.float32),
            "input_ids": torch.arange(12).view(3, 4),
            "rm_scores": torch.randn(3),
            "holes": holes,
            "uid": NonTensorStack("a", "b", "c"),
        },
        [3],
    )
    columns = {k: column_of(k, td.get(k)) for k in td.keys()}
    assert field_schema(td, columns) == extract_field_schema(td)
    assert list(field_schema(td, columns)) == list(td.keys())


def test_merge_puts_each_part_back_at_its_positions():

    whole = TensorDict(
        {"r": jagged([3, 0, 5, 2, 1], torch.float32), "s": torch.arange(5.0), "o": NonTensorStack(*"abcde")},
        [5],
    )
    cols = {k: column_of(k, whole.get(k)) for k in whole.keys()}
    positions = [torch.tensor([4, 1]), torch.tensor([0, 3, 2])]
    for k, col in cols.items():
        merged = Column.merge([col.select(p) for p in positions], positions, 5)
        if col.kind == JAGGED:
            assert rows(field_of(merged)) == rows(whole[k])
        elif col.kind == SCALAR:
            assert torch.equal(merged.data, whole[k])
        else:
            assert merged.data == list("abcde")


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"placment": {"responses": "shm"}}, r"unknown key\(s\) \['placment'\]"),
        ({"timeout_s": 0}, r"timeout_s=0: want a number of seconds > 0"),
        ({"timeout_s": "60"}, r"timeout_s='60'"),
        ({"direct_put_min_bytes": -1}, r"direct_put_min_bytes=-1: want a whole number of bytes >= 0"),
        ({"direct_put_min_bytes": 1.5}, r"direct_put_min_bytes=1.5"),
        ({"direct_put_min_bytes": True}, r"direct_put_min_bytes=True"),
    ],
)
def test_a_bad_backend_section_is_refused_naming_the_key(section, match):
    from conduit_verl.tq_store.backend import check_section

    with pytest.raises(StorageBackendError, match=match):
        check_section(section)
    check_section({"placement": {}, "timeout_s": 5, "direct_put_min_bytes": 1 << 20, "actors": ["a"]})


def test_a_disk_field_larger_than_the_free_space_is_refused_whole(tmp_path, monkeypatch):
    """A field's file is reserved before it is mapped (issue 26, item 11): a field that would outgrow
    its file system is a StorageBackendError, nothing stored, no file left, never SIGBUS."""
    from conduit.buffer import tiers

    class Fs:  # 5 MiB free of 64 MiB: 1.8 MiB usable beside the margin (5 %)
        f_frsize, f_blocks, f_bavail = 4096, 16384, 1280

    monkeypatch.setattr(tiers.os, "statvfs", lambda path: Fs)
    s = NodeStore(default_tier="disk", directory=str(tmp_path))
    big = {"x": to_wire(column_of("x", torch.ones(2, 8192, dtype=torch.int32)))}  # 64 rows x 32 KiB: 2 MiB
    with pytest.raises(StorageBackendError, match="does not fit"):
        s.put(np.arange(2), big)
    assert "x" not in s.fields or s.fields["x"].data is None
    assert os.listdir(tmp_path) == []
    small = {"x": to_wire(column_of("x", torch.ones(2, 8, dtype=torch.int32)))}
    s.put(np.arange(2), small)  # the store still works
    assert int(from_wire(s.get(np.arange(2), ["x"])["x"]).data.values.sum()) == 16


def test_a_transfer_queue_checkpoint_is_refused_not_saved_without_rows():
    """TransferQueue takes NotImplementedError as "data kept elsewhere" and saves metadata alone; the
    backend refuses instead, naming what to use."""
    import asyncio

    from conduit_verl.tq_store.backend import ConduitStorageManager

    manager = ConduitStorageManager.__new__(ConduitStorageManager)  # the refusal needs no actors
    with pytest.raises(StorageBackendError, match="max_staleness=k") as e:
        asyncio.run(manager.save_checkpoint("/tmp/ck"))
    assert not isinstance(e.value, NotImplementedError)
    with pytest.raises(StorageBackendError, match="no rows in TransferQueue's checkpoint"):
        asyncio.run(manager.load_checkpoint("/tmp/ck"))
