"""Errors of the verl integration: each is a :class:`conduit.errors.ConduitError`.

Bad knobs raise :class:`conduit.errors.ConfigError` (also a ``ValueError``); the data and setup
problems below raise a :class:`VerlIntegrationError` subclass that names what to fix.
"""

from __future__ import annotations

from conduit.errors import ConduitError, ConfigError

__all__ = [
    "ConfigError",
    "GroupSizeError",
    "PluginNotInstalledError",
    "ResponseTooLongError",
    "RolloutTimeoutError",
    "StaleGroupError",
    "StorageActorError",
    "StorageBackendError",
    "VerlCompatError",
    "VerlIntegrationError",
    "VocabMismatchError",
]


class VerlIntegrationError(ConduitError):
    """Base class of the verl integration's errors."""


class PluginNotInstalledError(VerlIntegrationError):
    """``trainer.v1.trainer_mode=conduit`` was asked for but the ``verl.plugins`` entry point is missing."""


class GroupSizeError(VerlIntegrationError):
    """A rollout returned a GRPO group with fewer (or more) responses than ``rollout.n``."""


class ResponseTooLongError(VerlIntegrationError):
    """A response is longer than ``data.max_response_length``."""


class VocabMismatchError(VerlIntegrationError):
    """The tokenizer produces token ids the model's embedding table does not have."""


class VerlCompatError(VerlIntegrationError):
    """The installed verl (or TransferQueue) lacks something conduit_verl uses (``compat.py``)."""


class StorageBackendError(VerlIntegrationError):
    """The Conduit TransferQueue backend cannot store or return a field (shape, dtype, budget, key)."""


class StorageActorError(StorageBackendError):
    """A Conduit storage actor died or did not answer in time."""


class RolloutTimeoutError(VerlIntegrationError):
    """No prompt group finished within ``trainer.v1.conduit.rollout_timeout_s`` (a hung request, a
    dead agent loop or rollout server); the message names the unfinished groups."""


class StaleGroupError(VerlIntegrationError):
    """A prompt group older than ``trainer.v1.conduit.max_staleness`` allows reached training under
    ``on_stale=drop`` (verl's replay buffer handed it over without the eviction Conduit decided)."""
