"""What ConduitDQN and ConduitPPO share: settings, device, spaces, metrics in results, checkpoints."""

from __future__ import annotations

from typing import Any

import torch

from conduit_rllib.compat import learner_device, local_learner, module_spaces
from conduit_rllib.settings import ConduitSettings
from conduit_rllib.spaces import check_spaces

STATE_KEY = "conduit"


class ConduitAlgorithmMixin:
    """Mixed in before the RLlib algorithm class; subclasses set ``conduit_path`` in ``setup``."""

    config: Any
    learner_group: Any

    @property
    def conduit_path(self) -> Any:
        raise NotImplementedError

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

    def step(self) -> dict[str, Any]:
        """RLlib's iteration, plus Conduit's metrics for it under ``conduit/…``."""
        results = super().step()  # type: ignore[misc]
        results[STATE_KEY] = self.conduit_path.end_iteration()
        return results

    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        state = super().get_state(components, not_components=not_components, **kwargs)  # type: ignore[misc]
        if components is None or STATE_KEY in (
            components if isinstance(components, list | tuple) else [components]
        ):
            state[STATE_KEY] = self.conduit_path.state_dict()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # type: ignore[misc]
        if STATE_KEY in state:
            self.conduit_path.load_state_dict(state[STATE_KEY])

    def cleanup(self) -> None:
        path = getattr(self, "_replay", None) or getattr(self, "_onpolicy", None)
        if path is not None:
            path.close()
        super().cleanup()  # type: ignore[misc]
