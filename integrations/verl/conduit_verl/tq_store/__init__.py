"""Conduit as TransferQueue's storage backend (``transfer_queue.backend.storage_backend=Conduit``).

Importing this package registers nothing and loads nothing heavy; :func:`register` (called by the verl
plugin in every process that imports TransferQueue) makes the backend available, and the backend
itself (``backend.py``) loads when a process first builds its storage manager.
"""

from conduit_verl.tq_store.registration import register

__all__ = ["register"]
