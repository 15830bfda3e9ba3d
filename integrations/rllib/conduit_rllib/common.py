"""What ConduitDQN and ConduitPPO share: settings, device, spaces, metrics in results, checkpoints; and
what their experience paths (``ConduitReplay``, ``ConduitOnPolicy``) share."""

from __future__ import annotations

import pathlib
import tempfile
import uuid
from typing import Any

import torch

from conduit import Conduit, Metrics
from conduit.persist import atomic
from conduit.persist.tree import load_tree, save_tree
from conduit_rllib.compat import (
    ALL_MODULES,
    ENV_RUNNER_SAMPLING_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    learner_device,
    local_learner,
    module_spaces,
    sample_episodes,
)
from conduit_rllib.settings import ConduitSettings
from conduit_rllib.spaces import check_spaces

STATE_KEY = "conduit"
POLICY_VERSION = "policy_version"
CONDUIT_DIR = "conduit"  # beside RLlib's files in a checkpoint: the experience, in Conduit's safe format
FRAMES = "frames."  # a frame store among a checkpoint's buffers: FRAMES + module id (saved incrementally)


class ModuleConduits:
    """An experience path: one Conduit per RLlib module, on the learner device, split over the learners.

    Args:
        settings: the plugin's knobs.
        device: the learner's device (local learner) or ``cpu`` (remote learners).
        num_learners: remote learners each batch is split over (0: one local learner).
        seed: the Conduits' seed (``None``: unseeded).
    """

    def __init__(
        self, settings: ConduitSettings, device: torch.device | str, num_learners: int, seed: int | None
    ) -> None:
        self.settings = settings
        self.device = torch.device(device)
        self.num_learners = num_learners
        self.seed = seed
        self.metrics = Metrics(trace=False)
        self.conduits: dict[str, Conduit] = {}

    @property
    def ranks(self) -> int:
        """The parts each delivery is split into: one per learner."""
        return max(1, self.num_learners)

    def end_iteration(self) -> dict[str, float]:
        return self.metrics.end_iteration()

    def disk_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(state, buffers)`` for an on-disk checkpoint (``save_tree``): the state, and the buffers to
        checkpoint by name (here the Conduits by module id)."""
        return self.state_dict(), dict(self.conduits)  # type: ignore[attr-defined]

    def buffer_named(self, name: str) -> Any:
        """The buffer :meth:`disk_state` saved under ``name``."""
        return self.conduits[name]

    def close(self) -> None:
        for c in self.conduits.values():
            c.close(drain=False)


class ConduitAlgorithmMixin:
    """Mixed in before the RLlib algorithm class; subclasses call ``_start_conduit`` in ``setup``."""

    config: Any
    learner_group: Any
    env_runner_group: Any
    metrics: Any
    _policy_version: int

    @classmethod
    def get_default_config(cls) -> Any:
        """The RLlib algorithm's default config, with this class as its algorithm."""
        config = super().get_default_config()  # type: ignore[misc]
        config.algo_class = cls
        return config

    def _start_conduit(self, path: Any) -> None:
        """Make ``path`` (a ``ConduitReplay`` or ``ConduitOnPolicy``) the experience path this algorithm
        saves, restores and closes; its puts start at policy version 0."""
        self._conduit_path = path
        self._policy_version = 0

    @property
    def conduit_path(self) -> Any:
        return self._conduit_path

    def _conduit_settings(self) -> ConduitSettings:
        return ConduitSettings.of(self.config)

    def _conduit_seed(self) -> int | None:
        s = self._conduit_settings().seed
        return s if s is not None else self.config.seed

    def _learner_device(self) -> torch.device:
        """The local learner's device; CPU (then object refs) when learners are remote actors."""
        if self.config.num_learners > 0:
            return torch.device("cpu")
        return torch.device(learner_device(local_learner(self.learner_group)))

    def _check_spaces(self, discrete_actions: bool) -> None:
        check_spaces(module_spaces(self), discrete_actions)

    def _sample(self, **limits: Any) -> tuple[list[Any], list[Any]]:
        """``(episodes, env-runner metrics)`` of one sampling round, under RLlib's sampling timer."""
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            return sample_episodes(
                self.env_runner_group, sample_timeout_s=self.config.sample_timeout_s, **limits
            )

    def _sync_weights(self, learner_results: list[dict[str, Any]]) -> None:
        """The updated modules' weights to the env runners, under RLlib's weight-sync timer."""
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.env_runner_group.sync_weights(
                from_worker_or_learner_group=self.learner_group,
                policies=set(learner_results[0].keys()) - {ALL_MODULES},
                inference_only=True,
            )

    def step(self) -> dict[str, Any]:
        """RLlib's iteration, plus Conduit's metrics for it under ``conduit/…``."""
        results = super().step()  # type: ignore[misc]
        results[STATE_KEY] = self.conduit_path.end_iteration()
        return results

    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)  # type: ignore[misc]
        wanted = components is None or STATE_KEY in (
            components if isinstance(components, list | tuple) else [components]
        )
        if wanted and not getattr(
            self, "_conduit_saving", False
        ):  # on disk it goes beside, not in the pickle
            state[STATE_KEY] = self.conduit_path.state_dict()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # type: ignore[misc]
        if STATE_KEY in state:
            self.conduit_path.load_state_dict(state[STATE_KEY])

    def save_to_path(
        self, path: Any = None, *, state: Any = None, filesystem: Any = None, **kwargs: Any
    ) -> str:
        """RLlib's checkpoint, with the experience beside it in Conduit's format (``conduit/``), written to
        a new directory and swapped into ``path`` in one step: a crash leaves the old or the new one."""
        if state is not None or filesystem is not None:
            return str(super().save_to_path(path, state=state, filesystem=filesystem, **kwargs))  # type: ignore[misc]
        final = atomic.local_dir(path or pathlib.Path(tempfile.gettempdir()) / str(uuid.uuid4()))
        atomic.remove_stale(final)
        tmp = atomic.temp_sibling(final)
        self._conduit_saving = True
        try:
            super().save_to_path(tmp.as_posix(), **kwargs)  # type: ignore[misc]
        finally:
            self._conduit_saving = False
        previous = final / CONDUIT_DIR
        state, buffers = self.conduit_path.disk_state()
        conduit_state = {**state, POLICY_VERSION: getattr(self, "_policy_version", 0)}
        save_tree(
            conduit_state,
            buffers,
            tmp / CONDUIT_DIR,
            previous if previous.is_dir() else None,
            linked={name for name in buffers if name.startswith(FRAMES)},
        )
        atomic.fsync_tree(tmp)
        atomic.publish_dir(tmp, final)
        return str(final)

    def restore_from_path(self, path: Any, *args: Any, **kwargs: Any) -> None:
        """RLlib's restore, then the experience saved beside it (older checkpoints keep it in the pickle)."""
        atomic.remove_stale(atomic.local_dir(path))
        super().restore_from_path(path, *args, **kwargs)  # type: ignore[misc]
        saved = pathlib.Path(path) / CONDUIT_DIR
        if kwargs.get("component") is None and saved.is_dir():
            state = load_tree(saved, self.conduit_path.buffer_named)
            self._policy_version = int(state.pop(POLICY_VERSION, 0))  # puts go on from the saved version
            self.conduit_path.load_state_dict(state)

    def cleanup(self) -> None:
        path = getattr(self, "_conduit_path", None)
        if path is not None:
            path.close()
        super().cleanup()  # type: ignore[misc]
