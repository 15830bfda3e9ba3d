"""Register rollout name "hf" in verl's two rollout registries, lazily (no heavy import up front)."""

from __future__ import annotations

import importlib
from typing import Any

from conduit_verl._post_import import when_imported

ROLLOUT_NAME = "hf"
_ROLLOUT_MODULE = "conduit_verl_cpu.rollout"


def _load_replica() -> Any:
    return importlib.import_module(_ROLLOUT_MODULE).HFReplica


def _register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)


def _register_adapter() -> None:
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{_ROLLOUT_MODULE}.HFRolloutAdapter"


def register_rollout() -> None:
    """Hook the registrations onto the import of verl's rollout modules."""
    when_imported("verl.workers.rollout.replica", _register_replica)
    when_imported("verl.workers.rollout.base", _register_adapter)
