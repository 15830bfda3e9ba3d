"""Large host columns ask Linux for transparent huge pages (fewer TLB misses on scattered row reads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conduit.buffer.tiers import HUGE_MIN_BYTES, HUGE_PAGE, _advise_huge_pages, allocate

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _vma_flags(ptr: int) -> list[str]:
    """The VmFlags of the mapping holding address ``ptr`` (``hg``: MADV_HUGEPAGE was given)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {ptr:#x}")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not THP.exists() or "[never]" in THP.read_text(),
    reason="transparent huge pages are not available here",
)
def test_a_large_host_column_is_advised_huge_pages_and_a_small_one_is_not() -> None:
    big = allocate((HUGE_MIN_BYTES // 4 + 1024,), torch.float32, "host")
    assert bool((big == 0).all())
    inner = -(-big.data_ptr() // HUGE_PAGE) * HUGE_PAGE  # the first whole huge page inside it
    assert "hg" in _vma_flags(inner)
    small = allocate((1024,), torch.float32, "host")
    assert bool((small == 0).all())
    assert not _advise_huge_pages(small)  # below HUGE_MIN_BYTES: left to the allocator
