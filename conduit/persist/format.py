"""Conduit's safe on-disk format: checksummed records of JSON metadata + raw tensor bytes (no pickle).

A record is ``MAGIC | header_len (u32) | payload_len (u64) | crc32 (u32) | header | payload``: the
header is UTF-8 JSON (``{"meta": ..., "tensors": [{"dtype", "shape", "offset", "nbytes"}, ...]}``),
the payload the tensors' bytes back to back, and the CRC32 covers header and payload. Reading
checks the magic, the lengths and the checksum before anything is decoded, and only the dtypes
named in :data:`DTYPES` are accepted, so a file can never run code when it is loaded.

:func:`encode` / :func:`decode` turn a state tree (dicts, lists, tuples, ints, floats, strings,
tensors, numpy arrays, torch dtypes) into JSON with tensor references and back.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import torch

from conduit.buffer.base import MAX_COUNT
from conduit.errors import CheckpointError

MAGIC = b"CDR1"
_FRAME = struct.Struct("<4sIQI")  # magic, header length, payload length, crc32
FRAME_BYTES = _FRAME.size
MAX_HEADER = 64 << 20  # a header larger than this is corrupt, not big
MAX_DEPTH = 100  # lists and dicts in a header nest at most this deep (~30 levels of saved dicts)
MAX_DIMS = 16  # dimensions of a saved tensor

DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    """The name :data:`DTYPES` knows ``dtype`` by (raises ``CheckpointError`` for others)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise CheckpointError(f"dtype {dtype} cannot be saved; supported: {sorted(DTYPES)}")
    return name


def _bytes_of(t: torch.Tensor) -> memoryview:
    if t.numel() == 0:
        return memoryview(b"")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw: Any = flat.view(torch.uint8).numpy()
    return memoryview(raw).cast("B")


def frame(meta: dict[str, Any], tensors: list[torch.Tensor]) -> list[bytes | memoryview]:
    """One record as a list of buffers to write in order (tensor bytes are not copied)."""
    views = [_bytes_of(t) for t in tensors]
    specs, offset = [], 0
    for t, v in zip(tensors, views):
        specs.append(
            {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "offset": offset, "nbytes": v.nbytes}
        )
        offset += v.nbytes
    head = {"meta": meta, "tensors": specs}
    try:
        check_depth(head)  # what a load would refuse is never written
    except ValueError as e:
        raise CheckpointError(f"cannot save a state {e}") from e
    header = json.dumps(head, separators=(",", ":")).encode()
    crc = zlib.crc32(header)
    for v in views:
        crc = zlib.crc32(v, crc)
    return [_FRAME.pack(MAGIC, len(header), offset, crc), header, *views]


def write_record(f: BinaryIO, meta: dict[str, Any], tensors: list[torch.Tensor]) -> int:
    """Append one record to ``f``; returns the bytes written."""
    n = 0
    for part in frame(meta, tensors):
        f.write(part)
        n += len(part) if isinstance(part, bytes) else part.nbytes
    return n


def parse_record(
    data: bytes | bytearray | memoryview, offset: int
) -> tuple[dict[str, Any], list[torch.Tensor], int]:
    """The record at ``offset`` of ``data``: ``(meta, tensors, next offset)``.

    Raises :class:`CheckpointError` naming the offset for a torn, truncated or corrupt record.
    The tensors share ``data``'s memory (pass a ``bytearray`` to get writable tensors).
    """
    view = memoryview(data)
    end = len(view)
    if end - offset < FRAME_BYTES:
        raise CheckpointError(f"record at byte {offset}: truncated frame ({end - offset} bytes left)")
    magic, hlen, plen, crc = _FRAME.unpack_from(view, offset)
    if magic != MAGIC:
        raise CheckpointError(f"record at byte {offset}: bad magic {bytes(magic)!r} (not a Conduit record)")
    start = offset + FRAME_BYTES
    if hlen > MAX_HEADER or start + hlen + plen > end:
        raise CheckpointError(
            f"record at byte {offset}: truncated (needs {hlen + plen} bytes, {end - start} left)"
        )
    header, payload = view[start : start + hlen], view[start + hlen : start + hlen + plen]
    if zlib.crc32(payload, zlib.crc32(header)) != crc:
        raise CheckpointError(f"record at byte {offset}: checksum mismatch (corrupt data)")
    try:
        head = json.loads(bytes(header))
        check_depth(head)
        if not isinstance(head, dict) or "meta" not in head or not isinstance(head.get("tensors"), list):
            raise ValueError("not a record header (expected 'meta' and a 'tensors' list)")
        tensors = [_tensor(payload, spec) for spec in head["tensors"]]
    except (ValueError, KeyError, TypeError, RuntimeError, OverflowError, RecursionError, MemoryError) as e:
        raise CheckpointError(f"record at byte {offset}: malformed header ({type(e).__name__}: {e})") from e
    return head["meta"], tensors, start + hlen + plen


def check_depth(tree: Any, limit: int = MAX_DEPTH) -> None:
    """Raise ``ValueError`` if the lists and dicts of ``tree`` nest deeper than ``limit`` (no recursion)."""
    level, depth = [tree], 0
    while level:
        depth += 1
        if depth > limit:
            raise ValueError(f"nested deeper than {limit} levels")
        nxt: list[Any] = []
        for x in level:
            if isinstance(x, dict):
                nxt.extend(v for v in x.values() if isinstance(v, dict | list))
            elif isinstance(x, list):
                nxt.extend(v for v in x if isinstance(v, dict | list))
        level = nxt


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} {value!r} is not a size in [0, {MAX_COUNT}]")
    return value


def _tensor(payload: memoryview, spec: dict[str, Any]) -> torch.Tensor:
    if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list):
        raise ValueError(f"tensor spec {str(spec)[:80]} lacks a shape list")
    dtype = DTYPES.get(spec.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise ValueError(f"unknown dtype {str(spec.get('dtype'))[:40]!r} (supported: {sorted(DTYPES)})")
    if len(spec["shape"]) > MAX_DIMS:
        raise ValueError(f"tensor of {len(spec['shape'])} dimensions (at most {MAX_DIMS})")
    shape = [_count(s, "dimension") for s in spec["shape"]]
    off, nbytes = _count(spec.get("offset"), "offset"), _count(spec.get("nbytes"), "nbytes")
    itemsize = torch.empty((), dtype=dtype).element_size()
    # the sizes are checked against the payload actually read before anything is allocated
    if nbytes != math.prod(shape) * itemsize or off + nbytes > payload.nbytes:
        raise ValueError(f"tensor {spec} does not fit the payload of {payload.nbytes} bytes")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(payload[off : off + nbytes], dtype=torch.uint8)  # type: ignore[arg-type]
    return raw.view(dtype).reshape(shape)


def records(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, dict[str, Any], list[torch.Tensor]]]:
    """``(offset, meta, tensors)`` of each record in ``data`` in order; raises at the first bad one."""
    offset = 0
    while offset < len(data):
        meta, tensors, nxt = parse_record(data, offset)
        yield offset, meta, tensors
        offset = nxt


# -- state trees ---------------------------------------------------------------------------------


def encode(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """``tree`` as JSON-able data; each tensor/array is appended to ``tensors`` and referenced by index."""
    if tree is None or isinstance(tree, bool | int | str):
        return tree
    if isinstance(tree, float):
        return tree if math.isfinite(tree) else {"$f": repr(tree)}
    if isinstance(tree, torch.Tensor):
        tensors.append(tree)
        return {"$t": len(tensors) - 1}
    if isinstance(tree, np.ndarray):
        tensors.append(torch.from_numpy(np.ascontiguousarray(tree)))
        return {"$np": len(tensors) - 1}
    if isinstance(tree, np.generic):
        return {"$npv": encode(np.asarray(tree), tensors)}
    if isinstance(tree, torch.dtype):
        return {"$dtype": dtype_name(tree)}
    if isinstance(tree, tuple):
        return {"$tuple": [encode(x, tensors) for x in tree]}
    if isinstance(tree, list):
        return [encode(x, tensors) for x in tree]
    if isinstance(tree, dict):
        return {"$d": [[encode(k, tensors), encode(v, tensors)] for k, v in tree.items()]}
    raise CheckpointError(f"cannot save a {type(tree).__name__} in a Conduit checkpoint (no pickle)")


def decode(data: Any, tensors: list[torch.Tensor]) -> Any:
    """The tree :func:`encode` described (tensors cloned out of the record's memory)."""
    if isinstance(data, list):
        return [decode(x, tensors) for x in data]
    if not isinstance(data, dict):
        return data
    try:
        if "$t" in data:
            return tensors[_count(data["$t"], "tensor index")].clone()
        if "$np" in data:
            return tensors[_count(data["$np"], "tensor index")].numpy().copy()
        if "$npv" in data:
            return decode(data["$npv"], tensors)[()]
        if "$f" in data:
            return float(data["$f"])
        if "$dtype" in data:
            return DTYPES[data["$dtype"]]
        if "$tuple" in data:
            return tuple(decode(x, tensors) for x in data["$tuple"])
        return {decode(k, tensors): decode(v, tensors) for k, v in data["$d"]}
    except (KeyError, IndexError, TypeError, ValueError, OverflowError, RuntimeError, MemoryError) as e:
        raise CheckpointError(
            f"malformed saved state near {str(data)[:80]!r} ({type(e).__name__}: {e})"
        ) from e
