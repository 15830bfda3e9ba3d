"""An operator is a named batch → batch transform; chains of them run on the way in or out."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from conduit.batch import ColumnBatch
from conduit.errors import ConduitError, OperatorError
from conduit.metrics import Metrics


@dataclass(frozen=True)
class Operator:
    """A named, vectorised transform of a whole batch.

    Ingestion operators run on rollout fragments before they are stored (n-step returns, GAE,
    log-probs, rewards, advantages); delivery operators run on sampled batches before they move to
    the consumer (collate, pad or pack, dtype casts). ``fn`` must work on the whole batch at once.

    Example:
        >>> def add_return(b: ColumnBatch) -> ColumnBatch:
        ...     return b.with_columns(ret=b["reward"] * 0.99)
        >>> conduit = Conduit(schema, ingest=[Operator("discount", add_return)])
    """

    name: str
    fn: Callable[[ColumnBatch], ColumnBatch]

    def __call__(self, batch: ColumnBatch) -> ColumnBatch:
        with failure_named(f"operator {self.name!r} failed on a batch of {batch.size} items"):
            out = self.fn(batch)
        if not isinstance(out, ColumnBatch):
            raise OperatorError(f"operator {self.name!r} returned {type(out).__name__}, expected ColumnBatch")
        return out


@contextmanager
def failure_named(what: str) -> Iterator[None]:
    """Re-raise a framework's exception inside as :class:`OperatorError` ``"<what>: <exception>"``
    (a :class:`ConduitError` passes through as it is)."""
    try:
        yield
    except ConduitError:
        raise
    except Exception as e:
        raise OperatorError(f"{what}: {e!r}") from e


def run_chain(ops: Sequence[Operator], batch: ColumnBatch, metrics: Metrics, stage: str) -> ColumnBatch:
    """Apply ``ops`` in order, timing each as ``<stage>/<name>``."""
    for op in ops:
        with metrics.span(f"{stage}/{op.name}"):
            batch = op(batch)
    return batch
