"""One node's store of TransferQueue fields (what a storage actor holds): a core
:class:`~conduit.buffer.keyed_service.KeyedService` keyed by global index.

Plain Python so it is testable without Ray. The service checks what comes from the wire (global
indexes, each field's column) before anything is written; this module adds what is TransferQueue's:
verl's field names in a placement, the bound on global indexes, and :class:`StorageBackendError` as the
class of every error. :data:`PROTOCOL` is what its data port answers.
"""

from __future__ import annotations

import tempfile
from typing import Any

from conduit.buffer.keyed import AUTO, KeyedStore
from conduit.buffer.keyed_service import METHODS, KeyedService, raised_as
from conduit.buffer.mapped import Layout
from conduit.buffer.rows import TIERS
from conduit.errors import (
    CapacityError,
    ConduitError,
    ConfigError,
    DTypeError,
    RaggedLengthError,
    SchemaError,
    ShapeError,
)
from conduit.port import Protocol
from conduit_verl.errors import StorageActorError, StorageBackendError

#: the fields verl 0.9.1 writes to TransferQueue (what a placement entry may name)
VERL_FIELDS = (
    "prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "loss_mask",
    "rollout_log_probs", "rm_scores", "old_log_probs", "entropy", "ref_log_prob", "values", "advantages",
    "returns", "token_level_scores", "token_level_rewards", "routed_experts", "num_turns",
    "multi_modal_inputs", "teacher_log_probs", "teacher_ids",
)  # fmt: skip


#: global indexes are ``0 <= key < MAX_GLOBAL_INDEX`` (TransferQueue counts them up from 0, reusing
#: cleared ones); a key outside raises :class:`StorageBackendError` naming it
MAX_GLOBAL_INDEX = 2**31


#: the store's calls its data port answers (:mod:`conduit.port`; everything a TQ client calls), with
#: their arguments' names, and the errors that travel back by class
PROTOCOL = Protocol(
    methods=METHODS,
    errors=(
        StorageActorError,
        ConduitError,
        ConfigError,
        SchemaError,
        DTypeError,
        ShapeError,
        RaggedLengthError,
        CapacityError,
    ),  # fmt: skip
    error=StorageBackendError,
    records=(Layout,),
)


def check_placement(placement: dict[str, str]) -> None:
    """Raise :class:`StorageBackendError` naming an unknown field or tier."""
    for field, tier in placement.items():
        if field not in VERL_FIELDS:
            raise StorageBackendError(
                f"placement names unknown field {field!r}; verl's fields: {', '.join(VERL_FIELDS)}"
            )
        if tier not in TIERS:
            raise StorageBackendError(f"placement.{field}={tier!r}: unknown tier; tiers: {', '.join(TIERS)}")


class NodeStore(KeyedService):
    """Fields of the samples routed to this node, slot = global index, in a core
    :class:`~conduit.buffer.keyed.KeyedStore` (its ``fields`` are the store's columns); every error a
    :class:`StorageBackendError`."""

    def __init__(
        self,
        placement: dict[str, str] | None = None,
        budgets: dict[str, int] | None = None,
        default_tier: str = AUTO,
        directory: str | None = None,
        lease_s: float = 600.0,
    ) -> None:
        check_placement(dict(placement or {}))
        with raised_as(StorageBackendError):
            keyed = KeyedStore(
                placement,
                budgets,
                default_tier,
                directory or tempfile.gettempdir(),
                lease_s,
                "field",
                "global indexes",
            )
        super().__init__(keyed, MAX_GLOBAL_INDEX, "global index", StorageBackendError)
        self.fields, self.budgets = keyed.columns, keyed.budgets

    def stats(self) -> dict[str, Any]:
        """Counters, and per field its tier (and whether it spilled there) and bytes."""
        stats = self.keyed.stats()
        stats["fields"] = stats.pop("columns")
        return stats


__all__ = ["NodeStore", "VERL_FIELDS", "check_placement"]
