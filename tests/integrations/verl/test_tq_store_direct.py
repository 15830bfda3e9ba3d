"""A same-node writer's put straight into the store's shared memory: write plan, in-place scatter, commit.

Without Ray: the :class:`NodeStore` an actor holds, and the writer's side (:func:`write_mapped`) as the
backend's storage manager calls it (``direct_put`` below is its plan / write / commit loop).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")

from conduit_verl.errors import StorageBackendError  # noqa: E402
from conduit_verl.tq_store.columns import column_of, field_of  # noqa: E402
from conduit_verl.tq_store.store import NodeStore  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

from conduit.buffer.columns import JAGGED, OBJECT, Column, from_wire, to_wire  # noqa: E402
from conduit.buffer.mapped import StaleLayoutError, read_mapped, write_mapped  # noqa: E402


def ragged(lengths: list[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    if dtype == torch.float32:  # log-probs: negative floats, one NaN and an infinity to be bit-exact about
        values = -torch.rand(total, generator=g) * 20
        if total > 2:
            values[0], values[1] = float("nan"), float("-inf")
    elif dtype == torch.bool:
        values = torch.rand(total, generator=g) > 0.3
    else:
        values = torch.randint(-(2**52), 2**52, (total,), generator=g).to(dtype)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def batch(lengths: list[int], seed: int = 0) -> TensorDict:
    n = len(lengths)
    return TensorDict(
        {
            "responses": ragged(lengths, torch.int64, seed),
            "old_log_probs": ragged(lengths, torch.float32, seed + 1),
            "response_mask": ragged(lengths, torch.bool, seed + 2),
            "rm_scores": torch.randn(n, generator=torch.Generator().manual_seed(seed + 3)),
            "uid": NonTensorStack(*[f"u{seed}-{i}" for i in range(n)]),
        },
        [n],
    )


def columns_of(td: TensorDict) -> dict[str, Column]:
    return {k: column_of(k, td.get(k)) for k in td.keys()}


def plan_and_write(s: NodeStore, gis: np.ndarray, cols: dict[str, Column]) -> tuple[int, dict, dict]:
    """The writer's half: a plan, then each planned field scattered into the mapped file."""
    plan_id, entries = s.write_plan(gis, {f: c.plan_spec() for f, c in cols.items()}, same_node=True)
    lengths = {}
    for f, (layout, rows) in entries.items():
        lens = write_mapped(layout, torch.from_numpy(rows), cols[f].data)
        lengths[f] = None if lens is None else lens.numpy()
    rest = {f: to_wire(c) for f, c in cols.items() if f not in entries}
    return plan_id, lengths, rest


def direct_put(s: NodeStore, gis: np.ndarray, td: TensorDict, lock: threading.Lock | None = None) -> int:
    """The storage manager's loop (``lock``: the actor's one-call-at-a-time); returns the tries made."""
    cols = columns_of(td)
    lock = lock or threading.Lock()
    for tries in range(1, 100):
        with lock:
            plan_id, entries = s.write_plan(gis, {f: c.plan_spec() for f, c in cols.items()}, same_node=True)
        try:
            lengths = {}
            for f, (layout, rows) in entries.items():
                lens = write_mapped(layout, torch.from_numpy(rows), cols[f].data)
                lengths[f] = None if lens is None else lens.numpy()
        except StaleLayoutError:
            with lock:
                s.abandon(plan_id)
            continue
        with lock:
            if s.commit(plan_id, gis, lengths, {f: to_wire(c) for f, c in cols.items() if f not in entries}):
                return tries
    raise AssertionError("no plan committed in 99 tries")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (NaN compares equal to itself)."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same(got: TensorDict | dict, want: TensorDict) -> None:
    for k in want.keys():
        w, g = want.get(k), got[k]
        if isinstance(w, NonTensorStack):
            assert g.tolist() == w.tolist(), k
        elif w.is_nested:
            assert g.dtype == w.dtype, k
            assert torch.equal(bits(g.values()), bits(w.values())), k
            assert torch.equal(g.offsets(), w.offsets()), k
        else:
            assert torch.equal(bits(g), bits(w)), k


def read_back(s: NodeStore, gis: np.ndarray, names: list[str]) -> dict:
    """What a same-node reader gets: mapped fields gathered in place, the rest from the data."""
    out = {}
    for name, entry in s.read_plan(gis, names, same_node=True).items():
        if entry[0] == "mapped":
            _, kind, layout, lengths, rows = entry
            lens = None if lengths is None else torch.from_numpy(lengths)
            col = Column(kind, read_mapped(layout, torch.from_numpy(rows), lens))
        else:
            col = from_wire(entry, writable=True)
        out[name] = field_of(col)
    return out


def payload(c: Column) -> int:
    """Bytes of a column's values (a jagged column's offsets are not stored: the lengths are)."""
    return 0 if c.kind == OBJECT else int(c.data.values.nbytes if c.kind == JAGGED else c.data.nbytes)


def tensor_bytes(td: TensorDict) -> int:
    return sum(payload(c) for c in columns_of(td).values())


def test_a_same_node_put_is_written_in_place_once_and_reads_back_bit_identical():
    s = NodeStore()
    lengths = [5, 0, 17, 1, 64, 3]  # ragged, one empty response
    gis = np.array([7, 2, 40, 0, 3, 11])
    td = batch(lengths)
    plan_id, lens, rest = plan_and_write(s, gis, columns_of(td))
    assert set(rest) == {"uid"}  # only the strings travel as data
    assert s.commit(plan_id, gis, lens, rest)
    stats = s.stats()
    assert stats["bytes_put_direct"] == tensor_bytes(td) > 0  # every tensor byte written once, in place
    assert stats.get("bytes_put_copied", 0) == 0  # nothing of the tensors came as data
    assert stats["plans_open"] == 0
    assert_same(read_back(s, gis, list(td.keys())), td)
    order = torch.tensor([2, 0, 5])  # a subset, out of order, through the copying path too
    want = {k: field_of(c.select(order)) for k, c in columns_of(td).items()}
    got = {k: field_of(from_wire(w)) for k, w in s.get(gis[order.numpy()], list(td.keys())).items()}
    assert_same(got, TensorDict(want, [3]))
    s.close()


def test_nothing_is_visible_before_the_commit_and_an_upsert_replaces_the_value_whole():
    s = NodeStore()
    gis = np.array([0, 1])
    old = batch([4, 6], seed=1)
    direct_put(s, gis, old)
    new = batch([9, 2], seed=2)
    plan_id, lens, rest = plan_and_write(s, gis, columns_of(new))  # written, not committed
    assert_same(read_back(s, gis, list(old.keys())), old)  # readers still see the old values
    assert s.commit(plan_id, gis, lens, rest)
    assert_same(read_back(s, gis, list(new.keys())), new)
    assert int(s.fields["responses"].used.sum()) == 2  # the old rows were freed at the commit
    s.close()


def test_a_writer_that_dies_between_plan_and_commit_leaves_nothing_and_its_rows_return():
    s = NodeStore(lease_s=0.0)
    gis = np.array([5, 6, 7])
    plan_and_write(s, gis, columns_of(batch([3, 8, 1])))  # ... and the writer dies: no commit
    assert s.stats()["plans_open"] == 1
    with pytest.raises(
        StorageBackendError, match=r"field 'responses' is not stored for global indexes \[5, 6, 7\]"
    ):
        s.read_plan(gis, ["responses"], same_node=True)
    td = batch([2, 2, 30], seed=5)
    direct_put(s, gis, td)  # the next plan releases the expired one; the same indexes store cleanly
    stats = s.stats()
    assert stats["plans_expired"] == 1 and stats["plans_open"] == 0
    assert int(s.fields["responses"].used.sum()) == 3  # the dead plan's rows are free again
    assert_same(read_back(s, gis, list(td.keys())), td)
    s.close()


def test_a_commit_after_the_lease_expired_is_refused():
    s = NodeStore(lease_s=0.0)
    gis = np.array([1])
    plan_id, lens, rest = plan_and_write(s, gis, columns_of(batch([3])))
    direct_put(s, np.array([2]), batch([1]))  # another plan expires the first
    assert not s.commit(plan_id, gis, lens, rest)
    assert s.fields["responses"].missing(torch.tensor([1])) == [1]
    s.close()


def test_a_field_that_grows_while_a_plan_is_outstanding_refuses_the_stale_plan():
    s = NodeStore()
    a_gis, a = np.array([0, 1]), batch([4, 3], seed=1)
    plan_id, lens, rest = plan_and_write(s, a_gis, columns_of(a))
    old_inode = s.fields["responses"].inode
    b_gis, b = np.array([2]), batch([1000], seed=2)  # longer rows: every field moves to a new file
    direct_put(s, b_gis, b)
    assert s.fields["responses"].inode != old_inode
    assert not s.commit(plan_id, a_gis, lens, rest)  # its rows were written into the old file
    assert s.stats()["plans_refused"] == 1
    assert s.fields["responses"].missing(torch.tensor([0, 1, 2])) == [0, 1]
    assert_same(read_back(s, b_gis, list(b.keys())), b)  # the grown field is intact
    direct_put(s, a_gis, a)  # planned again: stored
    assert_same(read_back(s, a_gis, list(a.keys())), a)
    assert_same(read_back(s, b_gis, list(b.keys())), b)
    s.close()


def test_a_write_with_longer_rows_than_planned_is_refused_not_written():
    s = NodeStore()
    gis = np.array([0])
    cols = columns_of(batch([4]))
    plan_id, entries = s.write_plan(gis, {f: c.plan_spec() for f, c in cols.items()}, same_node=True)
    layout, rows = entries["responses"]
    longer = column_of("responses", ragged([layout.shape[1] + 1], torch.int64, 0))
    with pytest.raises(StaleLayoutError, match="responses"):
        write_mapped(layout, torch.from_numpy(rows), longer.data)
    with pytest.raises(StorageBackendError, match=r"field '\w+': commit of 1 lengths"):
        s.commit(plan_id, gis, {f: np.array([10**6]) if f != "rm_scores" else None for f in entries}, {})
    assert s.stats()["plans_open"] == 0 and int(s.fields["responses"].used.sum()) == 0
    s.close()


def test_a_plan_checks_every_field_first_naming_the_one_with_another_dtype():
    s = NodeStore()
    direct_put(s, np.array([0]), batch([3]))
    bad = columns_of(batch([3]))
    bad["old_log_probs"] = column_of("old_log_probs", ragged([3], torch.float64, 0))
    with pytest.raises(StorageBackendError, match="field 'old_log_probs' holds jagged torch.float32"):
        s.write_plan(np.array([1]), {f: c.plan_spec() for f, c in bad.items()}, same_node=True)
    assert s.stats()["plans_open"] == 0 and int(s.fields["responses"].used.sum()) == 1  # nothing reserved
    s.close()


def test_fields_the_writer_cannot_map_and_other_nodes_go_as_data(tmp_path):
    s = NodeStore(placement={"old_log_probs": "host"}, default_tier="shm", directory=str(tmp_path))
    td = batch([6, 2, 9])
    gis = np.arange(3)
    cols = columns_of(td)
    assert s.write_plan(gis, {f: c.plan_spec() for f, c in cols.items()}, same_node=False) == (0, {})
    plan_id, lens, rest = plan_and_write(s, gis, cols)
    assert set(rest) == {"old_log_probs", "uid"}  # a host-tier field is not mapped: it goes as data
    assert s.commit(plan_id, gis, lens, rest)
    stats = s.stats()
    assert stats["fields"]["old_log_probs"]["tier"] == "host"
    assert stats["bytes_put_copied"] == cols["old_log_probs"].nbytes
    assert stats["bytes_put_direct"] == tensor_bytes(td) - payload(cols["old_log_probs"])
    assert_same(read_back(s, gis, list(td.keys())), td)
    s.close()


def test_two_writer_threads_on_disjoint_indexes_with_growth_in_between():
    s = NodeStore()
    lock = threading.Lock()  # the actor runs one call at a time
    rounds, per = 12, 4
    wanted: dict[int, TensorDict] = {}
    errors: list[BaseException] = []
    tries = [0, 0]

    def writer(w: int) -> None:
        try:
            for r in range(rounds):
                gis = np.arange(per) * 2 + w + r * 2 * per  # writer 0 even indexes, writer 1 odd
                td = batch([(r + 1) ** 2 * (w + 1) + i for i in range(per)], seed=100 * w + r)  # rows grow
                tries[w] += direct_put(s, gis, td, lock)
                wanted[r * 2 + w] = (gis, td)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(wanted) == 2 * rounds
    for gis, td in wanted.values():
        assert_same(read_back(s, gis, list(td.keys())), td)
    stats = s.stats()
    assert stats["plans_open"] == 0
    assert stats["bytes_put_direct"] == sum(tensor_bytes(td) for _, td in wanted.values())
    assert stats["write_plans"] == sum(tries)  # refused plans were made again, none was lost
    assert int(s.fields["responses"].used.sum()) == 2 * rounds * per  # no row leaked
    s.close()
