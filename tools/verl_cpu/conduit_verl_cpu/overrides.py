"""The hydra overrides that put verl's ``main_ppo`` (V1 trainer, GRPO) in CPU mode."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from conduit_verl_cpu import reward

FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"

#: ``--tq-backend`` choice -> TransferQueue's ``transfer_queue.backend.storage_backend``
TQ_BACKENDS = {"conduit": "Conduit", "simple": "SimpleStorage"}


@dataclass(frozen=True)
class CPURunSpec:
    """Inputs of one CPU run: where the tiny model/data live and the loop's size."""

    model_dir: Path
    train_file: Path
    val_file: Path
    work_dir: Path
    trainer_mode: str = "sync"
    steps: int = 2
    seed: int = 0
    batch_size: int = 4  # prompts per step
    n: int = 4  # responses per prompt (GRPO group size)
    lr: float = 1e-3
    max_prompt_length: int = 32
    max_response_length: int = 16
    algo: str = "grpo"  # "grpo" (group advantage, no critic) or "ppo" (GAE with a critic)
    tq_backend: str = "simple"  # a TQ_BACKENDS key: TransferQueue's storage backend
    tq_placement: tuple[tuple[str, str], ...] = ()  # Conduit backend: (field, tier) pairs
    pace: tuple[tuple[str, float], ...] = ()  # paced rollout: pace.PaceModel fields; () = plain "hf"
    rollout: str = "hf"  # "hf" (also paced) or "vllm": verl's own vLLM rollout on vLLM's CPU build
    fixed_length: bool = False  # every response at max_response_length (fixed_length_overrides)


def critic_overrides(spec: CPURunSpec) -> list[str]:
    """PPO's critic in CPU mode: the same tiny model, FSDP2 on gloo, eager attention."""
    micro = spec.batch_size * spec.n
    return [
        "algorithm.adv_estimator=gae",
        "critic.enable=True",
        "critic.strategy=fsdp2",
        f"critic.model.path={spec.model_dir}",
        "+critic.model.override_config.attn_implementation=eager",
        "critic.model.use_remove_padding=False",
        "critic.model.enable_gradient_checkpointing=False",
        f"critic.optim.lr={spec.lr}",
        f"critic.ppo_mini_batch_size={spec.batch_size}",
        f"critic.ppo_micro_batch_size_per_gpu={micro}",
        f"critic.forward_micro_batch_size_per_gpu={spec.n}",
        f"critic.data_loader_seed={spec.seed}",
        f"+critic.fsdp.mixed_precision={FP32}",  # the critic engine config is `critic.fsdp`
    ]


def tq_overrides(spec: CPURunSpec) -> list[str]:
    """TransferQueue's storage: verl's SimpleStorage (2 units), or Conduit's backend with placements."""
    if spec.tq_backend == "simple":
        if spec.tq_placement:
            raise ValueError("a TransferQueue placement needs the Conduit backend (--tq-backend conduit)")
        return ["transfer_queue.backend.SimpleStorage.num_data_storage_units=2"]
    if spec.tq_backend != "conduit":
        raise ValueError(
            f"unknown TransferQueue backend {spec.tq_backend!r}; one of {', '.join(TQ_BACKENDS)}"
        )
    section = "+transfer_queue.backend.Conduit.placement"
    return [
        "transfer_queue.backend.storage_backend=Conduit",
        *(f"{section}.{field}={tier}" for field, tier in spec.tq_placement),
    ]


def vllm_overrides(spec: CPURunSpec) -> list[str]:
    """verl's vLLM rollout on vLLM's CPU build (docs/vllm_cpu_seams.md): no sleep mode on CPU (S2),
    eager fp32 like the actor (S5), a context that fits the model; weights come from the actor at
    every sync (``load_format=dummy``, verl's default)."""
    if spec.rollout != "vllm":
        return []
    arr = "actor_rollout_ref"
    return [
        f"+{arr}.rollout.enable_sleep_mode=False",
        f"{arr}.rollout.free_cache_engine=False",
        f"{arr}.rollout.enforce_eager=True",
        f"{arr}.rollout.dtype=float32",
        f"{arr}.rollout.disable_log_stats=False",  # vLLM's counters on /metrics (vllm_cpu.log_engine_stats)
        f"{arr}.rollout.max_model_len={spec.max_prompt_length + spec.max_response_length}",
    ]


def fixed_length_overrides(spec: CPURunSpec) -> list[str]:
    """Every response at ``max_response_length``, so systems that time differently still train the
    same work. vLLM: verl's ``rollout.ignore_eos`` (``RolloutConfig.ignore_eos``; verl's vLLM server
    sets it in every request's ``SamplingParams``, ``vllm_async_server.py``), so a response stops at
    ``max_tokens`` = the response length only. The paced rollout needs no override: its lengths are
    drawn from the pace model, which ``run.pace_settings`` fixes at the cap (checked here). The hf
    rollout is refused: its server stops at EOS and has no switch to ignore it."""
    if not spec.fixed_length:
        return []
    if spec.rollout == "vllm":
        return ["actor_rollout_ref.rollout.ignore_eos=True"]
    pace = dict(spec.pace)
    if not pace:
        raise ValueError(
            "fixed-length responses need --rollout vllm (verl's ignore_eos) or paced (lengths drawn at "
            "the cap); the hf rollout stops at EOS and has no switch to ignore it"
        )
    if pace.get("tail") != 1 or pace.get("median_len", 0) < spec.max_response_length:
        raise ValueError(
            f"fixed-length paced responses need median_len >= {spec.max_response_length} and tail 1 "
            f"(every drawn length at the cap), got {pace}"
        )
    return []


def separate_async_overrides(spec: CPURunSpec) -> list[str]:
    """verl's ``separate_async`` trainer: the rollout on a fake GPU of its own (``hybrid_engine=False``:
    no rollout on the trainer's), weights synced after every step (``parameter_sync_step=1``: verl
    requires train batch = sync steps x mini-batch, and the harness's mini-batch is the whole batch)
    through the CPU checkpoint engine (``cpu_checkpoint.py``; verl's own engines need GPUs)."""
    if spec.trainer_mode != "separate_async":
        return []
    arr = "actor_rollout_ref"
    return [
        f"{arr}.hybrid_engine=False",
        f"{arr}.rollout.nnodes=1",
        f"{arr}.rollout.n_gpus_per_node=1",
        f"{arr}.rollout.checkpoint_engine.backend=cpu_ray",  # cpu_checkpoint.BACKEND (imports verl)
        f"{arr}.rollout.checkpoint_engine.custom_backend_module=conduit_verl_cpu.cpu_checkpoint",
        "trainer.v1.separate_async.parameter_sync_step=1",
    ]


def cpu_overrides(spec: CPURunSpec) -> list[str]:
    """Overrides for ``verl/trainer/config/ppo_trainer.yaml``; numbers are the notes' obstacles."""
    arr = "actor_rollout_ref"
    micro = spec.batch_size * spec.n
    algo = critic_overrides(spec) if spec.algo == "ppo" else ["algorithm.adv_estimator=grpo"]
    return [
        # the task
        *algo,
        f"data.train_files=['{spec.train_file}']",
        f"data.val_files=['{spec.val_file}']",
        f"data.train_batch_size={spec.batch_size}",
        f"data.max_prompt_length={spec.max_prompt_length}",
        f"data.max_response_length={spec.max_response_length}",
        "data.dataloader_num_workers=0",
        f"data.seed={spec.seed}",
        f"reward.custom_reward_function.path={reward.__file__}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",
        # the model: a local HF dir, eager attention (6), FSDP2 (7) on gloo
        f"{arr}.model.path={spec.model_dir}",
        f"+{arr}.model.override_config.attn_implementation=eager",
        f"{arr}.model.use_remove_padding=False",
        f"{arr}.model.enable_gradient_checkpointing=False",
        f"{arr}.actor.strategy=fsdp2",
        # fp32 compute (CPU has no fast bf16; the rollout is fp32 too): results do not depend on
        # how a batch is cut into micro-batches beyond fp32 rounding
        f"+{arr}.actor.fsdp_config.mixed_precision={FP32}",
        f"+{arr}.ref.fsdp_config.mixed_precision={FP32}",
        f"{arr}.ref.strategy=fsdp2",
        f"{arr}.actor.optim.lr={spec.lr}",
        f"{arr}.actor.ppo_mini_batch_size={spec.batch_size}",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"{arr}.actor.use_kl_loss=True",
        f"{arr}.actor.kl_loss_coef=0.001",
        f"{arr}.actor.entropy_coeff=0",
        f"{arr}.actor.data_loader_seed={spec.seed}",
        # inference micro-batch = one GRPO group, so the conduit mode's per-group pieces split evenly
        f"{arr}.ref.log_prob_micro_batch_size_per_gpu={spec.n}",
        # the rollout: rollout "hf" (10) or verl's "vllm", receiving weights after every step
        f"{arr}.rollout.name={'vllm' if spec.rollout == 'vllm' else 'hf'}",
        *vllm_overrides(spec),
        *fixed_length_overrides(spec),
        f"{arr}.rollout.n={spec.n}",
        f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={spec.n}",
        f"{arr}.rollout.agent.num_workers=1",
        f"{arr}.rollout.seed={spec.seed}",
        # the paced rollout (pace.py): real tokens, released at a modelled inference server's times
        *(f"+{arr}.rollout.engine_kwargs.hf.paced.{k}={v}" for k, v in spec.pace),
        # devices and Ray: 1 fake GPU (2), enough CPU slots for TQ (1), loopback only
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "ray_kwargs.ray_init.num_cpus=32",
        # separate_async: a second fake GPU for its rollout
        f"+ray_kwargs.ray_init.num_gpus={2 if spec.trainer_mode == 'separate_async' else 1}",
        "+ray_kwargs.ray_init.include_dashboard=False",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        # always a new cluster of its own: with no address, ray.init joins a local cluster that is
        # already running (another job's), and then refuses num_cpus/num_gpus
        "+ray_kwargs.ray_init.address=local",
        *tq_overrides(spec),
        *separate_async_overrides(spec),
        # the loop
        f"trainer.v1.trainer_mode={spec.trainer_mode}",
        "trainer.v1.sampler.max_off_policy_threshold=null",
        f"trainer.total_training_steps={spec.steps}",
        "trainer.total_epochs=1000",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console','file']",
        "trainer.project_name=conduit_cpu",
        f"trainer.experiment_name={spec.algo}_{spec.trainer_mode}_s{spec.seed}",
        f"trainer.default_local_dir={spec.work_dir / 'ckpt'}",
        f"hydra.run.dir={spec.work_dir / 'hydra'}",
    ]
