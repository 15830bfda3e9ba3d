"""One TransferQueue write per streamed piece instead of one per stage.

verl's stage methods (``_compute_old_log_prob``, ``_compute_ref_log_prob``, ``_compute_values``,
``_compute_advantage``) each end with a driver round trip ``tq.kv_batch_put`` of what they derived
(old_log_probs + entropy, ref_log_prob, values, advantages + returns), and the later stages read
those fields back with ``tq.kv_batch_get``. On a piece of a few groups each round trip costs about
what it costs on the whole batch. ``PieceWrites`` stands in for the ``tq`` module those methods use
while one piece is ingested: it keeps the driver's writes, serves them back to the later stages,
fetches every other field from TransferQueue, and writes everything in one ``kv_batch_put`` at the
end of the piece, before anything outside the piece can read it (the update workers read after).

Safe because no worker reads a driver-derived field inside a piece: the log-prob and value workers
read the rollout's fields and write ``log_probs`` / ``values``, which the driver fetches (never
from this cache: only fields the driver itself put are served here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tensordict import TensorDict

from conduit_verl.compat import KVBatchMeta, trainer_tq


class PieceWrites:
    """The ``tq`` module as verl's driver-side stage methods see it, for one piece."""

    def __init__(self, tq: Any, meta: KVBatchMeta) -> None:
        self._tq = tq
        self._keys = list(meta.keys)
        self._tags = meta.tags
        self._partition = meta.partition_id
        self._base_fields = meta.fields  # None = "every field" to the workers' TQ bridge
        self._fields: dict[str, Any] = {}
        self.puts_saved = 0

    def _mine(self, keys: list[str], partition_id: str | None) -> bool:
        return partition_id == self._partition and list(keys) == self._keys

    def kv_batch_get(
        self, keys: list[str], partition_id: str, select_fields: Any = None, **kw: Any
    ) -> TensorDict:
        """Fields this piece put come from here, the rest from TransferQueue (one get)."""
        if not self._mine(keys, partition_id) or select_fields is None or kw:
            self.flush()
            return self._tq.kv_batch_get(
                keys=keys, partition_id=partition_id, select_fields=select_fields, **kw
            )
        wanted = [select_fields] if isinstance(select_fields, str) else list(select_fields)
        rest = [f for f in wanted if f not in self._fields]
        if rest:
            data = self._tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=rest)
        else:
            data = TensorDict({}, batch_size=[len(keys)])
        for name in wanted:
            if name in self._fields:
                data[name] = self._fields[name]
        return data

    def kv_batch_put(
        self,
        keys: list[str],
        partition_id: str,
        fields: TensorDict | None = None,
        tags: Any = None,
        **kw: Any,
    ) -> KVBatchMeta:
        """Keep a field-only write of this piece until ``flush``; anything else goes through."""
        if not self._mine(keys, partition_id) or fields is None or tags is not None or kw:
            self.flush()
            return self._tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=fields, tags=tags, **kw)
        for name in fields.keys():
            self._fields[name] = fields[name]
        self.puts_saved += 1
        # TQ's put returns every persisted field; None says the same to the workers' bridge
        fields_now = None if self._base_fields is None else sorted({*self._base_fields, *self._fields})
        return KVBatchMeta(keys=list(keys), tags=self._tags, partition_id=partition_id, fields=fields_now)

    def flush(self) -> None:
        """Write the kept fields to TransferQueue in one put."""
        if not self._fields:
            return
        fields = TensorDict(dict(self._fields), batch_size=[len(self._keys)])
        self._fields = {}
        self.puts_saved -= 1  # the flush is one put
        self._tq.kv_batch_put(keys=self._keys, partition_id=self._partition, fields=fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tq, name)  # every other TransferQueue call: unchanged


@contextlib.contextmanager
def piece_writes(meta: KVBatchMeta) -> Iterator[PieceWrites]:
    """Within the block verl's trainer module uses a ``PieceWrites`` for ``meta``; flushed on exit.

    Driver process, one thread (the streaming step runs its stages one after another).
    """
    from conduit_verl.compat import tq

    writes = PieceWrites(tq, meta)
    with trainer_tq(writes):
        yield writes
        writes.flush()
