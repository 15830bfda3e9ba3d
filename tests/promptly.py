"""Errors that must reach the caller promptly, not after a timeout."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def raises_within(seconds: float, error: type[BaseException], match: str | None = None) -> Iterator[None]:
    """``pytest.raises(error, match=match)`` that also fails unless the raise came within ``seconds``."""
    t0 = time.monotonic()
    with pytest.raises(error, match=match):
        yield
    assert time.monotonic() - t0 < seconds


def get_raises_within(
    conduit: Any, batch: Any, seconds: float, error: type[BaseException], match: str
) -> None:
    """Put ``batch`` into ``conduit``; getting it back raises ``error`` within ``seconds``; then close the
    Conduit without draining (a worker failed)."""
    conduit.put(batch)
    with raises_within(seconds, error, match):
        conduit.get(batch.size)
    conduit.close(drain=False)
