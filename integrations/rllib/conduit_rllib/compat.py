"""Every place conduit_rllib touches RLlib, in one file: a new RLlib release breaks here or nowhere.

The plugin's other modules import RLlib only through this module. It holds

- every RLlib name the plugin imports (classes, functions, metric keys), each a seam;
- every touch of something RLlib does not document: private attributes (``LearnerGroup._learner``),
  private keyword arguments (``synchronous_parallel_sample(_uses_new_env_runners=...)``), the private
  ``Learner`` method the PPO learner mixin overrides, episode storage read without RLlib's getters,
  ``SampleBatch`` objects built without their constructor, learner-result ``Stats`` objects;
- the facts the plugin's outputs rely on (train-batch column names, an extra attribute on the config).

At import every seam is checked against the installed RLlib (``verify``): a missing one raises
``RLlibVersionError`` naming it and the ray version; an optional one (with a fallback) logs a
warning; a ray version other than ``TESTED_RAY`` with every seam present logs a warning.
``tests/integrations/rllib/test_rllib_compat.py`` checks each seam on its own.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from conduit_rllib.errors import RLlibVersionError

TESTED_RAY = "2.60.0"
RAY_VERSION: str = ray.__version__
CONFIG_ATTR = "conduit"  # the AlgorithmConfig attribute holding the plugin's settings

log = logging.getLogger(__name__)


def version_error(problems: Iterable[str], version: str = RAY_VERSION) -> RLlibVersionError:
    """``ray 2.61.0: <problem>; <problem>; conduit_rllib supports ray[rllib] 2.60.0``."""
    return RLlibVersionError(
        f"ray {version}: {'; '.join(problems)}; conduit_rllib supports ray[rllib] {TESTED_RAY}"
    )


@dataclass(frozen=True)
class Seam:
    """One thing conduit_rllib relies on in RLlib.

    ``check()`` returns ``None`` when it is there, else what is missing (e.g. "LearnerGroup attribute
    `_learner` not found"). A seam with a ``fallback`` is optional: without it the plugin still works
    (the fallback says how) and only a warning is logged.
    """

    name: str
    used_by: str
    check: Callable[[], str | None]
    fallback: str | None = None


SEAMS: list[Seam] = []

# -- RLlib names -----------------------------------------------------------------------------------


def _name_check(module: str, name: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            return f"module `{module}` not found (for `{name}`)"
        return None if hasattr(mod, name) else f"`{module}.{name}` not found"

    return check


def _import(module: str, names: str, used_by: str) -> Any:
    """The RLlib objects ``names`` (space-separated) of ``module``, each registered as a seam.

    A missing one is ``None`` here and makes ``verify`` raise before any other module can use it.
    """
    out = []
    for name in names.split():
        SEAMS.append(Seam(f"{module}.{name}", used_by, _name_check(module, name)))
        try:
            out.append(getattr(importlib.import_module(module), name, None))
        except ImportError:
            out.append(None)
    return out[0] if len(out) == 1 else tuple(out)


_DQN, _PPO, _METRICS = (
    "ray.rllib.algorithms.dqn.dqn",
    "ray.rllib.algorithms.ppo.ppo",
    "ray.rllib.utils.metrics",
)
DQN, DQNConfig = _import(_DQN, "DQN DQNConfig", "dqn.py, validate.py")
calculate_rr_weights = _import(_DQN, "calculate_rr_weights", "dqn.py (a helper of RLlib's DQN module)")
PPO, PPOConfig = _import(_PPO, "PPO PPOConfig", "ppo.py, validate.py")
PPOTorchLearner = _import("ray.rllib.algorithms.ppo.torch.ppo_torch_learner", "PPOTorchLearner", "learner.py")
DQNTorchLearner = _import("ray.rllib.algorithms.dqn.torch.dqn_torch_learner", "DQNTorchLearner", "compat.py")
Algorithm = _import("ray.rllib.algorithms.algorithm", "Algorithm", "common.py")
AlgorithmConfig = _import(
    "ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "enable.py, settings.py"
)
ALL_MODULES = _import("ray.rllib.core", "ALL_MODULES", "dqn.py, ppo.py")
Columns = _import("ray.rllib.core.columns", "Columns", "fragments.py, ppo.py")
Learner = _import("ray.rllib.core.learner.learner", "Learner", "learner.py")
LearnerGroup = _import("ray.rllib.core.learner.learner_group", "LearnerGroup", "common.py, ppo.py")
TrainingData = _import("ray.rllib.core.learner.training_data", "TrainingData", "learner.py")
SingleAgentEpisode = _import("ray.rllib.env.single_agent_episode", "SingleAgentEpisode", "fragments.py")
MultiAgentEpisode = _import("ray.rllib.env.multi_agent_episode", "MultiAgentEpisode", "fragments.py")
Postprocessing = _import(
    "ray.rllib.evaluation.postprocessing", "Postprocessing", "onpolicy.py (column names)"
)
synchronous_parallel_sample = _import(
    "ray.rllib.execution.rollout_ops", "synchronous_parallel_sample", "dqn.py, ppo.py"
)
SampleBatch, MultiAgentBatch = _import(
    "ray.rllib.policy.sample_batch", "SampleBatch MultiAgentBatch", "train_batch.py, learner.py"
)
CallResult = _import("ray.rllib.utils.actor_manager", "CallResult", "ppo.py (remote value function)")
StatsBase = _import("ray.rllib.utils.metrics.stats", "StatsBase", "dqn.py (TD errors in learner results)")
convert_to_numpy = _import("ray.rllib.utils.numpy", "convert_to_numpy", "dqn.py")
(
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    REPLAY_BUFFER_SAMPLE_TIMER,
    REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TD_ERROR_KEY,
    TIMERS,
) = _import(
    _METRICS,
    "ENV_RUNNER_RESULTS ENV_RUNNER_SAMPLING_TIMER LEARNER_RESULTS LEARNER_UPDATE_TIMER "
    "NUM_AGENT_STEPS_SAMPLED_LIFETIME NUM_ENV_STEPS_SAMPLED_LIFETIME NUM_MODULE_STEPS_TRAINED_LIFETIME "
    "REPLAY_BUFFER_ADD_DATA_TIMER REPLAY_BUFFER_SAMPLE_TIMER REPLAY_BUFFER_UPDATE_PRIOS_TIMER "
    "SYNCH_WORKER_WEIGHTS_TIMER TD_ERROR_KEY TIMERS",
    "dqn.py, ppo.py (metric keys)",
)


def _seam(name: str, used_by: str, fallback: str | None = None) -> Callable[[Callable[[], str | None]], Any]:
    def register(check: Callable[[], str | None]) -> Callable[[], str | None]:
        SEAMS.append(Seam(name, used_by, check, fallback))
        return check

    return register


def _assigns(func: Any, attr: str) -> bool:
    """Whether ``func``'s own bytecode names ``attr`` (an attribute it sets or reads)."""
    return attr in getattr(getattr(func, "__code__", None), "co_names", ())


def _missing_params(func: Any, names: Iterable[str]) -> list[str]:
    params = inspect.signature(func).parameters
    return [n for n in names if n not in params]


def _missing_property(cls: Any, name: str) -> str | None:
    """``None`` when ``cls`` has the property ``name``, else what is missing."""
    if isinstance(inspect.getattr_static(cls, name, None), property):
        return None
    return f"{cls.__name__} property `{name}` not found"


def _missing_method(cls: Any, name: str) -> str | None:
    """``None`` when ``cls`` has the method ``name``, else what is missing."""
    return None if callable(getattr(cls, name, None)) else f"{cls.__name__} method `{name}` not found"


def _read(obj: Any, attr: str, missing: str) -> Any:
    """``obj.attr``; without it, the version error that says ``missing``."""
    try:
        return getattr(obj, attr)
    except AttributeError:
        raise version_error([missing]) from None


# -- the learner group and the learner -------------------------------------------------------------


@_seam("LearnerGroup._learner", "common.py, ppo.py: the local learner (its device, its module's values)")
def _check_local_learner() -> str | None:
    if not _assigns(LearnerGroup.__init__, "_learner"):
        return "LearnerGroup attribute `_learner` not found"
    return _missing_property(LearnerGroup, "is_local")


def local_learner(learner_group: Any) -> Any:
    """The in-process ``Learner`` of a local ``LearnerGroup`` (``None`` when its learners are remote)."""
    return _read(learner_group, "_learner", "LearnerGroup attribute `_learner` not found")


@_seam("Learner.device", "common.py, learner.py, ppo.py: where the learner's tensors live")
def _check_learner_device() -> str | None:
    return _missing_property(Learner, "device")


def learner_device(learner: Any) -> Any:
    """The device of ``learner``'s module (a ``torch.device`` once the learner is built)."""
    return _read(learner, "device", "Learner property `device` not found")


@_seam("LearnerGroup.update", "dqn.py, ppo.py, train_batch.py: the keyword arguments passed")
def _check_learner_group_update() -> str | None:
    missing = _missing_params(LearnerGroup.update, ("batch", "batch_refs", "timesteps"))
    # num_epochs, minibatch_size and shuffle_batch_per_epoch pass through to each Learner.update
    missing += _missing_params(Learner.update, ("num_epochs", "minibatch_size", "shuffle_batch_per_epoch"))
    return f"LearnerGroup.update/Learner.update argument(s) {missing} not found" if missing else None


@_seam(
    "Learner._create_iterator_if_necessary",
    "learner.py: ConduitLearnerMixin hands Learner.update its prepared minibatches",
)
def _check_iterator_hook() -> str | None:
    hook = getattr(Learner, "_create_iterator_if_necessary", None)
    if hook is None or not _assigns(Learner.update, "_create_iterator_if_necessary"):
        return "Learner method `_create_iterator_if_necessary` (called by Learner.update) not found"
    if _missing_params(hook, ["training_data"]):
        return "Learner._create_iterator_if_necessary argument `training_data` not found"
    fields = getattr(TrainingData, "__dataclass_fields__", {})
    if not {"batch", "episodes"} <= set(fields):
        return "TrainingData fields `batch`, `episodes` not found"
    return _missing_method(Learner, "should_module_be_updated")


class LearnerIteratorHook:
    """Put before an RLlib ``Learner`` class: ``Learner.update`` first asks ``conduit_minibatches``.

    RLlib's ``Learner.update`` gets its minibatch iterator from the private
    ``_create_iterator_if_necessary(training_data=..., **kwargs)``; this is the only override of it.
    ``conduit_minibatches(batch)`` returns an iterable of ``MultiAgentBatch`` minibatches, or ``None``
    to leave the batch to RLlib. Batches built from episodes (the learner connector) always go to RLlib.
    """

    def conduit_minibatches(self, batch: Any) -> Iterable[Any] | None:
        return None

    def _create_iterator_if_necessary(self, *, training_data: Any, **kwargs: Any) -> Any:
        if training_data.episodes is None:
            it = self.conduit_minibatches(training_data.batch)
            if it is not None:
                return it
        return super()._create_iterator_if_necessary(training_data=training_data, **kwargs)  # type: ignore[misc]


# -- sampling and learner results -------------------------------------------------------------------


@_seam("synchronous_parallel_sample(_uses_new_env_runners, _return_metrics)", "dqn.py, ppo.py")
def _check_sample() -> str | None:
    keys = ("worker_set", "max_env_steps", "max_agent_steps", "concat", "sample_timeout_s")
    missing = _missing_params(
        synchronous_parallel_sample, (*keys, "_uses_new_env_runners", "_return_metrics")
    )
    return f"synchronous_parallel_sample argument(s) {missing} not found" if missing else None


def sample_episodes(
    env_runner_group: Any, *, sample_timeout_s: float | None, **limit: int | None
) -> tuple[list[Any], list[Any]]:
    """``(episodes, env-runner metrics)`` from one synchronous sampling round, as RLlib's DQN and PPO do;
    ``limit``: ``max_env_steps`` or ``max_agent_steps`` (none: one round of every env runner)."""
    return synchronous_parallel_sample(  # type: ignore[no-any-return]
        worker_set=env_runner_group,
        sample_timeout_s=sample_timeout_s,
        _uses_new_env_runners=True,
        _return_metrics=True,
        **limit,
    )


@_seam("learner results: TD errors as Stats", "dqn.py: priorities from the learner's TD errors")
def _check_td_errors() -> str | None:
    if missing := _missing_method(StatsBase, "peek"):
        return missing
    if not _assigns(DQNTorchLearner.compute_loss_for_module, "TD_ERROR_KEY"):
        return "DQNTorchLearner.compute_loss_for_module does not log `TD_ERROR_KEY`"
    return None


def pop_td_errors(learner_results: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Remove the TD errors from ``learner_results``: per module, concatenated over learners in order."""
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    for res in learner_results:
        for mid, module_results in res.items():
            if TD_ERROR_KEY in module_results:
                parts[mid].append(np.asarray(convert_to_numpy(module_results.pop(TD_ERROR_KEY).peek())))
    return {mid: np.concatenate([p.reshape(-1) for p in ps]) for mid, ps in parts.items()}


@_seam("CallResult.get", "ppo.py: a remote learner's value estimates")
def _check_call_result() -> str | None:
    return _missing_method(CallResult, "get")


def call_first_learner(learner_group: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn(learner)`` on the group's first learner (local or remote), returned as a value."""
    first = next(iter(learner_group.foreach_learner(fn)))
    return first.get() if isinstance(first, CallResult) else first


# -- algorithm and config ---------------------------------------------------------------------------


@_seam("Algorithm.spaces", "common.py: the modules' observation and action spaces, checked at setup")
def _check_spaces() -> str | None:
    return None if _assigns(Algorithm.setup, "spaces") else "Algorithm attribute `spaces` not found"


def module_spaces(algo: Any) -> dict[str, tuple[Any, Any]]:
    """``{module_id: (observation space, action space)}``, without RLlib's ``__env…`` entries."""
    spaces = _read(algo, "spaces", "Algorithm attribute `spaces` not found")
    return {mid: s for mid, s in (spaces or {}).items() if not str(mid).startswith("__env")}


@_seam("Algorithm.get_state(components, not_components)", "common.py: Conduit's state in checkpoints")
def _check_state() -> str | None:
    missing = _missing_params(Algorithm.get_state, ["components", "not_components"])
    for method in ("set_state", "step", "cleanup", "setup", "training_step"):
        if not callable(getattr(Algorithm, method, None)):
            missing.append(method)
    return f"Algorithm argument(s)/method(s) {missing} not found" if missing else None


@_seam(f"AlgorithmConfig.{CONFIG_ATTR}", "enable.py, settings.py: the plugin's settings ride on the config")
def _check_config_attr() -> str | None:
    config = AlgorithmConfig()
    setattr(config, CONFIG_ATTR, {"probe": 1})
    copied = copy.deepcopy(config.copy(copy_frozen=False))  # how Ray's copies of a config see it
    if getattr(copied, CONFIG_ATTR, None) != {"probe": 1}:
        return f"AlgorithmConfig.copy() drops the extra attribute `{CONFIG_ATTR}`"
    return None


def store_settings(config: Any, settings: dict[str, Any]) -> None:
    setattr(config, CONFIG_ATTR, settings)


def stored_settings(config: Any) -> dict[str, Any]:
    return dict(getattr(config, CONFIG_ATTR, None) or {})


# -- batches ----------------------------------------------------------------------------------------

# Column names the plugin writes (replay.py, onpolicy.py, gae.py, nstep.py) → RLlib's constants.
_COLUMNS = {
    "obs": "Columns.OBS",
    "new_obs": "Columns.NEXT_OBS",
    "actions": "Columns.ACTIONS",
    "rewards": "Columns.REWARDS",
    "terminateds": "Columns.TERMINATEDS",
    "action_logp": "Columns.ACTION_LOGP",
    "action_dist_inputs": "Columns.ACTION_DIST_INPUTS",
    "advantages": "Postprocessing.ADVANTAGES",
    "value_targets": "Postprocessing.VALUE_TARGETS",
}


@_seam("train-batch column names", "replay.py, onpolicy.py: the columns RLlib's DQN and PPO losses read")
def _check_columns() -> str | None:
    owners = {"Columns": Columns, "Postprocessing": Postprocessing}
    wrong = []
    for name, const in _COLUMNS.items():
        owner, attr = const.split(".")
        if getattr(owners[owner], attr, None) != name:
            wrong.append(f"{const} != {name!r}")
    consts = DQNTorchLearner.compute_loss_for_module.__code__.co_consts
    wrong += [f"DQN loss column {k!r}" for k in ("n_step", "weights") if k not in consts]
    return f"train-batch column(s) renamed: {', '.join(wrong)}" if wrong else None


@_seam("MultiAgentBatch(policy_batches, env_steps)", "train_batch.py, learner.py")
def _check_multi_agent_batch() -> str | None:
    missing = _missing_params(MultiAgentBatch.__init__, ["policy_batches", "env_steps"])
    if missing:
        return f"MultiAgentBatch argument(s) {missing} not found"
    if not _assigns(MultiAgentBatch.__init__, "policy_batches"):
        return "MultiAgentBatch attribute `policy_batches` not found"
    return None


_SAMPLE_BATCH_DEFAULTS = {
    "time_major": None,
    "max_seq_len": None,
    "zero_padded": False,
    "_is_training": False,
    "num_grad_updates": None,
    "_slice_seq_lens_in_B": False,
    "get_interceptor": None,
}
_SAMPLE_BATCH_MUTABLE = ("accessed_keys", "added_keys", "deleted_keys", "intercepted_values", "_slice_map")


@_seam(
    "SampleBatch attributes",
    "train_batch.py, learner.py: SampleBatch objects of tensors built without SampleBatch.__init__",
    fallback="every SampleBatch is built by SampleBatch.__init__ (slower)",
)
def _check_sample_batch_attrs() -> str | None:
    import torch

    attrs = vars(SampleBatch({"x": torch.zeros(2)}))
    expected = {**_SAMPLE_BATCH_DEFAULTS, "count": 2}
    if set(attrs) != set(expected) | set(_SAMPLE_BATCH_MUTABLE) or any(
        attrs[k] != v for k, v in expected.items()
    ):
        return "SampleBatch.__init__ sets other attributes than the ones conduit_rllib sets"
    return None


_FAST_SAMPLE_BATCH = False  # set by verify()


def tensor_sample_batch(cols: dict[str, Any], count: int) -> Any:
    """A ``SampleBatch`` of ``count`` rows of fixed-shape tensors, without a copy.

    Such columns need none of ``SampleBatch.__init__``'s conversions, so the batch gets the attributes
    that constructor would set (checked against it at import; else the constructor runs).
    """
    if not _FAST_SAMPLE_BATCH or "seq_lens" in cols:
        return SampleBatch(cols)
    sb = dict.__new__(SampleBatch)
    dict.update(sb, cols)
    d = sb.__dict__
    d.update(_SAMPLE_BATCH_DEFAULTS)
    d["count"] = count
    d["accessed_keys"], d["added_keys"], d["deleted_keys"] = set(), set(), set()
    d["intercepted_values"], d["_slice_map"] = {}, []
    return sb


# -- episodes ---------------------------------------------------------------------------------------


def _probe_episode() -> Any:
    ep = SingleAgentEpisode(
        observations=[[0.0], [1.0], [2.0], [3.0]],
        actions=[0, 1, 0],
        rewards=[1.0, 2.0, 3.0],
        extra_model_outputs={"action_logp": [0.1, 0.2, 0.3]},
        len_lookback_buffer=1,
        terminated=True,
    )
    return ep.to_numpy()


@_seam("episode API", "fragments.py: episode chunks from env runners, grouped by module and read")
def _check_episode_api() -> str | None:
    ep = _probe_episode()
    missing = [
        a
        for a in ("id_", "module_id", "is_done", "is_terminated", "extra_model_outputs", "get_observations")
        + ("get_actions", "get_rewards", "get_extra_model_outputs")
        if not hasattr(ep, a)
    ]
    if missing:
        return f"SingleAgentEpisode attribute(s) {missing} not found"
    if len(ep) != 2 or not (ep.is_done and ep.is_terminated):
        return "SingleAgentEpisode length/flags differ from conduit_rllib's reading"
    if not _assigns(MultiAgentEpisode.__init__, "agent_episodes"):
        return "MultiAgentEpisode attribute `agent_episodes` not found"
    return None


@_seam(
    "episode storage (InfiniteLookbackBuffer.data, .lookback)",
    "fragments.py: a finalized chunk's arrays read without RLlib's getters",
    fallback="chunks are read with get_observations/get_actions/get_rewards (slower)",
)
def _check_episode_storage() -> str | None:
    ep = _probe_episode()
    fast = _fast_chunk_arrays(ep)
    slow = _getter_chunk_arrays(ep)
    if fast is None or any(not np.array_equal(f, s) for f, s in zip(fast, slow, strict=True)):
        return "SingleAgentEpisode buffers' `data`/`lookback` do not give what the getters give"
    return None


_FAST_CHUNKS = False  # set by verify()


def _fast_chunk_arrays(ep: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    o, a, r = ep.observations, ep.actions, ep.rewards
    od, ad, rd = o.data, a.data, r.data
    if type(od) is np.ndarray and type(ad) is np.ndarray and type(rd) is np.ndarray:
        return od[o.lookback :], ad[a.lookback :], rd[r.lookback :]
    return None


def _getter_chunk_arrays(ep: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.asarray(ep.get_observations()), np.asarray(ep.get_actions()), np.asarray(ep.get_rewards())


def chunk_arrays(ep: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(observations, actions, rewards)`` of a finalized episode chunk (``len + 1`` observations).

    Read straight from the chunk's numpy storage past its lookback (checked against the getters at
    import); the getters for chunks RLlib did not convert to numpy.
    """
    if _FAST_CHUNKS:
        out = _fast_chunk_arrays(ep)
        if out is not None:
            return out
    return _getter_chunk_arrays(ep)


# -- frame stacking ---------------------------------------------------------------------------------

FrameStacking = _import(
    "ray.rllib.connectors.common.frame_stacking", "FrameStacking", "dqn.py: frame stacks built at delivery"
)
INPUT_ENV_SINGLE_SPACES = _import("ray.rllib.env", "INPUT_ENV_SINGLE_SPACES", "dqn.py: the env's frame space")


@_seam(
    "learner connector pieces (build_learner_connector, FrameStacking.num_frames)",
    "dqn.py: a FrameStacking learner piece makes the replay store frames once and stack at delivery",
)
def _check_frame_stacking() -> str | None:
    if missing := _missing_method(AlgorithmConfig, "build_learner_connector"):
        return missing
    return (
        None
        if _assigns(FrameStacking.__init__, "num_frames")
        else "FrameStacking attribute `num_frames` not found"
    )


def learner_frame_stack(config: Any, algo: Any) -> int | None:
    """``num_frames`` of the ``FrameStacking`` piece in ``config``'s learner connector (``None``: none).

    The pipeline is built as RLlib's learners build it, on the env's single-agent spaces.
    """
    spaces = _read(algo, "spaces", "Algorithm attribute `spaces` not found") or {}
    obs_space, act_space = spaces.get(INPUT_ENV_SINGLE_SPACES, (None, None))
    pipeline = config.build_learner_connector(obs_space, act_space)
    frames = [p.num_frames for p in getattr(pipeline, "connectors", []) if isinstance(p, FrameStacking)]
    return int(frames[0]) if frames else None


# -- the check --------------------------------------------------------------------------------------


def verify(seams: Iterable[Seam] | None = None, version: str = RAY_VERSION) -> dict[str, str]:
    """Check ``seams`` (all by default); return the optional ones missing (name → problem).

    Raises:
        RLlibVersionError: a required seam is missing (the message names each and the ray version).
    """
    missing: dict[str, str] = {}
    required: list[str] = []
    for seam in SEAMS if seams is None else seams:
        try:
            problem = seam.check()
        except Exception as e:  # a check that cannot even run: the seam is gone
            problem = f"{seam.name} not usable ({type(e).__name__}: {e})"
        if problem is None:
            continue
        if seam.fallback is None:
            required.append(problem)
        else:
            missing[seam.name] = problem
            log.warning("ray %s: %s; conduit_rllib falls back: %s", version, problem, seam.fallback)
    if required:
        raise version_error(required, version)
    if version != TESTED_RAY:
        log.warning(
            "ray %s: conduit_rllib is tested with ray[rllib] %s; every RLlib seam it uses is present "
            "(conduit_rllib/compat.py)",
            version,
            TESTED_RAY,
        )
    return missing


def _verify_installed() -> None:
    global _FAST_SAMPLE_BATCH, _FAST_CHUNKS
    missing = verify()
    _FAST_SAMPLE_BATCH = "SampleBatch attributes" not in missing
    _FAST_CHUNKS = not any(name.startswith("episode storage") for name in missing)


_verify_installed()
