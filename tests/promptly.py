"""Errors that must reach the caller promptly, not after a timeout."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def raises_within(seconds: float, error: type[BaseException], match: str | None = None) -> Iterator[None]:
    """``pytest.raises(error, match=match)`` that also fails unless the raise came within ``seconds``."""
    t0 = time.monotonic()
    with pytest.raises(error, match=match):
        yield
    assert time.monotonic() - t0 < seconds
