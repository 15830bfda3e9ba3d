"""What the CPU harness needs from verl, checked with ``conduit_verl.compat``'s checker.

The product's seams live in ``conduit_verl/compat.py``; these are the harness's own (a platform,
a rollout, value-head loading, the replay buffer's poll, the per-step sample dump). The launcher
checks them before it starts verl (:func:`check`), and ``tests/integrations/verl/test_verl_compat.py``
checks each against the installed verl. Importing this module imports verl's trainer package: only
the launcher and the tests do, never the plugin.
"""

from __future__ import annotations

from conduit_verl.compat import Seam, attribute_seam, check_seams, method_seam

_REPLICA = "verl.workers.rollout.replica"
_BASE = "verl.workers.rollout.base"
_BUFFER = "verl.trainer.ppo.v1.replay_buffer"
_ON_REPLICA = {"cls": "RolloutReplica", "module": _REPLICA, "owner": "rollout replica"}
_ON_BUFFER = {"cls": "ReplayBuffer", "module": _BUFFER, "owner": "replay buffer"}


SEAMS: tuple[Seam, ...] = (
    # the CPU platform (platform.py)
    Seam("class `PlatformBase`", "verl.plugin.platform", "PlatformBase"),
    Seam(
        "`PlatformRegistry.register`",
        "verl.plugin.platform",
        "PlatformRegistry.register",
        params=("platform",),
    ),
    # the "hf" rollout (registration.py, rollout.py, hf_server.py)
    Seam(
        "`RolloutReplicaRegistry.register`",
        _REPLICA,
        "RolloutReplicaRegistry.register",
        params=("name", "loader"),
    ),
    method_seam("launch_servers", **_ON_REPLICA),
    method_seam("rollout_worker_use_gpu", **_ON_REPLICA),
    Seam("rollout replica property `max_concurrency`", _REPLICA, "RolloutReplica.max_concurrency"),
    *(
        attribute_seam(name, "rollout replica", _REPLICA)
        for name in (
            "replica_rank",
            "is_reward_model",
            "is_teacher_model",
            "name_suffix",
            "model_config",
            "config",
            "servers",
            "_server_handle",
            "_server_address",
        )
    ),
    Seam(
        "class `TokenOutput`",
        _REPLICA,
        "TokenOutput",
        params=("token_ids", "log_probs", "stop_reason", "extra_fields"),
    ),
    Seam("module global `rollout.base._ROLLOUT_REGISTRY`", _BASE, "_ROLLOUT_REGISTRY"),
    # the paced rollout's settings ride in rollout.engine_kwargs.hf.paced (rollout.paced_settings)
    Seam(
        "rollout config field `engine_kwargs`",
        "verl.workers.config.rollout",
        "RolloutConfig",
        source="engine_kwargs: dict",
    ),
    Seam("class `BaseRollout`", _BASE, "BaseRollout", params=("config", "model_config", "device_mesh")),
    Seam("rollout method `update_weights`", _BASE, "BaseRollout.update_weights"),
    # PPO's critic on CPU (patches._patch_valuehead_model)
    Seam(
        "function `verl.utils.model.load_valuehead_model`",
        "verl.utils.model",
        "load_valuehead_model",
        params=("local_path", "torch_dtype", "model_config", "trust_remote_code"),
    ),
    # the tuned baseline's poll period (patches._patch_poll_interval)
    method_seam("sample", "global_steps", "partition_id", "batch_size", **_ON_BUFFER),
    method_seam(
        "wait_for_sampleable",
        "global_steps",
        "partition_id",
        "target_count",
        cls="ReplayBufferAsync",
        module=_BUFFER,
        owner="replay buffer",
    ),
    attribute_seam("poll_interval", "replay buffer", _BUFFER),
    # the per-step sample dump (dump.py)
    method_seam("_compute_metrics", "batch", "metrics", "timing_raw", "global_steps", "epoch"),
    # which storage backend ran, and the Conduit backend's counters (tq_stats.py)
    Seam(
        "TransferQueue function `close` (reads `_TQ_STORAGE`)",
        "transfer_queue.interface",
        "close",
        source="_TQ_STORAGE",
    ),
    # verl's separate_async trainer on CPU (cpu_checkpoint.py; patches._patch_separate_async_logger)
    Seam(
        "`CheckpointEngineRegistry.register`",
        "verl.checkpoint_engine.base",
        "CheckpointEngineRegistry.register",
        params=("backend",),
    ),
    Seam("class `CheckpointEngine`", "verl.checkpoint_engine.base", "CheckpointEngine"),
    Seam(
        "module global `trainer_separate_async.logger`",
        "verl.trainer.ppo.v1.trainer_separate_async",
        "logger",
    ),
    # the entry point the launcher calls (run.py)
    Seam("function `verl.trainer.main_ppo.main`", "verl.trainer.main_ppo", "main"),
)


def check(rollout: str = "hf") -> None:
    """Raise ``conduit_verl.errors.VerlCompatError`` naming whatever the installed verl lacks
    (with ``rollout="vllm"`` also what the vLLM seams use: ``vllm_cpu.SEAMS``, which imports vLLM)."""
    from conduit_verl_cpu import vllm_cpu

    check_seams(SEAMS + (vllm_cpu.SEAMS if rollout == "vllm" else ()))
