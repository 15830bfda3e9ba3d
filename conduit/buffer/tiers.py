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

from conduit.errors import CapacityError, ConfigError, DeviceUnavailableError, PlacementCapacityError


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
    except PlacementCapacityError:
        raise
    except OSError as e:
        raise ConfigError(f"tier {tier!r}: cannot create storage under disk_path={disk_dir!r}: {e}") from e
    except (RuntimeError, MemoryError) as e:  # the allocator's out-of-memory
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        raise CapacityError(
            f"tier {tier!r} cannot allocate {nbytes / 2**30:.2f} GiB for a {tuple(shape)} {dtype} column; "
            f"lower capacity or max_len ({e})"
        ) from e


#: what a file-backed tier leaves free on its file system: this share of it, at most 1 GiB
SPACE_MARGIN_FRACTION = 0.05
SPACE_MARGIN_MAX_BYTES = 1 << 30


def check_free_space(directory: str, nbytes: int, tier: str, what: str = "a column") -> None:
    """Raise :class:`PlacementCapacityError` unless ``directory``'s file system has ``nbytes`` free
    beyond the margin (a file-backed tier that outgrows its file system dies of SIGBUS on a write)."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    margin = min(SPACE_MARGIN_MAX_BYTES, int(SPACE_MARGIN_FRACTION * st.f_blocks * st.f_frsize))
    if nbytes + margin > free:
        raise PlacementCapacityError(
            f"tier {tier!r}: {what} of {nbytes / 2**20:.1f} MiB does not fit under {directory!r}: "
            f"{free / 2**20:.1f} MiB free, {margin / 2**20:.1f} MiB kept as margin; lower capacity or "
            "max_len, or choose another tier or directory",
            missing_bytes=nbytes + margin - free,
            tiers=[tier],
        )


def reserve_file(path: str, nbytes: int, tier: str, what: str = "a column") -> None:
    """Create ``path`` with ``nbytes`` of blocks allocated on its file system (``posix_fallocate``), so
    later writes through a mapping can never meet a full file system; :class:`PlacementCapacityError`
    if they are not there (checked with the margin first)."""
    check_free_space(os.path.dirname(path) or ".", nbytes, tier, what)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if nbytes:
            os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        raise PlacementCapacityError(
            f"tier {tier!r}: cannot reserve {nbytes / 2**20:.1f} MiB for {what} at {path!r}: {e}",
            missing_bytes=nbytes,
            tiers=[tier],
        ) from e
    os.close(fd)


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
    numel = math.prod(shape)
    nbytes = max(numel, 1) * torch.empty((), dtype=dtype).element_size()
    if tier == "shm":
        if os.path.isdir("/dev/shm"):  # torch's shared memory lives there (tmpfs: SIGBUS when full)
            check_free_space("/dev/shm", nbytes, tier)
        return torch.zeros(shape, dtype=dtype).share_memory_()
    if tier == "disk":
        return map_file(shape, dtype, tier, disk_dir or tempfile.gettempdir())[0]
    return torch.zeros(shape, dtype=dtype, device=tier)


def map_file(shape: tuple[int, ...], dtype: torch.dtype, tier: str, directory: str, what: str = "a column",
             keep_open: bool = False) -> tuple[torch.Tensor, int]:  # fmt: skip
    """A zero-filled tensor of ``shape``/``dtype`` backed by a new file under ``directory``, and (with
    ``keep_open``) an open read-write descriptor of that file, else -1.

    The file's blocks are reserved first (:func:`reserve_file`: a full file system is an error here,
    never SIGBUS on a later write through the mapping); the file is unlinked at once, so nothing is left
    behind: the mapping stays valid, and another process on the node maps the same memory through the
    kept descriptor (``/proc/<pid>/fd/<fd>``) until the owner closes it.
    """
    os.makedirs(directory, exist_ok=True)
    numel = math.prod(shape)
    path = os.path.join(directory, f"conduit-{uuid.uuid4().hex}.bin")
    reserve_file(path, max(numel, 1) * torch.empty((), dtype=dtype).element_size(), tier, what)
    flat = torch.from_file(path, shared=True, size=max(numel, 1), dtype=dtype)
    fd = os.open(path, os.O_RDWR) if keep_open else -1
    os.unlink(path)
    return flat[:numel].view(shape), fd
