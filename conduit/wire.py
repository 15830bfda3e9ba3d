"""The data-only wire: a message is a signed JSON header plus raw buffers; nothing is ever unpickled.

A message is the frames ``[mac, header, *buffers]``. The header is JSON: the protocol version, what the
sender puts in it (direction, session, sequence number, timestamp, call id, method), per buffer its
dtype (one of :data:`WIRE_DTYPES`), shape and byte length, and the body: a JSON tree in which arrays,
tensors (dtype from :data:`TORCH_DTYPES`), tuples, dicts, bytes and the records a protocol names (frozen
dataclasses, rebuilt by calling the class: its ``__post_init__`` checks them) are tagged objects; arrays
and tensors name their buffer by number. Buffers are the arrays' raw bytes, sent without a copy; a
receiver checks every declared size against the bytes that came before it makes an array of them (a
view: nothing is allocated from a declared size).

Every frame carries an HMAC-SHA256 over its header and buffers (:func:`seal`), checked with
``hmac.compare_digest`` before anything else of the frame is read (:func:`open_frame`). :class:`Sessions`
refuses a frame replayed, reordered or stale (a sequence number that must grow within its session, a
timestamp within :data:`FRESH_S`). :mod:`conduit.port` serves a storage's methods over this wire.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from conduit.errors import DTypeError

PROTOCOL = 1
MAC_BYTES = 32  # HMAC-SHA256
FRESH_S = 300.0  # a frame's timestamp is at most this far from the receiver's clock
MAX_SESSIONS = 4096
MAX_DEPTH = 64  # nesting of a body's tree
MAX_DIMS = 32  # of a buffer's shape
WARN_EVERY_S = 10.0

#: dtypes numpy cannot hold travel as a same-width integer view
_VIEWS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}

#: the tensor dtypes the wire carries (by name): nothing else is looked up
TORCH_DTYPES: dict[str, torch.dtype] = {
    str(d): d
    for d in (
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
        torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
    )
}  # fmt: skip
#: per tensor dtype the numpy dtype its tensors travel as
_NUMPY_DTYPES = {d: torch.empty(0, dtype=_VIEWS.get(d, d)).numpy().dtype for d in TORCH_DTYPES.values()}
#: the dtypes a buffer may declare (numpy names, native byte order)
WIRE_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
)


def torch_dtype(name: object) -> torch.dtype:
    """The dtype named ``name`` (``"torch.float32"`` or ``"float32"``) from :data:`TORCH_DTYPES`;
    :class:`~conduit.errors.DTypeError` for any other name."""
    if isinstance(name, str):
        dtype = TORCH_DTYPES.get(name if name.startswith("torch.") else f"torch.{name}")
        if dtype is not None:
            return dtype
    raise DTypeError(f"dtype {name!r} is not one of {sorted(TORCH_DTYPES)}")


def to_numpy(t: torch.Tensor) -> tuple[str, np.ndarray]:
    """``(dtype name, array)`` of a tensor as it travels (a CPU copy only where it is not one)."""
    torch_dtype(str(t.dtype))  # a dtype the wire does not carry is refused here, by the writer
    t = t.detach().to("cpu").contiguous()
    view = _VIEWS.get(t.dtype)
    return str(t.dtype), (t.view(view) if view is not None else t).numpy()


def from_numpy(dtype: str, a: Any) -> torch.Tensor:
    """The tensor of ``dtype`` an array travelled as (no copy); :class:`DTypeError` if the array is not
    what the dtype travels as."""
    want = torch_dtype(dtype)
    if not isinstance(a, np.ndarray) or a.dtype != _NUMPY_DTYPES[want]:
        got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
        raise DTypeError(f"a {dtype} column travels as {_NUMPY_DTYPES[want]}, not {got}")
    t = torch.from_numpy(a)
    return t.view(want) if want in _VIEWS else t


class Refused(Exception):
    """A frame refused before anything ran (kind: unsigned, forged, replayed, malformed)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


class NotData(Exception):
    """A value the wire cannot carry; ``path`` leads to it from the top of the tree."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[Any] = []


# -- the body: a JSON tree, arrays and tensors as tagged references to raw buffers -----------------


class Encoder:
    """Encodes values into a JSON tree and its buffers (:attr:`arrays`); ``records``: the dataclasses
    it may carry."""

    def __init__(self, records: Sequence[type[Any]] = ()) -> None:
        self.arrays: list[np.ndarray] = []
        self.records: dict[type[Any], str] = {cls: cls.__name__ for cls in records}

    def _buffer(self, a: np.ndarray) -> int:
        if a.dtype.name not in WIRE_DTYPES or not a.dtype.isnative:
            raise NotData(f"an array of dtype {a.dtype.str} (not one of {sorted(WIRE_DTYPES)})")
        self.arrays.append(np.ascontiguousarray(a))
        return len(self.arrays) - 1

    def item(self, x: Any, key: Any, depth: int) -> Any:
        try:
            return self.encode(x, depth + 1)
        except NotData as e:
            e.path.insert(0, key)
            raise

    def encode(self, x: Any, depth: int = 0) -> Any:
        if x is None or isinstance(x, bool | int | float | str):
            return x
        if depth > MAX_DEPTH:
            raise NotData(f"a value nested deeper than {MAX_DEPTH}")
        if isinstance(x, list):
            return [self.item(v, i, depth) for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"@": "tu", "v": [self.item(v, i, depth) for i, v in enumerate(x)]}
        if isinstance(x, dict):
            keys = list(x)
            for k in keys:
                if not (k is None or isinstance(k, bool | int | float | str)):
                    raise NotData(f"a dict key of type {_type(k)}")
            return {"@": "d", "k": keys, "v": [self.item(x[k], k, depth) for k in keys]}
        if isinstance(x, np.ndarray):
            return {"@": "nd", "i": self._buffer(x)}
        if isinstance(x, torch.Tensor):
            if x.is_nested or x.layout != torch.strided or str(x.dtype) not in TORCH_DTYPES:
                raise NotData(f"a {x.layout} tensor of {x.dtype}")
            dtype, a = to_numpy(x)
            return {"@": "t", "i": self._buffer(a), "dt": dtype}
        if isinstance(x, np.generic):
            return {"@": "ns", "i": self._buffer(np.asarray(x))}
        if isinstance(x, bytes | bytearray):
            return {"@": "b", "i": self._buffer(np.frombuffer(bytes(x), dtype=np.uint8))}
        name = self.records.get(type(x))
        if name is not None:
            values = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
            return {"@": "r", "n": name, "v": self.item(values, name, depth)}
        raise NotData(f"a {_type(x)}")


def _type(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _array(arrays: list[np.ndarray], i: Any) -> np.ndarray:
    if type(i) is not int or not 0 <= i < len(arrays):
        raise ValueError(f"buffer {i!r} of {len(arrays)}")
    return arrays[i]


def decode(x: Any, arrays: list[np.ndarray], records: Sequence[type[Any]] = (), depth: int = 0) -> Any:
    """The value of a JSON tree (:class:`Encoder`'s) over ``arrays``; ``ValueError`` for anything else."""
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    if isinstance(x, list):
        return [decode(v, arrays, records, depth + 1) for v in x]
    if not isinstance(x, dict):
        raise ValueError(f"a {type(x).__name__} in the body")
    tag = x.get("@")
    if tag == "tu" and isinstance(x.get("v"), list):
        return tuple(decode(v, arrays, records, depth + 1) for v in x["v"])
    if tag == "d":
        keys, values = x.get("k"), x.get("v")
        if not (isinstance(keys, list) and isinstance(values, list) and len(keys) == len(values)):
            raise ValueError("a dict's keys and values differ")
        if not all(k is None or isinstance(k, bool | int | float | str) for k in keys):
            raise ValueError("a dict key that is not a number or a string")
        return dict(zip(keys, (decode(v, arrays, records, depth + 1) for v in values)))
    if tag == "nd":
        return _array(arrays, x.get("i"))
    if tag == "t":
        dtype = x.get("dt")
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"tensor dtype {dtype!r} is not one of {sorted(TORCH_DTYPES)}")
        return from_numpy(dtype, np.array(_array(arrays, x.get("i")), copy=True))
    if tag == "ns":
        a = _array(arrays, x.get("i"))
        if a.ndim:
            raise ValueError("a numpy scalar of more than one value")
        return a[()]
    if tag == "b":
        return _array(arrays, x.get("i")).tobytes()
    if tag == "r":
        cls = next((c for c in records if c.__name__ == x.get("n")), None)
        values = decode(x.get("v"), arrays, records, depth + 1)
        if cls is None or not isinstance(values, dict):
            raise ValueError(f"a malformed record {str(x.get('n'))[:64]!r}")
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            raise ValueError(f"a malformed {cls.__name__}: {e}") from None
    raise ValueError(f"unknown tag {tag!r}")


# -- frames: [mac, header, *buffers] ----------------------------------------------------------------


def mac(key: bytes, parts: Sequence[Any]) -> bytes:
    """HMAC-SHA256 of ``parts`` (header, buffers), each prefixed by its byte length."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        view = memoryview(p)
        h.update(view.nbytes.to_bytes(8, "little"))
        h.update(view)
    return h.digest()


def seal(key: bytes, header: dict[str, Any], body: Any, arrays: list[np.ndarray]) -> list[Any]:
    """The frames of a message: ``header`` with the buffers' specs and ``body``, signed."""
    header = {
        **header,
        "v": PROTOCOL,
        "a": [[a.dtype.name, list(a.shape), a.nbytes] for a in arrays],
        "b": body,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return [mac(key, [head, *arrays]), head, *arrays]


def open_frame(key: bytes, frames: Sequence[memoryview]) -> dict[str, Any]:
    """The header of a signed frame; :class:`Refused` when the MAC is missing or wrong (checked before
    anything else is read) or the header is not this protocol's JSON object."""
    if len(frames) < 2 or frames[0].nbytes != MAC_BYTES:
        raise Refused("unsigned", f"{len(frames)} frame(s), no {MAC_BYTES}-byte MAC first")
    if not hmac.compare_digest(bytes(frames[0]), mac(key, frames[1:])):
        raise Refused("forged", "the MAC does not match")
    try:
        header = json.loads(bytes(frames[1]))
    except (ValueError, RecursionError) as e:
        raise Refused("malformed", f"the header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict) or header.get("v") != PROTOCOL:
        raise Refused("malformed", f"the header is not a version {PROTOCOL} object")
    return header


def session_of(header: dict[str, Any], direction: str) -> tuple[str, int, float, int]:
    """``(session, sequence number, timestamp, call id)`` of a header, each checked for its type."""
    sid, seq, ts, cid = (header.get(k) for k in ("s", "n", "t", "id"))
    if (
        header.get("d") != direction
        or not (isinstance(sid, str) and 1 <= len(sid) <= 64)
        or type(seq) is not int
        or type(ts) not in (int, float)
        or not math.isfinite(ts)  # type: ignore[arg-type]
        or type(cid) is not int
    ):
        raise Refused("malformed", f"not a {'request' if direction == 'q' else 'reply'} header")
    return sid, seq, float(ts), cid  # type: ignore[arg-type]


def arrays_of(header: dict[str, Any], frames: Sequence[memoryview]) -> list[np.ndarray]:
    """The buffers as read-only arrays (views of the frames), each declared dtype checked against
    :data:`WIRE_DTYPES` and each declared size against the bytes that came."""
    specs = header.get("a")
    if not isinstance(specs, list) or len(specs) != len(frames):
        raise ValueError(
            f"the header declares {len(specs) if isinstance(specs, list) else 'no'} buffers, {len(frames)} came"
        )
    out = []
    for k, (spec, frame) in enumerate(zip(specs, frames)):
        if not (isinstance(spec, list) and len(spec) == 3):
            raise ValueError(f"buffer {k}: a malformed spec")
        dtype, shape, nbytes = spec
        if not isinstance(dtype, str) or dtype not in WIRE_DTYPES:
            raise ValueError(f"buffer {k}: dtype {dtype!r} is not one of {sorted(WIRE_DTYPES)}")
        if not (
            isinstance(shape, list)
            and len(shape) <= MAX_DIMS
            and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise ValueError(f"buffer {k}: a malformed shape")
        dt = np.dtype(dtype)
        if type(nbytes) is not int or nbytes != frame.nbytes or math.prod(shape) * dt.itemsize != nbytes:
            raise ValueError(
                f"buffer {k}: declared {dtype} {shape} in {nbytes!r} bytes, {frame.nbytes} bytes came"
            )
        out.append(np.frombuffer(frame, dtype=dt).reshape(shape))
    return out


class Warnings:
    """Rate-limited warnings of refused frames on ``logger``: at most one line per kind every ``every_s``."""

    def __init__(self, logger: logging.Logger, where: str, every_s: float = WARN_EVERY_S) -> None:
        self.logger, self.where, self.every_s = logger, where, every_s
        self.counts: Counter[str] = Counter()  # refused frames per kind, all of them
        self.last: dict[str, float] = {}
        self.held: Counter[str] = Counter()

    def warn(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        now = time.monotonic()
        if now - self.last.get(kind, -math.inf) < self.every_s:
            self.held[kind] += 1
            return
        held, self.held[kind], self.last[kind] = self.held[kind], 0, now
        more = f" ({held} more since the last warning)" if held else ""
        self.logger.warning("%s: refused a frame (%s): %s%s", self.where, kind, detail, more)


class Sessions:
    """A receiver's view of its senders' sessions: the last sequence number and newest timestamp of
    each, at most ``limit`` of them; one whose newest timestamp is older than ``window_s`` is forgotten."""

    def __init__(self, window_s: float = FRESH_S, limit: int = MAX_SESSIONS) -> None:
        self.window_s, self.limit = window_s, limit
        self.seen: dict[str, list[float]] = {}
        self.swept = 0.0

    def admit(self, sid: str, seq: int, ts: float, now: float) -> None:
        """Record a frame of session ``sid``; :class:`Refused` if stale, replayed or reordered."""
        if abs(now - ts) > self.window_s:
            raise Refused(
                "replayed", f"timestamp {ts:.3f} is {now - ts:+.1f}s from now (window {self.window_s:g}s)"
            )
        if now - self.swept > 1.0:
            self.seen = {s: e for s, e in self.seen.items() if now - e[1] <= self.window_s}
            self.swept = now
        entry = self.seen.get(sid)
        if entry is None:
            if len(self.seen) >= self.limit:
                raise Refused("replayed", f"{self.limit} sessions are open already")
            self.seen[sid] = [seq, ts]
            return
        if seq <= entry[0]:
            raise Refused("replayed", f"sequence number {seq} after {int(entry[0])} in session {sid[:8]}")
        entry[0], entry[1] = seq, max(entry[1], ts)
