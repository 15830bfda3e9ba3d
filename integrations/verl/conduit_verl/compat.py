"""Every place conduit_verl reaches into verl or TransferQueue, in one file.

verl has public extension points (the ``verl.plugins`` entry point, ``register_trainer``, trainer
modes, ``rollout.agent.agent_loop_manager_class``), but the streaming mode also needs verl's
*private* trainer methods, a module global it swaps for one piece (``trainer_base.tq``), a function
it swaps for one call (the GAE), the replay buffer's metadata view and the agent-loop worker's Ray
actor class. Each of those is a :class:`Seam` in :data:`SEAMS`, and the rest of conduit_verl uses
them only through the names defined below, so a verl release that renames or reshapes one of them
breaks here, at import, with a message that names it:

    verl 0.10.0: trainer method `_compute_old_log_prob` not found; conduit_verl supports verl 0.9.1

(:class:`VerlCompatError`). Another verl or TransferQueue version that still has every seam only
logs a warning. ``tests/integrations/verl/test_verl_compat.py`` checks each seam against the installed verl.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from conduit_verl.errors import VerlCompatError

logger = logging.getLogger(__name__)

#: The releases conduit_verl was tested with.
TESTED_VERL = ("0.9.1",)
TESTED_TRANSFER_QUEUE = ("0.1.10", "0.1.11")

_TRAINER = "verl.trainer.ppo.v1.trainer_base"
_COLOCATE_ASYNC = "verl.trainer.ppo.v1.trainer_colocate_async"
_BUFFER = "verl.trainer.ppo.v1.replay_buffer"
_AGENT_LOOP = "verl.trainer.ppo.v1.agent_loop_tq"
_TQ_MANAGERS = "transfer_queue.storage.managers.base"


@dataclass(frozen=True)
class Seam:
    """One thing conduit_verl needs from verl or TransferQueue, and how to check that it is there.

    Args:
        what: how an error names it ("trainer method `_compute_old_log_prob`").
        module: the module it lives in.
        path: dotted attribute path inside ``module`` ("" = the module itself).
        params: parameter names it must take (``self`` excluded), in this order.
        assigns: an instance attribute the module's code must assign (``self.<name> =``).
        source: text the object's source must contain (a name verl looks up at call time).
        actor: it is a Ray actor class (``@ray.remote``; the Python class is ``__ray_actor_class__``).
    """

    what: str
    module: str
    path: str = ""
    params: tuple[str, ...] = ()
    assigns: str | None = None
    source: str | None = None
    actor: bool = False


def method_seam(
    name: str, *params: str, cls: str = "PPOTrainer", module: str = _TRAINER, owner: str = "trainer"
) -> Seam:
    """The seam of method ``cls.name`` in ``module``, taking ``params`` (verl's trainer by default)."""
    return Seam(f"{owner} method `{name}`", module, f"{cls}.{name}", params=params)


def attribute_seam(name: str, owner: str = "trainer", module: str = _TRAINER) -> Seam:
    """The seam of instance attribute ``name`` that ``module``'s code assigns (on verl's trainer by default)."""
    return Seam(f"{owner} attribute `{name}`", module, assigns=name)


_REPLAY = {"cls": "ReplayBuffer", "module": _BUFFER, "owner": "replay buffer"}
_ANY_REPLAY = {"module": _BUFFER, "owner": "replay buffer"}
_AGENT_WORKER = {
    "cls": "AgentLoopWorkerTQ.__ray_actor_class__",
    "module": _AGENT_LOOP,
    "owner": "agent-loop worker",
}

SEAMS: tuple[Seam, ...] = (
    # TransferQueue's client API (what the driver-side stages and the whitening read and write)
    Seam(
        "TransferQueue class `KVBatchMeta`",
        "transfer_queue",
        "KVBatchMeta",
        params=("keys", "tags", "partition_id", "fields", "extra_info"),
    ),
    Seam(
        "TransferQueue function `kv_batch_get`",
        "transfer_queue",
        "kv_batch_get",
        params=("keys", "partition_id", "select_fields"),
    ),
    Seam(
        "TransferQueue function `kv_batch_put`",
        "transfer_queue",
        "kv_batch_put",
        params=("keys", "partition_id", "fields", "tags"),
    ),
    # TransferQueue's storage plug point (the Conduit backend, ``tq_store/``, subclasses and registers)
    Seam(
        "TransferQueue class `StorageManager`",
        _TQ_MANAGERS,
        "StorageManager.__init__",
        params=("controller_info", "config", "zmq_context"),
    ),
    *(
        Seam(
            f"TransferQueue method `StorageManager.{name}`",
            _TQ_MANAGERS,
            f"StorageManager.{name}",
            params=params,
        )
        for name, params in (
            ("put_data", ("data", "metadata", "data_parser")),
            ("get_data", ("metadata",)),
            ("clear_data", ("metadata",)),
            ("notify_data_update", ("partition_id", "global_indexes", "field_schema", "custom_backend_meta")),
        )
    ),
    Seam(
        "TransferQueue `StorageManagerFactory.register`",
        _TQ_MANAGERS,
        "StorageManagerFactory.register",
        params=("manager_type",),
    ),
    Seam(
        "TransferQueue `StorageBootstrapProvider.register_provider`",
        "transfer_queue.storage.bootstrap",
        "StorageBootstrapProvider.register_provider",
        params=("name",),
    ),
    Seam(
        "TransferQueue function `extract_field_schema`",
        "transfer_queue.metadata",
        "extract_field_schema",
        params=("data",),
    ),
    *(
        Seam(f"TransferQueue `BatchMeta.{name}`", "transfer_queue.metadata", f"BatchMeta.{name}")
        for name in ("global_indexes", "partition_ids", "field_names", "size")
    ),
    # trainer modes
    Seam("function `register_trainer`", _TRAINER, "register_trainer", params=("name",)),
    Seam("class `PPOTrainerSync`", "verl.trainer.ppo.v1.trainer_sync", "PPOTrainerSync"),
    Seam(
        "`Unknown trainer '...'` error of `get_trainer_cls`",
        _TRAINER,
        "get_trainer_cls",
        source="Unknown trainer '",
    ),
    # trainer methods ConduitTrainer overrides
    method_seam("_init_tokenizer"),
    method_seam("_build_replay_buffer"),
    method_seam("_get_required_batch_multiple", "dp_size"),
    method_seam("_step_once", "metrics", "timing_raw", "sample_batch_size"),
    # trainer methods the streaming step calls per piece / per batch
    method_seam("_balance_batch", "batch", "metrics"),
    method_seam("_compute_reward_colocate", "batch", "metrics"),
    method_seam("_compute_old_log_prob", "batch", "metrics"),
    method_seam("_compute_ref_log_prob", "batch", "metrics"),
    method_seam("_compute_values", "batch", "metrics"),
    method_seam("_compute_advantage", "batch", "metrics"),
    method_seam("_update_critic", "batch", "metrics"),
    method_seam("_update_actor", "batch", "metrics"),
    method_seam("on_sample_begin"),
    method_seam("on_sample_end"),
    method_seam("get_reward_handles"),
    # bounded staleness (``max_staleness >= 1``): verl's colocate_async hooks, reused as they are
    method_seam("get_llm_client"),
    method_seam("on_train_begin"),
    method_seam("on_step_end"),
    method_seam("_add_async_warmup_batches", "num_warmup_batches"),
    Seam(
        "trainer method `_build_replay_buffer` choosing `ReplayBufferAsync` by `trainer_mode`",
        _TRAINER,
        "PPOTrainer._build_replay_buffer",
        source='ReplayBuffer if self.trainer_mode == "sync" else ReplayBufferAsync',
    ),
    Seam(
        "colocate_async method `get_llm_client` (the partial-rollout client)",
        _COLOCATE_ASYNC,
        "PPOTrainerColocateAsync.get_llm_client",
        source="FullyAsyncLLMServerClient",
    ),
    Seam(
        "colocate_async method `on_step_end` (weights pushed, generation resumed)",
        _COLOCATE_ASYNC,
        "PPOTrainerColocateAsync.on_step_end",
        source="resume_generation_replicas(",
    ),
    Seam(
        "colocate_async method `on_sample_end` (in-flight requests aborted for partial rollout)",
        _COLOCATE_ASYNC,
        "PPOTrainerColocateAsync.on_sample_end",
        source="abort_replicas(",
    ),
    # bounded staleness with the rollout on hardware of its own: separate_async's weight push
    attribute_seam("checkpoint_manager"),
    *(
        Seam(
            f"checkpoint manager method `{name}`",
            "verl.checkpoint_engine.base",
            f"CheckpointEngineManager.{name}",
            params=params,
        )
        for name, params in (
            ("abort_replicas", ()),
            ("update_weights", ("global_steps",)),
            ("resume_generation_replicas", ()),
        )
    ),
    # trainer state the streaming step reads (or sets: trainer_mode)
    attribute_seam("trainer_mode"),
    attribute_seam("replay_buffer"),
    attribute_seam("use_critic"),
    attribute_seam("use_reference_policy"),
    attribute_seam("global_steps"),
    attribute_seam("tokenizer"),
    # the module global PieceWrites stands in for, and the stage methods write through it
    Seam("trainer_base module global `tq`", _TRAINER, "tq"),
    Seam(
        "`tq.kv_batch_put` in trainer method `_compute_advantage`",
        _TRAINER,
        "PPOTrainer._compute_advantage",
        source="tq.kv_batch_put(",
    ),
    # the replay buffer: sampling pieces, and its view of finished / failed prompt groups
    method_seam("sample", "global_steps", "partition_id", "batch_size", **_REPLAY),
    method_seam("_sync_metadata_from_transfer_queue", **_REPLAY),
    attribute_seam("finished_keys", "replay buffer", _BUFFER),
    attribute_seam("failure_keys", "replay buffer", _BUFFER),
    attribute_seam("poll_interval", "replay buffer", _BUFFER),
    # bounded staleness: the async buffer's stale-group decision, made by Conduit's rule instead
    Seam("class `ReplayBufferAsync`", _BUFFER, "ReplayBufferAsync"),
    method_seam(
        "_stale_terminal_keys", "global_steps", "partition_id", cls="ReplayBufferAsync", **_ANY_REPLAY
    ),
    Seam(
        "`_stale_terminal_keys` consulted by `ReplayBufferAsync._terminal_eviction_reasons`",
        _BUFFER,
        "ReplayBufferAsync._terminal_eviction_reasons",
        source="self._stale_terminal_keys(global_steps, partition_id)",
    ),
    Seam(
        "replay buffer eviction metric `off_policy/evicted_samples`",
        _BUFFER,
        "ReplayBuffer._evict_terminal_groups",
        source="/off_policy/evicted_samples",
    ),
    attribute_seam("partitions", "replay buffer", _BUFFER),
    attribute_seam("max_off_policy_threshold", "replay buffer", _BUFFER),
    # the agent loop: the worker actor class subclassed to report each finished group
    Seam("agent-loop actor class `AgentLoopWorkerTQ`", _AGENT_LOOP, "AgentLoopWorkerTQ", actor=True),
    method_seam("_run_prompt", "prompt", "sampling_params", "trajectory", "trace", **_AGENT_WORKER),
    Seam("class `AgentLoopManagerTQ`", _AGENT_LOOP, "AgentLoopManagerTQ"),
    attribute_seam("agent_loop_workers_class", "agent-loop manager", _AGENT_LOOP),
    Seam(
        "rollout config key `agent.agent_loop_manager_class`",
        "verl.workers.config.rollout",
        source="agent_loop_manager_class",
    ),
    # PPO's GAE, swapped for one call without its batch whitening
    Seam(
        "function `core_algos.compute_gae_advantage_return`",
        "verl.trainer.ppo.core_algos",
        "compute_gae_advantage_return",
        params=("token_level_rewards", "values", "response_mask", "gamma", "lam"),
    ),
    Seam(
        "call-time lookup of `core_algos.compute_gae_advantage_return` in `compute_advantage`",
        "verl.trainer.ppo.ray_trainer",
        "compute_advantage",
        source="core_algos.compute_gae_advantage_return(",
    ),
    Seam(
        "function `masked_whiten`", "verl.utils.torch_functional", "masked_whiten", params=("values", "mask")
    ),
    Seam(
        "function `response_to_nested`",
        "verl.workers.utils.padding",
        "response_to_nested",
        params=("tensor", "response_mask"),
    ),
    Seam("function `marked_timer`", "verl.utils.debug", "marked_timer", params=("name", "timing_raw")),
)


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def seam_problem(seam: Seam) -> str | None:
    """What is wrong with ``seam`` in the installed packages (None: it is there as expected)."""
    try:
        obj: Any = importlib.import_module(seam.module)
    except ImportError as e:
        return f"{seam.what}: module `{seam.module}` cannot be imported ({e})"
    for part in seam.path.split(".") if seam.path else ():
        if not hasattr(obj, part):
            return f"{seam.what} not found (`{seam.module}.{seam.path}`)"
        obj = getattr(obj, part)
    if seam.actor and not hasattr(obj, "__ray_actor_class__"):
        return f"{seam.what} is no longer a Ray actor class"
    if seam.params:
        if not callable(obj):
            return f"{seam.what} is not callable"
        try:
            names = [p for p in inspect.signature(obj).parameters if p != "self"]
        except (TypeError, ValueError):
            names = None
        if names is not None:
            found = [n for n in names if n in seam.params]
            if found != list(seam.params):
                return (
                    f"{seam.what} takes ({', '.join(names)}), conduit_verl calls it with "
                    f"({', '.join(seam.params)})"
                )
    if seam.assigns is not None:
        if not re.search(rf"self\.{re.escape(seam.assigns)}\s*(:[^=\n]*)?=(?!=)", _source(obj)):
            return f"{seam.what} not found (nothing in `{seam.module}` sets `self.{seam.assigns}`)"
    if seam.source is not None and seam.source not in _source(obj):
        return f"{seam.what} not found (`{seam.module}.{seam.path or '*'}` no longer has `{seam.source}`)"
    return None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def supported() -> str:
    return f"verl {', '.join(TESTED_VERL)} with TransferQueue {', '.join(TESTED_TRANSFER_QUEUE)}"


def check_seams(
    seams: Sequence[Seam] = SEAMS, verl_version: str | None = None, tq_version: str | None = None
) -> None:
    """Raise :class:`VerlCompatError` naming every missing seam and the installed versions; log a
    warning (only) when every seam is there but the versions are not the tested ones."""
    verl_version = verl_version or _version("verl")
    tq_version = tq_version or _version("TransferQueue")
    problems = [p for p in map(seam_problem, seams) if p is not None]
    if problems:
        raise VerlCompatError(
            f"verl {verl_version}: {'; '.join(problems)}; conduit_verl supports {supported()} "
            f"(installed: TransferQueue {tq_version})"
        )
    if verl_version not in TESTED_VERL or tq_version not in TESTED_TRANSFER_QUEUE:
        logger.warning(
            "conduit_verl was tested with %s; installed: verl %s, TransferQueue %s. Every seam it "
            "needs is present, so it runs, but compare results with verl's sync trainer.",
            supported(),
            verl_version,
            tq_version,
        )


#: Run once this module is imported. Importing it imports verl's V1 trainer package, whose import
#: hook (``plugin.py``) registers the ``conduit`` trainer, which needs this module: when this module
#: is what first imports verl's trainer, the plugin defers that registration to here.
READY = False
_when_ready: list[Callable[[], None]] = []


def after_import(callback: Callable[[], None]) -> None:
    """Call ``callback`` once this module has finished importing."""
    if READY:
        callback()
    else:
        _when_ready.append(callback)


check_seams()

# ---------------------------------------------------------------------------------------------
# The names the rest of conduit_verl uses (the seams above, and verl's public API it calls).

import transfer_queue as tq  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.v1 import agent_loop_tq as _agent_loop_tq  # noqa: E402
from verl.trainer.ppo.v1 import trainer_base as _trainer_base  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync as _ReplayBufferAsync  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import register_trainer  # noqa: E402
from verl.trainer.ppo.v1.trainer_colocate_async import (  # noqa: E402
    PPOTrainerColocateAsync as _ColocateAsync,
)
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils.debug import marked_timer  # noqa: E402
from verl.utils.torch_functional import masked_whiten  # noqa: E402
from verl.workers.utils.padding import response_to_nested  # noqa: E402

__all__ = [
    "SEAMS",
    "AgentLoopManagerTQ",
    "KVBatchMeta",
    "NotifyingAgentLoopWorker",
    "Seam",
    "SyncTrainerBase",
    "VerlCompatError",
    "attribute_seam",
    "check_seams",
    "marked_timer",
    "masked_whiten",
    "method_seam",
    "register_trainer",
    "response_to_nested",
    "tq",
]

AgentLoopManagerTQ = _agent_loop_tq.AgentLoopManagerTQ


class SyncTrainerBase(PPOTrainerSync):
    """verl's sync trainer, with the private hooks ConduitTrainer overrides under public names.

    ``conduit_*`` methods default to verl's behaviour. The trainer reports itself as
    :meth:`conduit_trainer_mode` (``sync`` unless overridden) to verl's branches on ``trainer_mode``
    (replay buffer class, dataloader chunks, refill, checkpoints): it keeps that mode's semantics
    under another mode name.
    """

    def conduit_trainer_mode(self) -> str:
        """The mode verl's own branches on ``trainer_mode`` see: ``sync``, or ``ASYNC_TRAINER_MODE``."""
        return "sync"

    def _init_tokenizer(self) -> None:
        super()._init_tokenizer()
        self.conduit_tokenizer_ready(self.tokenizer)

    def conduit_tokenizer_ready(self, tokenizer: Any) -> None:
        """Runs first in ``init()``, once the tokenizer is loaded (before any worker starts)."""

    def _build_replay_buffer(self) -> Any:
        self.trainer_mode = self.conduit_trainer_mode()
        buffer = super()._build_replay_buffer()
        self.conduit_replay_buffer_ready(buffer)
        return buffer

    def conduit_replay_buffer_ready(self, buffer: Any) -> None:
        """Runs inside verl's ``__init__`` once the replay buffer exists."""

    def _get_required_batch_multiple(self, dp_size: int) -> int:
        return self.conduit_batch_multiple(dp_size)

    def conduit_batch_multiple(self, dp_size: int) -> int:
        """What ``_balance_batch`` pads a batch to a multiple of (verl's: lcm with a mini-batch)."""
        return int(super()._get_required_batch_multiple(dp_size))

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
        return self.conduit_step(metrics, timing_raw, sample_batch_size)

    def conduit_step(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
        """One step: sample ``sample_batch_size`` groups, ingest, update (verl's sync step)."""
        return super()._step_once(metrics, timing_raw, sample_batch_size)


# -- trainer methods and state (``trainer`` is a SyncTrainerBase) ------------------------------


Stage = Callable[[Any, KVBatchMeta, dict], KVBatchMeta]


def _trainer_stage(method: str) -> Stage:
    """``stage(trainer, batch, metrics)`` calling verl's private trainer ``method`` (a seam in SEAMS)."""

    def stage(trainer: Any, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        return getattr(trainer, method)(batch, metrics=metrics)  # type: ignore[no-any-return]

    stage.__name__ = method.lstrip("_")
    return stage


balance_batch = _trainer_stage("_balance_batch")
compute_reward_colocate = _trainer_stage("_compute_reward_colocate")
compute_old_log_prob = _trainer_stage("_compute_old_log_prob")
compute_ref_log_prob = _trainer_stage("_compute_ref_log_prob")
compute_values = _trainer_stage("_compute_values")
compute_advantage = _trainer_stage("_compute_advantage")
update_critic = _trainer_stage("_update_critic")
update_actor = _trainer_stage("_update_actor")


def on_sample_begin(trainer: Any) -> None:
    trainer.on_sample_begin()


def on_sample_end(trainer: Any) -> None:
    trainer.on_sample_end()


def colocated_reward(trainer: Any) -> bool:
    """The reward is computed by the trainer (no reward-loop workers): verl's optional stage."""
    return trainer.get_reward_handles() is None


def uses_reference_policy(trainer: Any) -> bool:
    return bool(trainer.use_reference_policy)


def uses_critic(trainer: Any) -> bool:
    return bool(trainer.use_critic)


def global_step(trainer: Any) -> int:
    return int(trainer.global_steps)


def replay_buffer(trainer: Any) -> Any:
    return trainer.replay_buffer


# -- the replay buffer --------------------------------------------------------------------------


def sample_groups(buffer: Any, global_steps: int, partition_id: str, groups: int) -> tuple[KVBatchMeta, dict]:
    """``groups`` finished prompt groups (waits for them) and the off-policy metrics."""
    return buffer.sample(global_steps=global_steps, partition_id=partition_id, batch_size=groups)


def finished_groups(buffer: Any, partition_id: str) -> int:
    """Re-read TransferQueue's metadata; the number of finished prompt groups of the partition."""
    buffer._sync_metadata_from_transfer_queue()
    return len(buffer.finished_keys.get(partition_id, ()))


def unfinished_groups(buffer: Any, partition_id: str) -> list[str]:
    """The prompt groups the last re-read found pending or running (for a wait's log and errors)."""
    keys = [
        *getattr(buffer, "pending_keys", {}).get(partition_id, ()),
        *getattr(buffer, "running_keys", {}).get(partition_id, ()),
    ]
    return sorted(str(k) for k in keys)


def any_failed_group(buffer: Any, partition_id: str) -> bool:
    """Whether the last re-read found a failed prompt group (verl's sampler refills those)."""
    return bool(buffer.failure_keys.get(partition_id))


def set_poll_interval(buffer: Any, seconds: float) -> float | None:
    """Set how often the replay buffer re-reads TransferQueue; the previous period (None: it has none)."""
    if not hasattr(buffer, "poll_interval"):
        return None
    old = buffer.poll_interval
    buffer.poll_interval = seconds
    return old


@contextlib.contextmanager
def poll_interval(buffer: Any, seconds: float) -> Iterator[None]:
    """Within the block the replay buffer re-reads TransferQueue every ``seconds``."""
    old = set_poll_interval(buffer, seconds)
    try:
        yield
    finally:
        if old is not None:
            buffer.poll_interval = old


def evicted_groups(metrics: dict) -> tuple[int, int]:
    """From a replay-buffer sample's metrics: (groups evicted as stale, groups evicted in all: stale,
    DAPO-filtered or failed). Evicted groups had finished (a completion channel counted them) but
    were never sampled."""
    counts = {
        reason: int(metrics.get(f"training/{reason}/evicted_samples", 0) or 0)
        for reason in ("off_policy", "filter_groups", "rollout_failure")
    }
    return counts["off_policy"], sum(counts.values())


# -- bounded staleness (``max_staleness >= 1``): verl's colocate_async machinery -------------------

#: the mode verl's own branches see when the conduit mode runs ahead (replay buffer, exact refill)
ASYNC_TRAINER_MODE = "colocate_async"

#: ``decide(groups, global_steps) -> uids to evict``; ``groups``: uid -> {sample key: tag} of every
#: finished prompt group of the partition
StaleDecision = Callable[[dict[str, dict[str, dict]], int], set[str]]


class GatedReplayBuffer(_ReplayBufferAsync):  # type: ignore[misc]
    """verl's async replay buffer whose stale-group decision is Conduit's (``conduit_decide``):
    verl still evicts those groups, refills them with fresh prompts and reports the eviction."""

    conduit_decide: StaleDecision | None = None

    def _stale_terminal_keys(self, global_steps: int, partition_id: str) -> set[str]:
        if self.conduit_decide is None:
            return set(super()._stale_terminal_keys(global_steps, partition_id))
        if partition_id == "val":
            return set()
        finished = set(self.finished_keys[partition_id])
        groups: dict[str, dict[str, dict]] = {uid: {} for uid in finished}
        for key, tag in self.partitions[partition_id].items():
            uid = key.split("_")[0]
            if uid in groups:
                groups[uid][key] = tag
        return set(self.conduit_decide(groups, global_steps)) & finished


def gate_replay_buffer(buffer: Any, decide: StaleDecision) -> int | None:
    """Make ``decide`` the only staleness rule of verl's async replay buffer ``buffer`` (verl's own
    ``max_off_policy_threshold`` is switched off); returns the threshold it had."""
    from conduit.errors import ConfigError

    if type(buffer) is not _ReplayBufferAsync:
        raise ConfigError(
            f"trainer.v1.conduit.max_staleness needs verl's built-in async replay buffer, got "
            f"{type(buffer).__name__}; unset trainer.v1.sampler.custom_sampler or set max_staleness=0"
        )
    buffer.__class__ = GatedReplayBuffer  # the same object: only the stale-group decision differs
    buffer.conduit_decide = decide
    threshold = buffer.max_off_policy_threshold
    buffer.max_off_policy_threshold = None
    return None if threshold is None else int(threshold)


def partial_rollout_client(trainer: Any) -> Any:
    """verl's colocate_async LLM client (``FullyAsyncLLMServerClient``): an aborted request resumes
    on the new weights, its samples tagged with every version that generated them."""
    return _ColocateAsync.get_llm_client(trainer)


def add_warmup_batches(trainer: Any, batches: int) -> None:
    """Submit ``batches`` train batches ahead of the first step (verl's async prefetch window)."""
    trainer._add_async_warmup_batches(batches)


def async_sample_end(trainer: Any) -> None:
    """colocate_async's end of sampling: abort in-flight requests (kept for partial rollout), sleep
    the replicas."""
    _ColocateAsync.on_sample_end(trainer)


def async_step_end(trainer: Any) -> None:
    """colocate_async's end of step: push the new weights (``timing_s/update_weights``), resume
    generation."""
    _ColocateAsync.on_step_end(trainer)


def separate_sample_end(trainer: Any) -> None:
    """End of sampling with the rollout on hardware of its own (separate_async's schedule): nothing
    is aborted or put to sleep, generation carries on while the trainer ingests and updates."""
    if getattr(trainer, "curr_step_profile", False):
        trainer._stop_rollout_profiling()


def separate_step_end(trainer: Any) -> None:
    """End of step with the rollout on hardware of its own: what verl's ``CheckpointEngineManager``
    does for separate_async's standalone rollout (in-flight requests aborted and kept for partial
    rollout, the new weights pushed, generation resumed at once; ``timing_s/update_weights``), so
    generation pauses only for the push. A resumed request's samples carry every version that
    generated them (``min_global_steps``/``max_global_steps``), which the staleness bound reads."""
    manager = trainer.checkpoint_manager
    with marked_timer("update_weights", trainer.timing_raw):
        manager.abort_replicas()
        manager.update_weights(trainer.global_steps)
        manager.resume_generation_replicas()


# -- one TransferQueue put per piece: the ``tq`` module verl's stage methods write through ------


@contextlib.contextmanager
def trainer_tq(stand_in: Any) -> Iterator[None]:
    """Within the block verl's trainer module calls ``stand_in`` where it calls ``transfer_queue``.
    Driver process, one thread."""
    real = _trainer_base.tq
    _trainer_base.tq = stand_in
    try:
        yield
    finally:
        _trainer_base.tq = real


# -- PPO's GAE ----------------------------------------------------------------------------------


@contextlib.contextmanager
def gae_function(fn: Callable[..., Any]) -> Iterator[None]:
    """Within the block verl's ``compute_advantage`` runs ``fn`` as its GAE
    (``core_algos.compute_gae_advantage_return``). Driver process, one thread."""
    from verl.trainer.ppo import core_algos

    original = core_algos.compute_gae_advantage_return
    core_algos.compute_gae_advantage_return = fn
    try:
        yield
    finally:
        core_algos.compute_gae_advantage_return = original


# -- the agent loop -----------------------------------------------------------------------------


class NotifyingAgentLoopWorker(_agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """verl's TransferQueue agent-loop worker (the Python class, before ``ray.remote``) that calls
    ``conduit_group_done(partition_id)`` once each prompt group's TQ tag (finished or failure) is
    written."""

    async def _run_prompt(
        self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False
    ) -> None:
        partition_id = "train" if not trajectory["validate"] else "val"
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
        finally:
            await self.conduit_group_done(partition_id)

    async def conduit_group_done(self, partition_id: str) -> None:
        """One group of ``partition_id`` reached a terminal status."""


def set_agent_loop_workers(manager: Any, worker_class: Any) -> None:
    """Make an ``AgentLoopManagerTQ`` start ``worker_class`` (a Ray actor class) as its workers."""
    manager.agent_loop_workers_class = worker_class


READY = True
for _callback in _when_ready:
    _callback()
_when_ready.clear()
