"""A TransferQueue reader in its own Ray process, as one rank of a trainer's mesh reads its samples."""

from __future__ import annotations

import sys

import ray
import transfer_queue as tq

# Ray's workers cannot import this module: its remote class travels by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
class Reader:
    """A consumer in its own process (a rank of a trainer's mesh): reads through TransferQueue."""

    def __init__(self) -> None:
        import conduit_verl.tq_store as s

        s.register()
        tq.init()

    def read(self, keys: list[str]) -> list[list[int]]:
        """The ``responses`` of ``keys`` (partition ``train``), one list of token ids per sample."""
        out = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["responses"])
        return [x.tolist() for x in out["responses"].unbind()]
