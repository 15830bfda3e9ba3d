"""The Conduit TransferQueue backend across three Ray nodes on one machine (producers, storage, consumers apart)."""

from __future__ import annotations

import pytest

pytest.importorskip("transfer_queue")

import conduit_verl.tq_store as tq_store  # noqa: E402
import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def storage_actors() -> list:
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    names = ray.get(controller.get_config.remote()).backend.Conduit.actors
    return [ray.get_actor(n, namespace="transfer_queue") for n in names]


@ray.remote(num_cpus=0)
def _produce(base: int, n: int) -> str:
    import conduit_verl.tq_store as s
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict

    s.register()
    tq.init()
    offsets = torch.arange(n + 1, dtype=torch.int64) * 3
    values = torch.arange(base * 1000, base * 1000 + 3 * n)
    fields = TensorDict({"responses": torch.nested.nested_tensor_from_jagged(values, offsets)}, [n])
    tq.kv_batch_put(keys=[f"p{base}_{i}" for i in range(n)], partition_id="train", fields=fields)
    return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=0)
def _consume(keys: list[str]) -> tuple[str, list[list[int]]]:
    import conduit_verl.tq_store as s
    import transfer_queue as tq

    s.register()
    tq.init()
    out = tq.kv_batch_get(keys=keys, partition_id="train")
    return ray.get_runtime_context().get_node_id(), [x.tolist() for x in out["responses"].unbind()]


def test_three_nodes_producers_storage_and_consumers_apart(no_shared_ray, monkeypatch):
    from conduit_rllib.local_ray import LOOPBACK_ENV, start_local_cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # start_local_cluster keeps every node on loopback (the setting and Ray's constant): undone afterwards
    monkeypatch.setenv(LOOPBACK_ENV, "0")
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    args = {"num_cpus": 1, "object_store_memory": 256 * 2**20}
    cluster, ids = start_local_cluster(3, args, namespace="conduit_tq_3nodes")
    try:
        tq_store.register()
        tq.init(
            OmegaConf.create(
                {
                    "controller": {"polling_mode": True},
                    "backend": {"storage_backend": "Conduit", "Conduit": {"timeout_s": 30}},
                }
            )
        )
        assert len({ray.get(a.node_id.remote()) for a in storage_actors()}) == 3  # one store per node

        def on(i: int):
            return NodeAffinitySchedulingStrategy(node_id=ids[i], soft=False)

        made = ray.get([_produce.options(scheduling_strategy=on(1)).remote(b, 6) for b in range(2)])
        assert set(made) == {ids[1]}
        keys = [f"p{b}_{i}" for b in range(2) for i in range(6)]
        node, got = ray.get(_consume.options(scheduling_strategy=on(2)).remote(keys))
        assert node == ids[2]
        want = [[b * 1000 + 3 * i + k for k in range(3)] for b in range(2) for i in range(6)]
        assert got == want  # every sample once, the same tensors back, across nodes
        stats = ray.get([a.stats.remote() for a in storage_actors()])
        assert sum(s.get("bytes_get_copied", 0) for s in stats) > 0  # cross-node reads went through Ray
        tq.kv_clear(keys=keys, partition_id="train")
        tq.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
