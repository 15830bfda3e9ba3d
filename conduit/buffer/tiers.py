"""Memory tiers: where a buffer's preallocated storage lives, and how it is allocated there."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import tempfile
import uuid

import torch

from conduit.errors import CapacityError, ConfigError, DeviceUnavailableError


def tier_device(tier: str) -> torch.device:
    """The torch device whose memory backs ``tier`` (host tiers are all ``cpu``)."""
    return torch.device(tier) if tier.startswith("cuda") else torch.device("cpu")


def check_tier_available(tier: str) -> None:
    """Raise :class:`DeviceUnavailableError` if this machine cannot provide ``tier``."""
    if tier.startswith("cuda") or tier == "pinned":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"tier {tier!r} needs CUDA, but torch.cuda.is_available() is False on this machine; "
                "use tier='host', 'shm' or 'disk'"
            )
        if tier.startswith("cuda:"):
            index = int(tier.split(":")[1])
            if index >= torch.cuda.device_count():
                raise DeviceUnavailableError(
                    f"tier {tier!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
                )


def allocate(
    shape: tuple[int, ...], dtype: torch.dtype, tier: str, disk_dir: str | None = None
) -> torch.Tensor:
    """A zero-filled tensor of ``shape``/``dtype`` on ``tier``.

    ``shm`` memory is shared across processes (``Tensor.share_memory_``); ``disk`` is a file-backed
    memory map under ``disk_dir`` (a temporary directory if None) that is deleted when unlinked.
    """
    check_tier_available(tier)
    try:
        return _allocate(shape, dtype, tier, disk_dir)
    except OSError as e:
        raise ConfigError(f"tier {tier!r}: cannot create storage under disk_path={disk_dir!r}: {e}") from e
    except (RuntimeError, MemoryError) as e:  # the allocator's out-of-memory
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        raise CapacityError(
            f"tier {tier!r} cannot allocate {nbytes / 2**30:.2f} GiB for a {tuple(shape)} {dtype} column; "
            f"lower capacity or max_len ({e})"
        ) from e


HUGE_PAGE = 2 << 20  # x86-64 / arm64 transparent huge page size
HUGE_MIN_BYTES = 8 * HUGE_PAGE  # below this a column is mostly cache-resident: 4 KiB pages cost nothing


def _advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask Linux for transparent huge pages on ``t``'s whole 2 MiB pages before they are first touched.

    A sampled batch reads rows scattered over the column: with 4 KiB pages each row of a few KiB is
    another TLB miss and page walk (a random 256 x 4 KiB gather ran ~20% faster on huge pages here).
    Only where THP is ``madvise`` or ``always`` (a no-op where it is ``never``); False if not applied.
    """
    if not sys.platform.startswith("linux") or t.nbytes < HUGE_MIN_BYTES:
        return False
    start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (t.data_ptr() + t.nbytes) // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    madv_hugepage = 14  # <sys/mman.h>
    return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), madv_hugepage) == 0


def _allocate(shape: tuple[int, ...], dtype: torch.dtype, tier: str, disk_dir: str | None) -> torch.Tensor:
    if tier == "host":
        t = torch.empty(shape, dtype=dtype)
        _advise_huge_pages(t)
        return t.zero_()
    if tier == "pinned":
        return torch.zeros(shape, dtype=dtype).pin_memory()
    if tier == "shm":
        return torch.zeros(shape, dtype=dtype).share_memory_()
    if tier == "disk":
        directory = disk_dir or tempfile.gettempdir()
        os.makedirs(directory, exist_ok=True)
        numel = math.prod(shape)
        path = os.path.join(directory, f"conduit-{uuid.uuid4().hex}.bin")
        flat = torch.from_file(path, shared=True, size=max(numel, 1), dtype=dtype)
        os.unlink(path)  # the mapping stays valid; the file disappears with the last reference
        return flat[:numel].view(shape)
    return torch.zeros(shape, dtype=dtype, device=tier)
