"""Arrays another process on the same node maps: where they are (:class:`Layout`), and a batch's rows
read from or written into them in place (:func:`read_mapped`, :func:`write_mapped`; the owner's side is
:class:`~conduit.buffer.rows.RowArray`). Ragged rows are copied in one pass over their valid prefixes
(:mod:`conduit.buffer.ragged_kernels`), into pooled host memory on a read.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch

from conduit.batch import Ragged
from conduit.buffer.ragged_kernels import gather_prefixes, gather_tokens, scatter_prefixes, scatter_tokens
from conduit.buffer.recycled import host_pool
from conduit.errors import ConduitError
from conduit.wire import TORCH_DTYPES, torch_dtype

T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """Where a mapped array's memory is, for a process on the same node.

    The file is unlinked as soon as it is created (nothing is left behind if the owner dies); readers
    open it through the owner's open descriptor (``/proc/<pid>/fd/<fd>``) and check its inode, since a
    descriptor number can be reused once the array has grown into a new file.
    """

    path: str
    inode: int
    dtype: str
    shape: tuple[int, ...]  # the whole array: [capacity, *shape] or [capacity, max_len, *shape]
    field: str = ""

    def __post_init__(self) -> None:  # a layout from the wire is checked here (conduit.wire records)
        if not (
            isinstance(self.path, str)
            and type(self.inode) is int
            and self.dtype in TORCH_DTYPES
            and isinstance(self.shape, tuple)
            and all(type(d) is int and d >= 0 for d in self.shape)
            and isinstance(self.field, str)
        ):
            raise ValueError("a malformed layout")


class StaleLayoutError(ConduitError):
    """The mapped file is gone, another file now has its descriptor, or its rows are too short: ask the
    owner again."""


def write_rows(array: torch.Tensor, rows: torch.Tensor, data: Ragged) -> None:
    """Item ``i`` of ``data`` into the prefix of row ``rows[i]`` of ``[capacity, max_len, *shape]``: on
    CPU one pass (each byte copied once), on a device the valid tokens cross once, then one scatter."""
    if array.device.type == "cpu":
        scatter_prefixes(array, rows, data.offsets, data.values.contiguous())
    else:
        scatter_tokens(array, rows, data.offsets, data.values)


def read_rows(array: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> Ragged:
    """The first ``lengths[i]`` tokens of rows ``rows[i]`` of ``[capacity, max_len, *shape]``, flat.

    On CPU one pass copies each valid token once into memory from the process's
    :class:`~conduit.buffer.recycled.HostPool` (once the consumer drops an earlier batch, the next one
    reuses its pages); on a device one gather there, and only the valid tokens cross to the host.
    """
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    if array.device.type == "cpu":
        out = host_pool().empty((int(offsets[-1]), *array.shape[2:]), array.dtype)
        return Ragged(gather_prefixes(array, rows, offsets, out), offsets)
    return Ragged(gather_tokens(array, rows, offsets).to("cpu"), offsets)


# per process: (owner process, array) -> (inode, mapped array); an array that grew into a new file
# replaces its entry, so the old file's pages are freed once the owner drops it too
_MAPPED: dict[tuple[str, str], tuple[int, torch.Tensor]] = {}
_MAPPED_MAX = 256


def map_layout(layout: Layout) -> torch.Tensor:
    """The array ``layout`` describes, mapped (cached per owner and array); :class:`StaleLayoutError` if
    its file is gone or is another file now."""
    key = (layout.path.rsplit("/fd/", 1)[0], layout.field)
    hit = _MAPPED.get(key)
    if hit is not None and hit[0] == layout.inode and tuple(hit[1].shape) == layout.shape:
        return hit[1]
    try:
        fd = os.open(layout.path, os.O_RDONLY)
    except OSError as e:
        raise StaleLayoutError(str(e)) from e
    try:
        if os.fstat(fd).st_ino != layout.inode:
            raise StaleLayoutError(f"{layout.path} is another file now")
        numel = math.prod(layout.shape)
        flat = torch.from_file(
            f"/proc/self/fd/{fd}", shared=True, size=max(numel, 1), dtype=torch_dtype(layout.dtype)
        )
    finally:
        os.close(fd)  # the mapping stays valid
    array = flat[:numel].view(layout.shape)
    if key not in _MAPPED and len(_MAPPED) >= _MAPPED_MAX:
        _MAPPED.pop(next(iter(_MAPPED)))
    _MAPPED[key] = (layout.inode, array)
    return array


def read_mapped(layout: Layout, rows: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor | Ragged:
    """A same-node process's gather of ``rows`` straight from the owner's memory (``lengths``: per row its
    tokens, None for fixed rows): one copy, into its own tensor."""
    array = map_layout(layout)
    return array.index_select(0, rows) if lengths is None else read_rows(array, rows, lengths)


def write_mapped(layout: Layout, rows: torch.Tensor, data: torch.Tensor | Ragged) -> torch.Tensor | None:
    """A same-node writer's scatter of ``data`` straight into the owner's memory, item ``i`` into row
    ``rows[i]`` (rows :meth:`RowArray.reserve` gave): one copy. The lengths the commit records (None for
    fixed rows); :class:`StaleLayoutError` for a row longer than the array's."""
    array = map_layout(layout)
    if not isinstance(data, Ragged):
        array.index_copy_(0, rows, data.to(array.device, array.dtype))
        return None
    lengths = data.lengths
    if lengths.numel() and int(lengths.max()) > array.shape[1]:
        raise StaleLayoutError(
            f"column {layout.field!r}: a row of {int(lengths.max())} in rows of {array.shape[1]}"
        )
    scatter_prefixes(array, rows, data.offsets, data.values.contiguous())
    return lengths


PARALLEL_COPY_MIN_BYTES = 4 << 20  # copies of at least this many bytes in all run on the copy threads
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def copy_pool() -> ThreadPoolExecutor:
    """This process's threads for large mapped reads and writes (two: the cores of the smallest machine
    Conduit targets; the copies release the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=min(2, os.cpu_count() or 1), thread_name_prefix="conduit-copy"
            )
        return _POOL


async def run_copies(
    jobs: Sequence[Callable[[], T]], nbytes: int, min_parallel_bytes: int = PARALLEL_COPY_MIN_BYTES
) -> list[T]:
    """The results of ``jobs`` (copies, e.g. one :func:`read_mapped` or :func:`write_mapped` per column,
    ``nbytes`` in all): on the :func:`copy_pool` threads when there are several and they are large (the
    event loop is not blocked meanwhile), else one after another. Every job has ended before the first
    error is raised (no thread may still write into rows its caller gives back)."""
    if len(jobs) > 1 and nbytes >= min_parallel_bytes:
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(loop.run_in_executor(copy_pool(), job) for job in jobs), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]
    return [job() for job in jobs]
