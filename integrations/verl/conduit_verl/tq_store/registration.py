"""Registers the ``Conduit`` backend with TransferQueue without importing it (verl imports TransferQueue in
every process; the backend, and Conduit's core with it, load only when a process actually uses it)."""

from __future__ import annotations

from typing import Any

from transfer_queue.storage.bootstrap import StorageBootstrapProvider
from transfer_queue.storage.managers.base import StorageManager, StorageManagerFactory

NAME = "Conduit"


class _DeferredManager(StorageManager):
    """What TransferQueue's factory constructs: builds the real manager on first use."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        from conduit_verl.tq_store.backend import ConduitStorageManager

        return ConduitStorageManager(*args, **kwargs)


def _bootstrap(conf: Any) -> Any:
    from conduit_verl.tq_store.backend import bootstrap

    return bootstrap(conf)


def register() -> None:
    """Register the backend with TransferQueue (idempotent; the verl plugin calls it in every process)."""
    StorageBootstrapProvider.register_provider(NAME)(_bootstrap)
    StorageManagerFactory.register(NAME)(_DeferredManager)
