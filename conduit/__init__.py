"""Conduit: an experience data plane for distributed reinforcement learning."""

from conduit.api import Conduit
from conduit.batch import ColumnBatch, ConsolidatedBatch, Ragged, validate
from conduit.buffer.buffer import ExperienceBuffer, Sample
from conduit.config import BufferConfig, RateLimit, SchedulerConfig
from conduit.errors import (
    CapacityError,
    ClosedError,
    ConduitError,
    ConfigError,
    DeviceUnavailableError,
    DTypeError,
    InsufficientDataError,
    OperatorError,
    RaggedLengthError,
    SchemaError,
    ShapeError,
    StaleDataError,
)
from conduit.metrics import Metrics
from conduit.ops import Delivery, Operator
from conduit.schema import Column, Schema

__all__ = [
    "BufferConfig",
    "CapacityError",
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
    "Metrics",
    "Operator",
    "OperatorError",
    "RaggedLengthError",
    "RateLimit",
    "Ragged",
    "Sample",
    "SchedulerConfig",
    "Schema",
    "SchemaError",
    "ShapeError",
    "StaleDataError",
    "validate",
]
__version__ = "0.1.0"
