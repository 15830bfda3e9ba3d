"""Conduit: an experience data plane for distributed reinforcement learning."""

from conduit.api import Conduit
from conduit.batch import ColumnBatch, ConsolidatedBatch, Ragged, validate
from conduit.buffer.buffer import ExperienceBuffer, Sample
from conduit.build_buffer import build_buffer
from conduit.config import BufferConfig, RateLimit, SchedulerConfig
from conduit.errors import (
    CapacityError,
    CheckpointError,
    ClosedError,
    ConduitError,
    ConfigError,
    DeviceUnavailableError,
    DTypeError,
    InsufficientDataError,
    JournalError,
    NonFiniteError,
    OperatorError,
    PlacementCapacityError,
    PriorityError,
    RaggedLengthError,
    SchemaError,
    ShapeError,
    StaleDataError,
    VersionError,
)
from conduit.metrics import Metrics
from conduit.ops import Delivery, Operator, Part
from conduit.schema import Column, Schema

__all__ = [
    "BufferConfig",
    "CapacityError",
    "CheckpointError",
    "ClosedError",
    "Column",
    "ColumnBatch",
    "Conduit",
    "ConduitError",
    "ConfigError",
    "ConsolidatedBatch",
    "DTypeError",
    "Delivery",
    "DeviceUnavailableError",
    "ExperienceBuffer",
    "InsufficientDataError",
    "JournalError",
    "Metrics",
    "NonFiniteError",
    "Operator",
    "OperatorError",
    "Part",
    "PlacementCapacityError",
    "PriorityError",
    "RaggedLengthError",
    "RateLimit",
    "Ragged",
    "Sample",
    "SchedulerConfig",
    "Schema",
    "SchemaError",
    "ShapeError",
    "StaleDataError",
    "VersionError",
    "build_buffer",
    "validate",
]
__version__ = "0.1.0"
