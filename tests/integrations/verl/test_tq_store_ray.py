"""The Conduit TransferQueue backend through TQ's own client API, on Ray (one node, then three)."""

from __future__ import annotations

import ipaddress
import os
import sys
import time

import pytest
import torch

pytest.importorskip("transfer_queue")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tq_reader import Reader  # noqa: E402

pytestmark = pytest.mark.ray

# Ray's workers cannot import this test module: its remote classes travel by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def jagged(lengths: list[int], start: int = 0, dtype=torch.int64) -> torch.Tensor:
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return torch.nested.nested_tensor_from_jagged(
        torch.arange(start, start + int(offsets[-1])).to(dtype), offsets
    )


def rows(nt: torch.Tensor) -> list[list]:
    return [x.tolist() for x in nt.unbind()]


def storage_actors() -> list:
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    names = ray.get(controller.get_config.remote()).backend.Conduit.actors
    return [ray.get_actor(n, namespace="transfer_queue") for n in names]


@pytest.fixture(scope="module")
def one_node(conduit_tq):
    with conduit_tq({"timeout_s": 5}):
        yield


def test_put_get_upsert_and_clear(one_node):
    tq.kv_batch_put(
        keys=["a", "b", "c"],
        partition_id="train",
        fields=TensorDict({"responses": jagged([2, 1, 3]), "rm_scores": torch.tensor([1.0, 2.0, 3.0])}, [3]),
    )
    lp = jagged([2, 1, 3], dtype=torch.float32)
    tq.kv_batch_put(keys=["a", "b", "c"], partition_id="train", fields=TensorDict({"old_log_probs": lp}, [3]))
    out = tq.kv_batch_get(keys=["c", "a"], partition_id="train")
    assert rows(out["responses"]) == [[3, 4, 5], [0, 1]]
    assert out["rm_scores"].tolist() == [3.0, 1.0]
    assert rows(out["old_log_probs"]) == [[3.0, 4.0, 5.0], [0.0, 1.0]]
    stats = ray.get(storage_actors()[0].stats.remote())
    assert stats["bytes_get_mapped"] > 0  # the same-node reader read the store's memory in place
    tq.kv_clear(keys=["a", "b", "c"], partition_id="train")
    assert tq.kv_list(partition_id="train") == {"train": {}}


def test_partitions_do_not_leak_and_a_cleared_index_is_reused_cleanly(one_node):
    tq.kv_batch_put(keys=["k"], partition_id="train", fields=TensorDict({"responses": jagged([3])}, [1]))
    tq.kv_batch_put(
        keys=["k"], partition_id="val", fields=TensorDict({"responses": jagged([2], start=50)}, [1])
    )
    assert rows(tq.kv_batch_get(keys=["k"], partition_id="train")["responses"]) == [[0, 1, 2]]
    assert rows(tq.kv_batch_get(keys=["k"], partition_id="val")["responses"]) == [[50, 51]]
    tq.kv_clear(keys=["k"], partition_id="train")
    tq.kv_batch_put(
        keys=["k2"], partition_id="train", fields=TensorDict({"rm_scores": torch.tensor([7.0])}, [1])
    )
    out = tq.kv_batch_get(keys=["k2"], partition_id="train")
    assert list(out.keys()) == ["rm_scores"] and out["rm_scores"].tolist() == [
        7.0
    ]  # no field of the old sample
    assert rows(tq.kv_batch_get(keys=["k"], partition_id="val")["responses"]) == [[50, 51]]
    tq.kv_clear(keys=["k2"], partition_id="train")
    tq.kv_clear(keys=["k"], partition_id="val")


def test_many_small_puts_read_back_as_one_batch(one_node):
    keys = [f"t{i}" for i in range(16)]
    for i, key in enumerate(keys):  # verl's agent loop puts each trajectory on its own (batch 1)
        tq.kv_batch_put(
            keys=[key], partition_id="train", fields=TensorDict({"responses": torch.full((1, i + 1), i)}, [1])
        )
    out = tq.kv_batch_get(keys=keys, partition_id="train")
    assert rows(out["responses"]) == [[i] * (i + 1) for i in range(16)]
    tq.kv_clear(keys=keys, partition_id="train")


def test_concurrent_small_puts_are_combined_and_each_reads_back(one_node):
    import asyncio

    import transfer_queue.interface as tqi

    store = storage_actors()[0]
    before = ray.get(store.stats.remote()).get("puts", 0)
    n = 24

    async def all_puts() -> None:
        await asyncio.gather(
            *(
                tqi.async_kv_batch_put(
                    keys=[f"c{i}"],
                    partition_id="train",
                    fields=TensorDict({"responses": jagged([i + 1], 10 * i)}, [1]),
                )
                for i in range(n)
            )
        )

    tqi._maybe_create_tq_client()._run_coroutine(all_puts())
    calls = ray.get(store.stats.remote())["puts"] - before
    assert calls < n  # puts queued behind a call in flight went together
    keys = [f"c{i}" for i in range(n)]
    out = tq.kv_batch_get(keys=keys, partition_id="train")
    assert rows(out["responses"]) == [list(range(10 * i, 10 * i + i + 1)) for i in range(n)]
    tq.kv_clear(keys=keys, partition_id="train")


def test_reader_processes_read_distinct_shards_and_peers_share_them_in_place(one_node):
    """test_megatron_compose's tp x dp mesh (slow: four rank processes) on two: this process reads both
    data-parallel shards, a reader process (its tensor-parallel peer) the first; neither costs a copy."""
    n = 8
    keys = [f"m{i}" for i in range(n)]
    tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({"responses": jagged([5] * n)}, [n]))
    shards = [keys[: n // 2], keys[n // 2 :]]  # verl's contiguous dp split
    before = ray.get(storage_actors()[0].stats.remote())
    peer = Reader.remote()
    peer0 = ray.get(peer.read.remote(shards[0]))
    mine = [
        rows(tq.kv_batch_get(keys=k, partition_id="train", select_fields=["responses"])["responses"])
        for k in shards
    ]
    assert peer0 == mine[0]  # tensor-parallel peers (two processes) read the same samples
    flat = [tuple(r) for r in mine[0] + mine[1]]
    assert len(flat) == n and len(set(flat)) == n  # data-parallel shards are distinct and cover all
    after = ray.get(storage_actors()[0].stats.remote())
    assert after.get("bytes_get_copied", 0) == before.get("bytes_get_copied", 0)  # no per-peer transfer
    assert after["bytes_get_mapped"] > before.get("bytes_get_mapped", 0)
    ray.kill(peer)
    tq.kv_clear(keys=keys, partition_id="train")


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def test_ray_and_what_we_start_on_it_listen_on_loopback_only(one_node):
    """test_loopback.py's cases (slow: a fresh Ray each) on the shared Ray, which init_local_ray started
    after Ray was imported (tests/integrations/conftest.py): with TransferQueue, Conduit's storage and a
    completion channel on it, every socket of this process tree listens on loopback."""
    psutil = pytest.importorskip("psutil")
    from conduit_verl.completion import CompletionChannel

    tq.kv_batch_put(keys=["l"], partition_id="train", fields=TensorDict({"responses": jagged([3])}, [1]))
    assert rows(tq.kv_batch_get(keys=["l"], partition_id="train")["responses"]) == [[0, 1, 2]]
    channel = CompletionChannel.remote()
    ray.get(channel.finished.remote("train"))
    pid = ray.remote(num_cpus=0)(lambda: os.getpid())
    ray.get([pid.remote() for _ in range(2)])
    me = psutil.Process()
    tree = {p.pid: p.name() for p in [me, *me.children(recursive=True)]}
    listening = [
        (c.laddr.ip, c.laddr.port, tree[c.pid])
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in tree
    ]
    ray.kill(channel)
    tq.kv_clear(keys=["l"], partition_id="train")
    assert len(listening) >= 3, listening  # GCS, raylet, workers at least: the listing works
    exposed = [sock for sock in listening if not is_loopback(sock[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_a_dead_storage_actor_gives_a_clear_error_not_a_hang(one_node):
    tq.kv_batch_put(keys=["x"], partition_id="train", fields=TensorDict({"responses": jagged([2])}, [1]))
    actors = storage_actors()
    pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in actors])
    for actor in actors:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30  # ray.kill returns before the process is gone (its port still answers)
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    with pytest.raises(
        Exception, match="Conduit storage actor .* (died|not reachable|did not answer)"
    ) as err:
        tq.kv_batch_get(keys=["x"], partition_id="train")
    assert time.monotonic() - t0 < 30
    if "died" in str(err.value):  # the lost samples are named by id
        assert "global indexes [" in str(err.value)
    t0 = time.monotonic()  # a write fails clearly too (test_process_kills.py: the same after a SIGKILL)
    with pytest.raises(Exception, match="Conduit storage actor"):
        tq.kv_batch_put(
            keys=["z"], partition_id="train", fields=TensorDict({"rm_scores": torch.tensor([1.0])}, [1])
        )
    assert time.monotonic() - t0 < 30
