"""Per-response ingestion before its GRPO group finishes (the on-policy streaming step).

A group is ready only when all ``n`` of its responses are: with batched generation a group ends
with its longest response, so most groups finish in the last part of generation even though their
responses finish all along it, and streaming by groups leaves most of the ingestion after the last
token. The per-sample stages — a colocated reward, old log-probs, reference log-probs, values —
need one response each, not its group; only the advantage needs the group.

While the streaming step waits for groups, :class:`EarlyRows` reads TransferQueue's tags (one
``kv_list``), takes this step's responses that have finished and that no stage has seen, and runs
the per-sample stages on them once at least ``min_rows`` wait (whole inference micro-batches over
the data-parallel ranks: :func:`conduit_verl.checks.row_unit`). The group piece later runs those
stages on its rows not done yet and the advantage on all of them (:meth:`EarlyRows.rest`).

Used only on-policy (``max_staleness=0``) with the rollout on hardware of its own
(``rollout_hardware=separate``), and only in a streamed step: when the piece policy runs the whole
batch as one piece (its ``whole`` arm, verl's schedule) no response is ingested early. Every
response is then trained by the weights that are current while it is generated (the update comes
after the step's last piece), so its old log-probs are the same whenever they are computed, and
ingestion while generation runs costs generation nothing.
Any schedule gives the same samples; losses agree to the log-prob kernels' batch invariance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conduit_verl import compat
from conduit_verl.compat import KVBatchMeta

#: runs the per-sample stages on a batch of responses (the streaming step's, with its timers)
RunStages = Callable[[KVBatchMeta], None]


class EarlyRows:
    """This step's finished responses, ingested before their groups finish (driver, one thread)."""

    def __init__(self, min_rows: int, row_unit: int, partition_id: str = "train") -> None:
        if min_rows < 1 or row_unit < 1 or min_rows % row_unit:
            raise ValueError(f"min_rows={min_rows} must be a positive multiple of row_unit={row_unit}")
        self.min_rows = min_rows
        self.row_unit = row_unit
        self.partition_id = partition_id
        self.done: set[str] = set()
        self.rows = 0  # ingested early this step
        self.calls = 0
        #: early rows run this step (off when the step takes the whole batch as one piece)
        self.active = True

    def begin_step(self, active: bool = True) -> None:
        """A new step; ``active=False``: the step runs verl's schedule (one whole-batch piece after
        generation), so no response is ingested early and its piece runs every stage in one pass."""
        self.done.clear()
        self.rows = self.calls = 0
        self.active = active

    def finished(self, listing: dict[str, dict[str, Any]], version: int) -> tuple[list[str], list[dict]]:
        """This step's finished responses no stage has seen (``listing``: TransferQueue's ``kv_list``
        of the partition), in key order."""
        keys, tags = [], []
        for key in sorted(listing):
            tag = listing[key]
            if tag.get("is_prompt") or tag.get("status") != "success" or key in self.done:
                continue
            if tag.get("global_steps", version) != version:
                continue
            keys.append(key)
            tags.append(tag)
        return keys, tags

    def ingest(self, version: int, extra_info: dict[str, Any], run: RunStages) -> int:
        """``run`` the per-sample stages on the waiting responses if at least ``min_rows`` wait (whole
        units of ``row_unit``); the rows ingested."""
        listing = (compat.tq.kv_list(partition_id=self.partition_id) or {}).get(self.partition_id) or {}
        keys, tags = self.finished(listing, version)
        take = len(keys) // self.row_unit * self.row_unit
        if take < self.min_rows:
            return 0
        meta = KVBatchMeta(
            keys=keys[:take], tags=tags[:take], partition_id=self.partition_id, extra_info=dict(extra_info)
        )
        run(meta)
        self.done.update(meta.keys)
        self.rows += take
        self.calls += 1
        return take

    def rest(self, piece: KVBatchMeta) -> KVBatchMeta | None:
        """The piece's responses whose per-sample stages have not run (None: all have), topped up
        with done ones to whole units of ``row_unit`` (the piece is whole units: its done rows are
        computed again, to the same values); marks them done."""
        keep = [i for i, k in enumerate(piece.keys) if k not in self.done]
        if not keep:
            return None
        short = -len(keep) % self.row_unit
        if short:
            again = [i for i, k in enumerate(piece.keys) if k in self.done][:short]
            keep = sorted(keep + again)
        self.done.update(piece.keys)
        if len(keep) == len(piece.keys):
            return piece
        return KVBatchMeta(
            keys=[piece.keys[i] for i in keep],
            tags=[piece.tags[i] for i in keep],
            partition_id=piece.partition_id,
            extra_info=dict(piece.extra_info or {}),
        )
