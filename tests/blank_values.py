"""A results document with every value gone: the report tests render it to check that nothing crashes."""

from __future__ import annotations

from typing import Any


def blank(x: Any) -> Any:
    """``x`` (parsed JSON) with the same dicts and lists and every leaf value ``None``."""
    if isinstance(x, dict):
        return {k: blank(v) for k, v in x.items()}
    if isinstance(x, list):
        return [blank(v) for v in x]
    return None
