"""Same-node puts through TQ's client on Ray: written straight into the storage actor's shared memory.

The writer asks its node's storage actor for a write plan, scatters the rows into the mapped file (one
copy, no payload through Ray's object store) and commits the lengths; these tests check that path is
the one taken, what it stores, and what happens when writers die, race or a field grows meanwhile.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from conduit_verl.tq_store.columns import column_of  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from conduit.buffer import keyed_client  # noqa: E402
from conduit.buffer.columns import from_wire, to_wire  # noqa: E402

pytestmark = pytest.mark.ray

# Ray's workers cannot import this test module: its remote functions travel by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PAYLOAD = ("responses", "old_log_probs", "response_mask", "rm_scores")


def grpo_batch(lengths: list[int], seed: int) -> TensorDict:
    """verl's token fields (int64 ids and masks, fp32 log-probs, ragged) and a scalar reward."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    total = int(offsets[-1])

    def nested(values: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor_from_jagged(values, offsets)

    return TensorDict(
        {
            "responses": nested(torch.randint(0, 151_936, (total,), generator=g)),
            "old_log_probs": nested(-torch.rand(total, generator=g) * 10),
            "response_mask": nested((torch.rand(total, generator=g) > 0.2).to(torch.int64)),
            "rm_scores": torch.randn(len(lengths), generator=g),
        },
        [len(lengths)],
    )


def assert_same(got: TensorDict, want: TensorDict) -> None:
    for k in want.keys():
        w, g = want[k], got[k]
        if w.is_nested:
            assert g.dtype == w.dtype, k
            assert torch.equal(g.offsets(), w.offsets()), k
            w, g = w.values(), g.values()
        if w.dtype == torch.float32:  # bit for bit
            w, g = w.view(torch.int32), g.view(torch.int32)
        assert torch.equal(g, w), k


def storage_actors() -> list:
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    names = ray.get(controller.get_config.remote()).backend.Conduit.actors
    return [ray.get_actor(n, namespace="transfer_queue") for n in names]


def stats() -> dict:
    return ray.get(storage_actors()[0].stats.remote())


def delta(before: dict, after: dict, key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


@pytest.fixture(scope="module")
def one_node(conduit_tq):
    # one field on a tier a writer cannot map; every put in place however small (the default sends
    # puts under 1 MiB through Ray)
    with conduit_tq({"timeout_s": 20, "placement": {"values": "host"}, "direct_put_min_bytes": 0}):
        yield


def test_a_same_node_put_goes_in_place_once_and_reads_back_bit_identical(one_node):
    keys = [f"d{i}" for i in range(6)]
    td = grpo_batch([3, 0, 70, 1, 5, 12], seed=1)
    s0 = stats()
    tq.kv_batch_put(keys=keys, partition_id="train", fields=td)
    s1 = stats()
    nbytes = sum(td[k].values().nbytes if td[k].is_nested else td[k].nbytes for k in PAYLOAD)
    assert delta(s0, s1, "bytes_put_direct") == nbytes  # every payload byte written once, by the writer
    assert delta(s0, s1, "bytes_put_copied") == 0  # none of it went through Ray's object store
    assert delta(s0, s1, "bytes_put") == nbytes
    assert s1["plans_open"] == 0
    assert_same(tq.kv_batch_get(keys=keys, partition_id="train"), td)
    tq.kv_clear(keys=keys, partition_id="train")


def test_a_put_under_the_size_threshold_travels_as_data(one_node, monkeypatch):
    import transfer_queue.interface as tqi

    monkeypatch.setattr(tqi._TQ_CLIENT.storage_manager.client(), "direct_min_bytes", 1 << 20)
    keys = [f"s{i}" for i in range(3)]
    td = grpo_batch([3, 8, 1], seed=6)
    s0 = stats()
    tq.kv_batch_put(keys=keys, partition_id="train", fields=td)
    s1 = stats()
    nbytes = sum(column_of(k, td[k]).nbytes for k in PAYLOAD)  # as the store counts it (with offsets)
    assert delta(s0, s1, "bytes_put_copied") == nbytes and delta(s0, s1, "bytes_put_direct") == 0
    assert_same(tq.kv_batch_get(keys=keys, partition_id="train"), td)
    tq.kv_clear(keys=keys, partition_id="train")


def test_a_field_on_a_tier_the_writer_cannot_map_goes_the_old_way(one_node):
    keys = ["h0", "h1", "h2"]
    td = grpo_batch([4, 9, 2], seed=2)
    offsets = td["responses"].offsets()
    td["values"] = torch.nested.nested_tensor_from_jagged(torch.randn(int(offsets[-1])), offsets)
    s0 = stats()
    tq.kv_batch_put(keys=keys, partition_id="train", fields=td)
    s1 = stats()
    assert s1["fields"]["values"]["tier"] == "host"
    assert delta(s0, s1, "bytes_put_copied") == column_of("values", td["values"]).nbytes  # via the actor
    assert delta(s0, s1, "bytes_put_direct") > 0  # the other fields still in place, in the same put
    assert_same(tq.kv_batch_get(keys=keys, partition_id="train"), td)
    s2 = stats()
    assert delta(s1, s2, "bytes_get_copied") > 0 and delta(s1, s2, "bytes_get_mapped") > 0  # host: by copy
    assert s2["fields"]["responses"]["tier"] == "shm"
    tq.kv_clear(keys=keys, partition_id="train")


@pytest.mark.parametrize("threads", [False, True], ids=["inline", "copy-threads"])
def test_a_field_growing_between_plan_and_commit_is_planned_again(one_node, monkeypatch, threads):
    if threads:
        monkeypatch.setattr(keyed_client, "PARALLEL_COPY_MIN_BYTES", 0)
    actor = storage_actors()[0]
    real = keyed_client.write_mapped
    grown: list[int] = []
    once = threading.Lock()  # the copy threads write two fields at once
    longer = 5000 if not threads else 20_000  # longer than any row stored before: the field must grow

    def write_after_a_growth(layout, rows, column):
        with once:
            if not grown:  # another writer's longer rows move the field to a new file meanwhile
                long = TensorDict({"responses": torch.arange(longer).view(1, longer)}, [1])
                ray.get(
                    actor.call.remote(
                        "put",
                        np.array([90_000]),
                        {"responses": to_wire(column_of("responses", long["responses"]))},
                    )
                )
                grown.append(1)
        return real(layout, rows, column)

    monkeypatch.setattr(keyed_client, "write_mapped", write_after_a_growth)
    keys = ["g0", "g1"]
    td = grpo_batch([30, 7], seed=3)
    s0 = stats()
    tq.kv_batch_put(keys=keys, partition_id="train", fields=td)
    s1 = stats()
    stale = delta(s0, s1, "plans_refused") + delta(s0, s1, "plans_abandoned")  # at commit, or at the write
    assert grown and stale == 1  # the stale plan was refused, then made again
    grower = column_of("responses", torch.arange(longer).view(1, longer)).nbytes
    assert delta(s0, s1, "bytes_put_copied") == grower  # only the growing put; the retry went in place
    assert s1["plans_open"] == 0
    assert_same(tq.kv_batch_get(keys=keys, partition_id="train"), td)
    ray.get(actor.call.remote("clear", np.array([90_000])))
    tq.kv_clear(keys=keys, partition_id="train")


@ray.remote(num_cpus=0, max_calls=1)  # its process ends with it: no TQ client left in Ray's worker pool
def _writer(w: int, rounds: int, per: int) -> int:
    import conduit_verl.tq_store as s
    import transfer_queue as tq

    s.register()
    tq.init()
    for r in range(rounds):  # rows grow round by round: the two writers' plans go stale now and then
        lengths = [(r + 1) * 40 * (w + 1) + i for i in range(per)]
        keys = [f"w{w}-{r}-{i}" for i in range(per)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=grpo_batch(lengths, seed=1000 * w + r))
    return os.getpid()


def test_two_writer_processes_put_disjoint_keys_at_once(one_node):
    rounds, per = 8, 4
    s0 = stats()
    pids = ray.get([_writer.remote(w, rounds, per) for w in (0, 1)], timeout=180)
    assert len(set(pids) | {os.getpid()}) == 3  # two writer processes besides this one
    s1 = stats()
    assert delta(s0, s1, "bytes_put_copied") == 0 and delta(s0, s1, "bytes_put_direct") > 0
    assert s1["plans_open"] == 0
    for w in (0, 1):
        for r in range(rounds):
            keys = [f"w{w}-{r}-{i}" for i in range(per)]
            want = grpo_batch([(r + 1) * 40 * (w + 1) + i for i in range(per)], seed=1000 * w + r)
            assert_same(tq.kv_batch_get(keys=keys, partition_id="train"), want)
            tq.kv_clear(keys=keys, partition_id="train")


@ray.remote(num_cpus=0, max_retries=0)
def _plan_write_and_die(actor, gis: np.ndarray) -> None:
    from conduit.buffer.keyed_client import as_layout
    from conduit.buffer.mapped import write_mapped

    td = grpo_batch([6, 6], seed=4)
    cols = {k: column_of(k, td[k]) for k in td.keys()}
    _, entries = ray.get(
        actor.call.remote("write_plan", gis, {k: c.plan_spec() for k, c in cols.items()}, True)
    )
    assert set(entries) == set(PAYLOAD)
    for k, (layout, rows) in entries.items():
        write_mapped(as_layout(layout), torch.from_numpy(np.array(rows, copy=True)), cols[k].data)
    os._exit(1)  # killed between the write and the commit


def test_a_writer_killed_between_plan_and_commit_leaves_the_indexes_absent(one_node):
    actor = storage_actors()[0]
    gis = np.array([70_000, 70_001])
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(_plan_write_and_die.remote(actor, gis), timeout=120)
    assert ray.get(actor.stats.remote())["plans_open"] == 1
    with pytest.raises(ray.exceptions.RayTaskError, match=r"not stored for global indexes \[70000, 70001\]"):
        ray.get(actor.call.remote("read_plan", gis, ["responses"], False))
    # a later put of those indexes (here: straight to the actor, as the data path does) works
    td = grpo_batch([3, 11], seed=5)
    ray.get(actor.call.remote("put", gis, {k: to_wire(column_of(k, td[k])) for k in PAYLOAD}))
    wires = ray.get(actor.call.remote("get", gis, list(PAYLOAD)))
    from conduit_verl.tq_store.columns import field_of

    assert_same(TensorDict({k: field_of(from_wire(w)) for k, w in wires.items()}, [2]), td)
    with pytest.raises(ray.exceptions.RayTaskError, match="field 'rm_scores' holds scalar torch.float32"):
        ray.get(actor.call.remote("write_plan", gis, {"rm_scores": ("scalar", "torch.int64", (), 0)}, False))
    ray.get(actor.call.remote("clear", gis))


def test_a_put_of_another_dtype_is_refused_naming_the_field(one_node):
    with pytest.raises(Exception, match="field 'rm_scores' holds scalar torch.float32"):
        tq.kv_batch_put(
            keys=["e0"], partition_id="train", fields=TensorDict({"rm_scores": torch.tensor([1])}, [1])
        )


def test_large_puts_and_gets_copy_their_fields_on_threads_and_read_back_bit_identical(one_node, monkeypatch):
    from conduit.buffer import mapped

    used: list[int] = []
    real = mapped.copy_pool

    def spy():
        used.append(1)
        return real()

    monkeypatch.setattr(mapped, "copy_pool", spy)
    monkeypatch.setattr(keyed_client, "PARALLEL_COPY_MIN_BYTES", 0)  # every put and get here goes on threads
    s0 = stats()
    for round_ in range(3):  # rows grow round by round (the fields move to larger files)
        lengths = [37 * (round_ + 1) + i for i in range(12)]
        keys = [f"t{round_}-{i}" for i in range(12)]
        td = grpo_batch(lengths, seed=40 + round_)
        tq.kv_batch_put(keys=keys, partition_id="train", fields=td)
        assert_same(tq.kv_batch_get(keys=keys, partition_id="train"), td)
        tq.kv_clear(keys=keys, partition_id="train")
    assert len(used) >= 6  # one put and one get per round at least
    s1 = stats()
    assert s1["plans_open"] == s0["plans_open"] and delta(s0, s1, "bytes_put_copied") == 0
