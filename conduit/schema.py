"""Schemas: the name, dtype and per-item shape of every column, validated on each write."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from conduit.errors import ConfigError


@dataclass(frozen=True)
class Column:
    """One column of experience.

    Args:
        name: the column's key, e.g. ``"obs"``.
        dtype: the torch dtype every write must have.
        shape: the per-item shape (for ragged columns: the shape of each token / step).
        ragged: whether items have a variable length along a leading axis (token-level data).
        max_len: for ragged columns, the longest item the column accepts.
        check_finite: every write is checked for NaN/inf in this column (rewards, advantages; one
            reduction per batch); the buffer's ``nonfinite`` policy rejects or counts them.

    Example:
        >>> Column("obs", torch.float32, (4,))
        >>> Column("response_ids", torch.int64, ragged=True, max_len=512)
        >>> Column("reward", torch.float32, check_finite=True)
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...] = ()
    ragged: bool = False
    max_len: int | None = None
    check_finite: bool = False

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError(f"column name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise ConfigError(f"column {self.name!r}: dtype must be a torch.dtype, got {self.dtype!r}")
        if not isinstance(self.shape, tuple | list) or not all(_is_int(s) for s in self.shape):
            raise ConfigError(f"column {self.name!r}: shape must be a tuple of ints, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if any(s < 0 for s in self.shape):
            raise ConfigError(f"column {self.name!r}: negative size in shape {self.shape}")
        for flag in ("ragged", "check_finite"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"column {self.name!r}: {flag} must be a bool, got {getattr(self, flag)!r}")
        if self.ragged and not (_is_int(self.max_len) and self.max_len >= 1):  # type: ignore[operator]
            raise ConfigError(f"ragged column {self.name!r} needs an int max_len >= 1, got {self.max_len!r}")
        if self.check_finite and not (self.dtype.is_floating_point or self.dtype.is_complex):
            raise ConfigError(
                f"column {self.name!r}: check_finite applies to floating dtypes, not {self.dtype}"
            )
        if not self.ragged and self.max_len is not None:
            raise ConfigError(f"column {self.name!r}: max_len only applies to ragged columns")

    @property
    def numel_per_item(self) -> int:
        """Elements one item occupies in storage (ragged: at its maximum length)."""
        n = 1
        for s in self.shape:
            n *= s
        return n * (self.max_len or 1 if self.ragged else 1)

    @property
    def nbytes_per_item(self) -> int:
        """Bytes one item occupies in storage (ragged: at its maximum length)."""
        return self.numel_per_item * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Schema:
    """An ordered set of columns. ``schema["obs"]`` returns the column named ``obs``."""

    columns: tuple[Column, ...]
    _by_name: dict[str, Column] = field(init=False, repr=False, compare=False)

    def __init__(self, columns: Iterable[Column]) -> None:
        if not isinstance(columns, Iterable) or isinstance(columns, str | bytes):
            raise ConfigError(f"a schema takes an iterable of Column, got {type(columns).__name__}")
        cols = tuple(columns)
        by_name: dict[str, Column] = {}
        for c in cols:
            if not isinstance(c, Column):
                raise ConfigError(f"schema entries must be Column, got {type(c).__name__}")
            if c.name in by_name:
                raise ConfigError(f"duplicate column name {c.name!r} in schema")
            by_name[c.name] = c
        if not cols:
            raise ConfigError("a schema needs at least one column")
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "_by_name", by_name)

    def __getitem__(self, name: str) -> Column:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Column]:
        return iter(self.columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def nbytes_per_item(self) -> int:
        """Bytes one item occupies in storage, all columns together."""
        return sum(c.nbytes_per_item for c in self.columns)

    def with_column(self, column: Column) -> Schema:
        """A copy with ``column`` added, or replacing the column of the same name."""
        cols = [c for c in self.columns if c.name != column.name]
        return Schema([*cols, column])


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
