"""Conduit as TransferQueue's storage backend (``transfer_queue.backend.storage_backend=Conduit``)."""

from conduit_verl.tq_store.backend import ConduitStorageManager, bootstrap, register

__all__ = ["ConduitStorageManager", "bootstrap", "register"]
