"""Trainer mode ``conduit`` with the Conduit TQ backend composes with verl's Megatron config.

Running Megatron needs GPUs; here: verl's own Megatron trainer config resolves with the conduit knobs,
the streaming pieces split over the data-parallel ranks of a tp x pp mesh, and a tp x dp mesh of
consumers reads its shards through TransferQueue: data-parallel ranks get distinct samples, the
tensor-parallel peers of one rank the same ones, and on one node no peer costs a transfer (each
gathers from the store's shared memory).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("verl")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tq_reader import Reader  # noqa: E402  (one (dp, tp) rank of the mesh)

TP, PP, DP = 2, 2, 2


def megatron_config():
    import verl

    path = os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_megatron_trainer.yaml")
    cfg = OmegaConf.load(path)
    overrides = [
        "trainer.v1.trainer_mode=conduit",
        "+trainer.v1.conduit.piece_groups=auto",
        "transfer_queue.backend.storage_backend=Conduit",
        "+transfer_queue.backend.Conduit.placement.old_log_probs=host",
        f"trainer.n_gpus_per_node={TP * PP * DP}",
        f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={TP}",
        f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={PP}",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    ]
    OmegaConf.set_struct(cfg, False)
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))


def test_megatron_config_resolves_with_conduit_mode_and_backend():
    from conduit_verl.checks import piece_unit
    from conduit_verl.tq_store.store import check_placement
    from conduit_verl.trainer import ConduitTrainerConfig, _dp_size, _infer_micro_batches

    cfg = megatron_config()
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"
    knobs = ConduitTrainerConfig.from_verl(cfg)
    assert knobs.overlap == "async" and knobs.piece_groups == "auto"
    assert _dp_size(cfg) == DP  # 8 GPUs over tp=2 x pp=2
    # a piece splits over the 2 dp ranks into whole micro-batches of 4 samples: 2 groups of n=4
    assert piece_unit(8, 4, _infer_micro_batches(cfg), knobs.piece_groups, _dp_size(cfg)) == 2
    check_placement(dict(cfg.transfer_queue.backend.Conduit.placement))


@pytest.mark.ray
@pytest.mark.slow  # four rank processes; fast counterpart: test_tq_store_ray.py's two-reader shards test
def test_a_tp_by_dp_mesh_reads_distinct_shards_and_peers_share_them(conduit_tq):
    with conduit_tq({}):
        n = 8
        offsets = torch.arange(n + 1, dtype=torch.int64) * 5
        keys = [f"s{i}" for i in range(n)]
        fields = TensorDict(
            {"responses": torch.nested.nested_tensor_from_jagged(torch.arange(5 * n), offsets)}, [n]
        )
        tq.kv_batch_put(keys=keys, partition_id="train", fields=fields)
        shards = [keys[d * n // DP : (d + 1) * n // DP] for d in range(DP)]  # verl's contiguous dp split
        mesh = {(d, t): Reader.remote() for d in range(DP) for t in range(TP)}
        got = {rank: ray.get(actor.read.remote(shards[rank[0]])) for rank, actor in mesh.items()}
        for d in range(DP):
            assert got[(d, 0)] == got[(d, 1)]  # tensor-parallel peers read the same samples
        flat = [tuple(r) for d in range(DP) for r in got[(d, 0)]]
        assert len(flat) == n and len(set(flat)) == n  # data-parallel shards are distinct and cover all
        controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
        names = ray.get(controller.get_config.remote()).backend.Conduit.actors
        stats = ray.get(ray.get_actor(names[0], namespace="transfer_queue").stats.remote())
        assert stats.get("bytes_get_copied", 0) == 0 and stats["bytes_get_mapped"] > 0  # no per-peer transfer
        for actor in mesh.values():
            ray.kill(actor)
