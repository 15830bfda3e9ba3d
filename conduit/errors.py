"""The ConduitError hierarchy: every bad input gets an error that names the problem.

Each error is raised *before* any state changes, so a failed call leaves the buffer as it was.
"""

from __future__ import annotations

from collections.abc import Sequence


class ConduitError(Exception):
    """Base class of every error Conduit raises on purpose."""


class SchemaError(ConduitError):
    """A batch does not match the buffer's schema (a column missing or extra)."""


class DTypeError(SchemaError):
    """A column has the wrong dtype."""


class ShapeError(SchemaError):
    """A column has the wrong per-item shape, or columns disagree on the item count."""


class RaggedLengthError(SchemaError):
    """A ragged item is longer than its column's configured maximum length."""


class CapacityError(ConduitError):
    """An item or a write is larger than the storage tier can hold."""


class PlacementCapacityError(CapacityError):
    """A placement does not fit: ``missing_bytes`` more would be needed on ``tiers``."""

    def __init__(self, message: str, missing_bytes: int, tiers: Sequence[str]) -> None:
        super().__init__(message)
        self.missing_bytes = int(missing_bytes)
        self.tiers = tuple(tiers)


class InsufficientDataError(ConduitError):
    """More items were requested than the rate limiter allows (error mode)."""


class StaleDataError(ConduitError):
    """Items are older than the declared maximum staleness in policy versions."""


class ConfigError(ConduitError, ValueError):
    """An unknown config key, or a knob value out of its range."""


class ClosedError(ConduitError):
    """The buffer or runtime was used after ``close()``."""


class DeviceUnavailableError(ConduitError):
    """A tier or device was requested that this machine does not have (e.g. CUDA without a GPU)."""


class OperatorError(ConduitError):
    """An ingestion or delivery operator failed or returned a batch of the wrong shape."""


class PriorityError(ConduitError):
    """A priority update that cannot apply: non-finite values, slots outside the buffer, or a sampler
    without priorities."""


class VersionError(ConduitError):
    """A policy version went backwards (a put older than the last put, or a consumer older than the last)."""


class CheckpointError(ConduitError):
    """A saved state does not fit this buffer (other capacity, columns or sampler) or is malformed."""


class JournalError(ConduitError):
    """The journal could not make a write durable (e.g. disk full, file size limit): the write that
    raises it was not committed, and every later one is refused the same way."""


class JournalLockedError(JournalError):
    """Another journal is writing the directory (in this process or another, named in the message):
    one writer per journal directory, since two interleave their records and lose items on replay."""


class NonFiniteError(ConduitError):
    """A column the schema marks ``check_finite`` (rewards, advantages) holds NaN or inf, and the
    buffer's ``nonfinite`` policy is ``"reject"``."""
