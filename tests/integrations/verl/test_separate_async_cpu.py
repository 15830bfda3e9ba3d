"""verl's separate_async trainer in the CPU harness: its overrides and the CPU checkpoint engine's box."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("conduit_verl_cpu")

from conduit_verl_cpu.overrides import CPURunSpec, cpu_overrides  # noqa: E402


def _spec(mode: str) -> CPURunSpec:
    p = Path("/nonexistent")
    return CPURunSpec(model_dir=p, train_file=p, val_file=p, work_dir=p, trainer_mode=mode)


def test_separate_async_gets_its_own_rollout_gpu_and_the_cpu_checkpoint_engine() -> None:
    out = cpu_overrides(_spec("separate_async"))
    assert "+ray_kwargs.ray_init.num_gpus=2" in out
    assert "actor_rollout_ref.hybrid_engine=False" in out
    assert (
        "actor_rollout_ref.rollout.n_gpus_per_node=1" in out and "actor_rollout_ref.rollout.nnodes=1" in out
    )
    assert "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_ray" in out
    assert "trainer.v1.separate_async.parameter_sync_step=1" in out  # weights synced every step
    assert "trainer.v1.trainer_mode=separate_async" in out
    for mode in ("sync", "colocate_async", "conduit"):
        other = cpu_overrides(_spec(mode))
        assert "+ray_kwargs.ray_init.num_gpus=1" in other
        assert not any("separate_async" in o or "checkpoint_engine" in o for o in other)


def test_the_cpu_engine_registers_under_the_name_the_overrides_use() -> None:
    from conduit_verl_cpu import cpu_checkpoint
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    assert cpu_checkpoint.BACKEND == "cpu_ray"
    assert CheckpointEngineRegistry.get("cpu_ray") is cpu_checkpoint.RayObjectCheckpointEngine


def test_weight_box_hands_each_new_version_to_a_waiting_reader() -> None:
    from conduit_verl_cpu.cpu_checkpoint import WeightBox

    async def scenario() -> None:
        box = WeightBox()
        reader = asyncio.create_task(box.get(0))
        await asyncio.sleep(0.01)
        assert not reader.done()  # nothing put yet: the rollout waits for the trainer
        await box.put({"w": 1})
        assert await reader == (1, {"w": 1})
        await box.put({"w": 2})
        assert await box.get(1) == (2, {"w": 2})  # a reader that saw version 1 gets the next one
        late = asyncio.create_task(box.get(2))
        await asyncio.sleep(0.01)
        assert not late.done()

    asyncio.run(scenario())
