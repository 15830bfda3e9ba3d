# mypy: allow-untyped-defs
"""Ragged rows in and out of a slot-padded array in one pass: one copy, no padding, no per-row Python.

A slot-padded array ``[rows, max_len, *rest]`` keeps row ``s``'s tokens in ``array[s, :len]``. A batch
of ragged rows travels flat: ``values[offsets[i]:offsets[i + 1]]`` is row ``i``.

- :func:`gather_prefixes` copies the valid prefix of rows ``slots`` into a flat tensor;
- :func:`scatter_prefixes` writes flat rows into the prefixes of rows ``slots``;
- :func:`copy_segments` copies segments between two flat tensors (a ragged batch's rows taken in
  another order, or parts of a batch placed back into one);
- :func:`scatter_tokens` and :func:`gather_tokens` do the first two for an array on a device (torch:
  the valid tokens cross once, then one ``index_copy_`` / ``index_select`` there).

Each is one numba call that copies each byte once (the torch route pads or gathers whole padded rows
first: two copies and a padded temporary the size of the batch). The copy runs on machine words as
wide as the token's byte width allows (8, 4, 2 or 1 bytes), so any dtype works. Out-of-range slots
and rows longer than ``max_len`` raise ``IndexError`` before anything is written by the scatter.
"""

from __future__ import annotations

import math

import torch
from numba import njit

from conduit.errors import RaggedLengthError

_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


@njit(cache=True, nogil=True, boundscheck=False)
def _prefixes(array, slots, offsets, flat, into_array):
    """``flat`` rows to or from the prefixes of ``array``'s rows ``slots``; every row checked first."""
    rows, width = array.shape
    for i in range(slots.shape[0]):
        s = slots[i]
        n = offsets[i + 1] - offsets[i]
        if s < 0 or s >= rows:
            raise IndexError("ragged rows: slot out of range")
        if n < 0 or n > width:
            raise IndexError("ragged rows: a row is longer than the array's max_len (or offsets decrease)")
    for i in range(slots.shape[0]):
        a = offsets[i]
        n = offsets[i + 1] - a
        if into_array:
            array[slots[i], :n] = flat[a : a + n]
        else:
            flat[a : a + n] = array[slots[i], :n]


@njit(cache=True, nogil=True, boundscheck=False)
def _segments(src, src_starts, dst, dst_starts, lengths):
    for i in range(lengths.shape[0]):
        a, b, n = src_starts[i], dst_starts[i], lengths[i]
        if n < 0 or a < 0 or b < 0 or a + n > src.shape[0] or b + n > dst.shape[0]:
            raise IndexError("copy_segments: a segment lies outside its tensor")
    for i in range(lengths.shape[0]):
        a, b, n = src_starts[i], dst_starts[i], lengths[i]
        dst[b : b + n] = src[a : a + n]


def _word(token_bytes: int) -> tuple[int, torch.dtype]:
    for size, dtype in _WORDS:
        if token_bytes % size == 0:
            return size, dtype
    raise AssertionError("unreachable: every width divides by 1")


def _views(array: torch.Tensor, flat: torch.Tensor, offsets: torch.Tensor, slots: torch.Tensor):
    """numpy word views: array ``[rows, max_len * words]``, flat ``[total * words]``, offsets in words."""
    if array.dim() < 2:
        raise ValueError(
            f"ragged rows: the slot-padded array needs [rows, max_len, ...], got {tuple(array.shape)}"
        )
    if flat.dtype != array.dtype or tuple(flat.shape[1:]) != tuple(array.shape[2:]):
        raise ValueError(
            f"ragged rows: values {flat.dtype} {tuple(flat.shape)} do not match the array's "
            f"{array.dtype} {tuple(array.shape)}"
        )
    if array.device.type != "cpu" or flat.device.type != "cpu":
        raise ValueError("ragged rows: the kernels copy CPU memory (use torch for device tensors)")
    if not (array.is_contiguous() and flat.is_contiguous()):
        raise ValueError("ragged rows: array and values must be contiguous")
    if offsets.numel() != slots.numel() + 1:
        raise ValueError(f"ragged rows: {offsets.numel()} offsets for {slots.numel()} slots")
    if slots.numel() and int(offsets[-1]) != flat.shape[0]:
        raise ValueError(
            f"ragged rows: offsets end at {int(offsets[-1])}, values hold {flat.shape[0]} tokens"
        )
    token_bytes = math.prod(array.shape[2:]) * array.element_size()
    size, word = _word(token_bytes)
    per = token_bytes // size
    rows = array.shape[0]
    a = array.view(torch.uint8).view(word).reshape(rows, -1) if token_bytes else array.reshape(rows, 0)
    f = flat.reshape(-1).view(torch.uint8).view(word) if token_bytes else flat.reshape(-1)
    o = offsets.to(torch.int64) * per
    return a.numpy(), f.numpy(), o.contiguous().numpy(), slots.to(torch.int64).contiguous().numpy()


def gather_prefixes(array: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor,
                    out: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Copy ``array[slots[i], :len_i]`` to ``out[offsets[i]:offsets[i + 1]]`` for every ``i``; returns ``out``."""
    if slots.numel():
        a, flat, o, s = _views(array, out, offsets, slots)
        _prefixes(a, s, o, flat, False)
    return out


def scatter_prefixes(array: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor,
                     values: torch.Tensor) -> None:  # fmt: skip
    """Copy ``values[offsets[i]:offsets[i + 1]]`` to ``array[slots[i], :len_i]`` for every ``i``."""
    if slots.numel():
        a, flat, o, s = _views(array, values, offsets, slots)
        _prefixes(a, s, o, flat, True)


def copy_segments(src: torch.Tensor, src_starts: torch.Tensor, dst: torch.Tensor, dst_starts: torch.Tensor,
                  lengths: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``dst[dst_starts[i] : + lengths[i]] = src[src_starts[i] : + lengths[i]]`` for every ``i`` (tokens
    along dim 0; ``src`` and ``dst`` contiguous CPU tensors of one dtype and per-token shape). Every
    segment is checked before any is copied. Returns ``dst``."""
    if src.dtype != dst.dtype or tuple(src.shape[1:]) != tuple(dst.shape[1:]) or src.dim() < 1:
        raise ValueError(f"copy_segments: {src.dtype} {tuple(src.shape)} into {dst.dtype} {tuple(dst.shape)}")
    if (
        src.device.type != "cpu"
        or dst.device.type != "cpu"
        or not (src.is_contiguous() and dst.is_contiguous())
    ):
        raise ValueError("copy_segments: src and dst must be contiguous CPU tensors")
    if not (src_starts.numel() == dst_starts.numel() == lengths.numel()):
        raise ValueError("copy_segments: src_starts, dst_starts and lengths differ in length")
    if lengths.numel() == 0:
        return dst
    token_bytes = math.prod(src.shape[1:]) * src.element_size()
    if token_bytes == 0:
        return dst
    size, word = _word(token_bytes)
    per = token_bytes // size

    def words(t: torch.Tensor):
        return t.reshape(-1).view(torch.uint8).view(word).numpy()

    def scaled(t: torch.Tensor):
        return (t.to(torch.int64) * per).contiguous().numpy()

    _segments(words(src), scaled(src_starts), words(dst), scaled(dst_starts), scaled(lengths))
    return dst


def token_positions(
    rows: torch.Tensor, offsets: torch.Tensor, max_len: int, device: torch.device
) -> torch.Tensor:
    """Flat positions, in a ``[capacity, max_len]`` array viewed as ``[capacity * max_len]``, of every
    valid token of a batch whose row ``i`` is the prefix of row ``rows[i]`` with ``offsets[i + 1] -
    offsets[i]`` tokens, in the batch's token order; built on ``device`` (token ``k`` of row ``i`` sits
    at ``rows[i] * max_len + k - offsets[i]``)."""
    total = int(offsets[-1]) if offsets.numel() else 0
    rows, offsets = rows.to(device), offsets.to(device)
    starts = rows * max_len - offsets[:-1]
    within = torch.repeat_interleave(starts, offsets[1:] - offsets[:-1], output_size=total)
    return within + torch.arange(total, device=device, dtype=within.dtype)


def _flat(array: torch.Tensor) -> torch.Tensor:
    return array.view(array.shape[0] * array.shape[1], *array.shape[2:])


def scatter_tokens(
    array: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor
) -> None:
    """:func:`scatter_prefixes` for an array on a device; :class:`RaggedLengthError` (nothing written)
    for a row longer than the array's."""
    lengths = offsets[1:] - offsets[:-1]
    if lengths.numel() and int(lengths.max()) > array.shape[1]:
        raise RaggedLengthError(f"a row of {int(lengths.max())} tokens in rows of {array.shape[1]}")
    positions = token_positions(rows, offsets, array.shape[1], array.device)
    _flat(array).index_copy_(0, positions, values.to(array.device, array.dtype))


def gather_tokens(array: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The valid tokens of ``rows`` (lengths from ``offsets``), flat, on the array's device: one gather."""
    return _flat(array).index_select(0, token_positions(rows, offsets, array.shape[1], array.device))


_warmed = False


def warm_ragged_kernels() -> None:
    """Load (or compile, on a cold cache) the kernels for the int64 word signature verl's fields use;
    once per process."""
    global _warmed
    if _warmed:
        return
    array = torch.zeros(2, 2, dtype=torch.int64)
    offsets = torch.tensor([0, 1])
    gather_prefixes(array, torch.tensor([1]), offsets, torch.empty(1, dtype=torch.int64))
    scatter_prefixes(array, torch.tensor([1]), offsets, torch.ones(1, dtype=torch.int64))
    one = torch.tensor([1])
    copy_segments(array.view(-1), one, torch.empty(2, dtype=torch.int64), one, one)
    _warmed = True
