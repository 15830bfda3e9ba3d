"""A storage actor's data port: its store's calls over one ZMQ socket instead of Ray actor calls.

A Ray actor call costs ~1.3 ms here even when empty, and its arguments travel through Ray's object
stores (between two nodes: a copy into the sender's store, chunked pushes into the receiver's, a
copy out). verl's agent loop puts one trajectory at a time, and every same-node put in place is two
calls (plan, commit). The data port answers the same :class:`~conduit_verl.tq_store.store.NodeStore`
calls (:data:`METHODS`) over one ZMQ socket (TransferQueue's own SimpleStorage talks to its units the
same way). The Ray actor stays the store's owner (placement, life, stats); its methods and the port
share one lock.

**The socket.** One ZMQ ROUTER per storage actor (:class:`StorePort`), on a random TCP port of
``127.0.0.1`` when the Ray cluster has a single alive node as the store starts (every reader is on this
node), else of the node's address (``ray.util.get_node_ip_address()``), which readers on the other nodes
must reach (``backend.port_host``). A node that joins a single-node cluster later cannot reach a
loopback port: start the storage (``tq.init``) once every node is up.

**The wire carries data, never code.** A message is the frames ``[mac, header, *buffers]``. The header is
JSON: protocol version, direction, the client's session id, a sequence number, a timestamp, the call id,
the method (one of :data:`METHODS`) or the outcome, per buffer its dtype (one of :data:`WIRE_DTYPES`),
shape and byte length, and the body: the arguments or the answer as a JSON tree in which arrays,
tensors (their dtype from ``columns.TORCH_DTYPES``), tuples, dicts, bytes and mapped-file layouts are
tagged objects (arrays and tensors name their buffer by number). The buffers are the arrays' raw bytes,
sent without a copy; a receiver checks every declared size against the bytes that came before it makes
an array of them (a view, no allocation). Nothing is unpickled: an object column may hold strings,
numbers, bools, None, lists, tuples, dicts and tensors; anything else is refused by the writer
(:class:`StorageBackendError` naming the field and the type). The store's errors travel as a class
name from :data:`ERRORS` and a message, re-raised as that class (else :class:`StorageBackendError`).

**Authentication.** Every frame carries an HMAC-SHA256 over its header and buffers, keyed by a 32-byte
secret the storage actor draws at start (``os.urandom``) and hands out only through Ray (the actor's
``port_address`` returns the address and the key). The MAC is checked (``hmac.compare_digest``) before
anything else of the frame is read. A request names its client's session, a sequence number that must
grow strictly within the session, and a timestamp within :data:`FRESH_S` of the store's clock: a frame
replayed, reordered or stale is refused. The store keeps at most :data:`MAX_SESSIONS` sessions and
forgets one whose newest timestamp is older than :data:`FRESH_S` (its frames are stale by then). Replies
are signed the same way, name the client's session and carry the store's increasing sequence number.
A refused frame (bad or missing MAC, replay, stale, malformed header) runs nothing and gets no answer;
an authentic request that does not hold up (unknown method, a dtype outside the list, sizes that
disagree, a malformed body) runs nothing and is answered with a :class:`StorageBackendError`. Each is
logged as a warning, at most one line per kind every :data:`WARN_EVERY_S` seconds (with the count
held back); the serving thread survives anything a frame holds.

:class:`PortClient` is a process's connection to one store: a DEALER socket on the caller's event
loop, several calls in flight, each answered by id. A store that does not answer within a slice is
asked through Ray whether its actor is alive, so a dead store is reported as dead (naming the keys)
rather than after the whole timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import torch
import zmq
import zmq.asyncio

from conduit.errors import (
    CapacityError,
    ConduitError,
    ConfigError,
    DTypeError,
    RaggedLengthError,
    SchemaError,
    ShapeError,
)
from conduit_verl.errors import StorageActorError, StorageBackendError
from conduit_verl.tq_store.columns import TORCH_DTYPES, _from_numpy, _to_numpy
from conduit_verl.tq_store.fields import Layout

logger = logging.getLogger(__name__)

#: the store methods the port answers (everything a TQ client calls), with their arguments' names
ARGS: dict[str, tuple[str, ...]] = {
    "put": ("gis", "wires"),
    "get": ("gis", "names"),
    "read_plan": ("gis", "names", "same_node"),
    "write_plan": ("gis", "specs", "same_node"),
    "commit": ("plan_id", "gis", "lengths", "wires"),
    "abandon": ("plan_id",),
    "clear": ("gis",),
}
METHODS = frozenset(ARGS)
#: the dtypes a buffer may declare (numpy names, native byte order)
WIRE_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)
#: the error classes a store's error is re-raised as (by name); any other is a StorageBackendError
ERRORS: dict[str, type[Exception]] = {
    c.__name__: c
    for c in (StorageBackendError, StorageActorError, ConduitError, ConfigError, SchemaError, DTypeError,
              ShapeError, RaggedLengthError, CapacityError)
}  # fmt: skip
PROTOCOL = 1
KEY_BYTES = 32
MAC_BYTES = 32  # HMAC-SHA256
FRESH_S = 300.0  # a frame's timestamp is at most this far from the receiver's clock
MAX_SESSIONS = 4096
MAX_DEPTH = 64  # nesting of a body's tree
MAX_DIMS = 32  # of a buffer's shape
MAX_MESSAGE_CHARS = 4000  # of an error's message
WARN_EVERY_S = 10.0
LIVENESS_SLICE_S = 2.0  # a call waits this long before asking Ray whether the store is alive


class _Refused(Exception):
    """A frame refused before anything ran (kind: unsigned, forged, replayed, malformed)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


class _NotData(Exception):
    """A value the wire cannot carry; ``path`` leads to it from the top of the tree."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[Any] = []


# -- the body: a JSON tree, arrays and tensors as tagged references to raw buffers -----------------


class _Encoder:
    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def _buffer(self, a: np.ndarray) -> int:
        if a.dtype.name not in WIRE_DTYPES or not a.dtype.isnative:
            raise _NotData(f"an array of dtype {a.dtype.str} (not one of {sorted(WIRE_DTYPES)})")
        self.arrays.append(np.ascontiguousarray(a))
        return len(self.arrays) - 1

    def item(self, x: Any, key: Any, depth: int) -> Any:
        try:
            return self.encode(x, depth + 1)
        except _NotData as e:
            e.path.insert(0, key)
            raise

    def encode(self, x: Any, depth: int = 0) -> Any:
        if x is None or isinstance(x, bool | int | float | str):
            return x
        if depth > MAX_DEPTH:
            raise _NotData(f"a value nested deeper than {MAX_DEPTH}")
        if isinstance(x, list):
            return [self.item(v, i, depth) for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"@": "tu", "v": [self.item(v, i, depth) for i, v in enumerate(x)]}
        if isinstance(x, dict):
            keys = list(x)
            for k in keys:
                if not (k is None or isinstance(k, bool | int | float | str)):
                    raise _NotData(f"a dict key of type {_type(k)}")
            return {"@": "d", "k": keys, "v": [self.item(x[k], k, depth) for k in keys]}
        if isinstance(x, np.ndarray):
            return {"@": "nd", "i": self._buffer(x)}
        if isinstance(x, torch.Tensor):
            if x.is_nested or x.layout != torch.strided or str(x.dtype) not in TORCH_DTYPES:
                raise _NotData(f"a {x.layout} tensor of {x.dtype}")
            dtype, a = _to_numpy(x)
            return {"@": "t", "i": self._buffer(a), "dt": dtype}
        if isinstance(x, np.generic):
            return {"@": "ns", "i": self._buffer(np.asarray(x))}
        if isinstance(x, bytes | bytearray):
            return {"@": "b", "i": self._buffer(np.frombuffer(bytes(x), dtype=np.uint8))}
        if isinstance(x, Layout):
            return {"@": "L", "path": x.path, "inode": x.inode, "dtype": x.dtype, "shape": list(x.shape),
                    "field": x.field}  # fmt: skip
        raise _NotData(f"a {_type(x)}")


def _type(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def encode(method: str, args: Sequence[Any], answer: bool = False) -> tuple[Any, list[np.ndarray]]:
    """``args`` of ``method`` (or its ``answer``) as a JSON tree and its buffers; :class:`StorageBackendError`
    naming the field and the type of anything that is not data."""
    enc = _Encoder()
    try:
        if answer:
            return enc.item(args, "answer", 0), enc.arrays
        return [enc.item(a, i, 0) for i, a in enumerate(args)], enc.arrays
    except _NotData as e:
        head, *rest = e.path
        names = ARGS.get(method, ())
        where = names[head] if isinstance(head, int) and head < len(names) else str(head)
        field = f"field {rest[0]!r}: " if where == "wires" and rest and isinstance(rest[0], str) else ""
        at = where + "".join(f"[{k!r}]" for k in rest)
        raise StorageBackendError(
            f"{field}{method} {at} holds {e.what}, which the data port does not carry (data only: "
            "numbers, strings, bools, None, lists, tuples, dicts, arrays and tensors)"
        ) from None


def _array(arrays: list[np.ndarray], i: Any) -> np.ndarray:
    if type(i) is not int or not 0 <= i < len(arrays):
        raise ValueError(f"buffer {i!r} of {len(arrays)}")
    return arrays[i]


def _decode(x: Any, arrays: list[np.ndarray], depth: int) -> Any:
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    if isinstance(x, list):
        return [_decode(v, arrays, depth + 1) for v in x]
    if not isinstance(x, dict):
        raise ValueError(f"a {type(x).__name__} in the body")
    tag = x.get("@")
    if tag == "tu" and isinstance(x.get("v"), list):
        return tuple(_decode(v, arrays, depth + 1) for v in x["v"])
    if tag == "d":
        keys, values = x.get("k"), x.get("v")
        if not (isinstance(keys, list) and isinstance(values, list) and len(keys) == len(values)):
            raise ValueError("a dict's keys and values differ")
        if not all(k is None or isinstance(k, bool | int | float | str) for k in keys):
            raise ValueError("a dict key that is not a number or a string")
        return dict(zip(keys, (_decode(v, arrays, depth + 1) for v in values)))
    if tag == "nd":
        return _array(arrays, x.get("i"))
    if tag == "t":
        dtype = x.get("dt")
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"tensor dtype {dtype!r} is not one of {sorted(TORCH_DTYPES)}")
        return _from_numpy(dtype, np.array(_array(arrays, x.get("i")), copy=True))
    if tag == "ns":
        a = _array(arrays, x.get("i"))
        if a.ndim:
            raise ValueError("a numpy scalar of more than one value")
        return a[()]
    if tag == "b":
        return _array(arrays, x.get("i")).tobytes()
    if tag == "L":
        path, inode, dtype, shape, field = (x.get(k) for k in ("path", "inode", "dtype", "shape", "field"))
        if not (
            isinstance(path, str)
            and type(inode) is int
            and dtype in TORCH_DTYPES
            and isinstance(shape, list)
            and all(type(d) is int and d >= 0 for d in shape)
            and isinstance(field, str)
        ):
            raise ValueError("a malformed layout")
        return Layout(path, inode, dtype, tuple(shape), field)
    raise ValueError(f"unknown tag {tag!r}")


# -- frames: [mac, header, *buffers] ----------------------------------------------------------------


def _mac(key: bytes, parts: Sequence[Any]) -> bytes:
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
    return [_mac(key, [head, *arrays]), head, *arrays]


def _open(key: bytes, frames: Sequence[memoryview]) -> dict[str, Any]:
    """The header of a signed frame; :class:`_Refused` when the MAC is missing or wrong (checked before
    anything else is read) or the header is not this protocol's JSON object."""
    if len(frames) < 2 or frames[0].nbytes != MAC_BYTES:
        raise _Refused("unsigned", f"{len(frames)} frame(s), no {MAC_BYTES}-byte MAC first")
    if not hmac.compare_digest(bytes(frames[0]), _mac(key, frames[1:])):
        raise _Refused("forged", "the MAC does not match")
    try:
        header = json.loads(bytes(frames[1]))
    except (ValueError, RecursionError) as e:
        raise _Refused("malformed", f"the header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict) or header.get("v") != PROTOCOL:
        raise _Refused("malformed", f"the header is not a version {PROTOCOL} object")
    return header


def _session(header: dict[str, Any], direction: str) -> tuple[str, int, float, int]:
    """``(session, sequence number, timestamp, call id)`` of a header, each checked for its type."""
    sid, seq, ts, cid = (header.get(k) for k in ("s", "n", "t", "id"))
    if (
        header.get("d") != direction
        or not (isinstance(sid, str) and 1 <= len(sid) <= 64)
        or type(seq) is not int
        or type(ts) not in (int, float)
        or not math.isfinite(ts)
        or type(cid) is not int
    ):
        raise _Refused("malformed", f"not a {'request' if direction == 'q' else 'reply'} header")
    return sid, seq, float(ts), cid


def _arrays(header: dict[str, Any], frames: Sequence[memoryview]) -> list[np.ndarray]:
    """The buffers as read-only arrays (views of the frames), each declared dtype checked against
    :data:`WIRE_DTYPES` and each declared size against the bytes that came: nothing is allocated from
    a declared size."""
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


def _buffers(frames: Sequence[Any]) -> list[memoryview]:
    return [f.buffer if isinstance(f, zmq.Frame) else memoryview(f) for f in frames]


def _error_body(e: BaseException) -> list[str]:
    """An exception as ``[class name, message]``: its class if in :data:`ERRORS`, else its nearest
    ancestor there (the message names the class), else :class:`StorageBackendError`."""
    name, message = StorageBackendError.__name__, f"{type(e).__name__}: {e}"
    for cls in type(e).__mro__:
        if ERRORS.get(cls.__name__) is cls:
            name = cls.__name__
            message = str(e) if cls is type(e) else message
            break
    return [name, message[:MAX_MESSAGE_CHARS]]


def _error_of(body: Any) -> Exception:
    if not (isinstance(body, list) and len(body) == 2 and all(isinstance(x, str) for x in body)):
        return StorageBackendError(f"the store answered with a malformed error: {str(body)[:200]}")
    return ERRORS.get(body[0], StorageBackendError)(body[1][:MAX_MESSAGE_CHARS])


class _Warnings:
    """Rate-limited warnings of refused frames: at most one line per kind every ``every_s`` seconds."""

    def __init__(self, where: str, every_s: float = WARN_EVERY_S) -> None:
        self.where, self.every_s = where, every_s
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
        logger.warning(
            "conduit tq store data port %s: refused a frame (%s): %s%s", self.where, kind, detail, more
        )


class _Sessions:
    """The store's view of its clients' sessions: the last sequence number and newest timestamp of each,
    at most ``limit`` of them; one whose newest timestamp is older than ``window_s`` is forgotten."""

    def __init__(self, window_s: float = FRESH_S, limit: int = MAX_SESSIONS) -> None:
        self.window_s, self.limit = window_s, limit
        self.seen: dict[str, list[float]] = {}
        self.swept = 0.0

    def admit(self, sid: str, seq: int, ts: float, now: float) -> None:
        """Record a frame of session ``sid``; :class:`_Refused` if stale, replayed or reordered."""
        if abs(now - ts) > self.window_s:
            raise _Refused(
                "replayed", f"timestamp {ts:.3f} is {now - ts:+.1f}s from now (window {self.window_s:g}s)"
            )
        if now - self.swept > 1.0:
            self.seen = {s: e for s, e in self.seen.items() if now - e[1] <= self.window_s}
            self.swept = now
        entry = self.seen.get(sid)
        if entry is None:
            if len(self.seen) >= self.limit:
                raise _Refused("replayed", f"{self.limit} sessions are open already")
            self.seen[sid] = [seq, ts]
            return
        if seq <= entry[0]:
            raise _Refused("replayed", f"sequence number {seq} after {int(entry[0])} in session {sid[:8]}")
        entry[0], entry[1] = seq, max(entry[1], ts)


class StorePort:
    """The server side, in the storage actor: a thread answering ``METHODS`` of ``store`` under ``lock``,
    on ``host`` (see the module's docstring for the address rule), to clients holding ``key``."""

    def __init__(self, store: Any, lock: threading.Lock, host: str, key: bytes | None = None) -> None:
        self.store, self.lock = store, lock
        self.key = key if key is not None else os.urandom(KEY_BYTES)
        self.sessions = _Sessions()
        self.warnings = _Warnings(f"of {type(store).__name__}")
        self._seq = itertools.count(1)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="conduit-tq-port", daemon=True)
        self.thread.start()

    @property
    def refused(self) -> Counter[str]:
        """Frames refused so far, per kind (unsigned, forged, replayed, malformed)."""
        return self.warnings.counts

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(200):
                    continue
                ident, *frames = self.socket.recv_multipart(copy=False)
                reply = self._answer(frames)
                if reply is not None:
                    self.socket.send_multipart([ident, *reply], copy=False)
            except Exception as e:  # noqa: BLE001  (no frame ends the port)
                if self._stop.is_set():
                    break
                self.warnings.warn("unserved", f"{type(e).__name__}: {e}")

    def _answer(self, frames: Sequence[Any]) -> list[Any] | None:
        """The reply frames to a request, or None (refused: nothing ran, nothing is answered)."""
        bufs = _buffers(frames)
        try:
            header = _open(self.key, bufs)
            sid, seq, ts, call_id = _session(header, "q")
            self.sessions.admit(sid, seq, ts, time.time())
        except _Refused as e:
            self.warnings.warn(e.kind, e.detail)
            return None
        method = header.get("m")
        try:
            if not isinstance(method, str) or method not in METHODS:
                raise ValueError(f"the data port does not answer {str(method)[:64]!r}")
            args = _decode(header.get("b"), _arrays(header, bufs[2:]), 0)
            if not isinstance(args, list) or len(args) != len(ARGS[method]):
                raise ValueError(f"{method} takes {len(ARGS[method])} arguments")
        except Exception as e:  # noqa: BLE001  (anything a malformed body raises)
            self.warnings.warn("malformed", f"{type(e).__name__}: {e}")
            return self._reply(
                sid, call_id, False, [StorageBackendError.__name__, f"malformed request refused: {e}"]
            )
        try:
            with self.lock:
                value = getattr(self.store, method)(*args)
        except Exception as e:  # noqa: BLE001  (the caller re-raises it)
            return self._reply(sid, call_id, False, _error_body(e))
        try:
            return self._reply(sid, call_id, True, value, method)
        except StorageBackendError as e:
            return self._reply(sid, call_id, False, _error_body(e))

    def _reply(self, sid: str, call_id: int, ok: bool, value: Any, method: str = "") -> list[Any]:
        body, arrays = encode(method, value, answer=True) if ok else (value, [])
        header = {"d": "r", "s": sid, "n": next(self._seq), "t": time.time(), "id": call_id, "ok": ok}
        return seal(self.key, header, body, arrays)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2.0)
        self.socket.close()
        self.context.term()


class PortClient:
    """One process's connection to one store's port (use from a single event loop); ``key`` is the
    store's secret (from its actor, through Ray)."""

    def __init__(self, address: str, key: bytes) -> None:
        self.address, self.key = address, key
        self.session = os.urandom(16).hex()
        self._seq = itertools.count(1)
        self.last_reply = 0  # the store's sequence number of the newest reply taken
        self.warnings = _Warnings(f"client of {address}")
        self.context = zmq.asyncio.Context.instance()
        self.socket: zmq.asyncio.Socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.reader: asyncio.Task | None = None

    def _connect(self) -> zmq.asyncio.Socket:
        loop = asyncio.get_running_loop()
        if self.socket is None or self.loop is not loop:
            if self.socket is not None:
                self.socket.close(linger=0)
            self.socket = self.context.socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.connect(self.address)
            self.loop = loop
            self.reader = loop.create_task(self._read(self.socket))
            # the reader lives as long as its loop: a loop closed under it (TQ's client shuts down
            # without awaiting its storage manager) is the normal end, not a lost task worth a log line
            self.reader._log_destroy_pending = False  # type: ignore[attr-defined]
        return self.socket

    def _reply_of(self, bufs: list[memoryview]) -> dict[str, Any]:
        header = _open(self.key, bufs)
        sid, seq, ts, _ = _session(header, "r")
        if sid != self.session:
            raise _Refused("replayed", "a reply to another session")
        if seq <= self.last_reply or abs(time.time() - ts) > FRESH_S:
            raise _Refused("replayed", f"reply number {seq} after {self.last_reply}, or stale")
        self.last_reply = seq
        return header

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart(copy=False)
            bufs = _buffers(frames)
            try:
                header = self._reply_of(bufs)
            except _Refused as e:  # the call waiting for it times out, naming the store
                self.warnings.warn(e.kind, e.detail)
                continue
            future = self.pending.pop(header["id"], None)
            if future is None or future.done():
                continue
            try:
                body = _decode(header.get("b"), _arrays(header, bufs[2:]), 0)
            except Exception as e:  # noqa: BLE001
                self.warnings.warn("malformed", f"{type(e).__name__}: {e}")
                future.set_exception(StorageBackendError(f"a malformed answer from {self.address}: {e}"))
                continue
            if header.get("ok") is True:
                future.set_result(body)
            else:
                future.set_exception(_error_of(body))

    async def _send(self, socket: zmq.asyncio.Socket, frames: list[Any]) -> None:
        await socket.send_multipart(frames, copy=False)

    async def call(self, method: str, args: tuple, timeout_s: float,
                   alive: Callable[[], Awaitable[None]]) -> Any:  # fmt: skip
        """``store.method(*args)`` on the store; its exception re-raised here. Arguments that are not
        data raise :class:`StorageBackendError` here, before anything is sent. Every
        ``LIVENESS_SLICE_S`` without an answer ``alive()`` is awaited (it raises if the store is gone);
        after ``timeout_s`` :class:`TimeoutError`."""
        body, arrays = encode(method, args)
        socket = self._connect()
        call_id = next(self.ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[call_id] = future
        try:
            header = {
                "d": "q",
                "s": self.session,
                "n": next(self._seq),
                "t": time.time(),
                "id": call_id,
                "m": method,
            }
            await self._send(socket, seal(self.key, header, body, arrays))
            waited = 0.0
            while True:
                step = min(LIVENESS_SLICE_S, timeout_s - waited)
                if step <= 0:
                    raise TimeoutError(f"{method} unanswered after {timeout_s:g}s")
                try:
                    return await asyncio.wait_for(asyncio.shield(future), step)
                except TimeoutError:
                    waited += step
                    await alive()
        finally:
            self.pending.pop(call_id, None)

    def close(self) -> None:
        """Stop reading and close the socket (from any thread)."""
        loop, reader, socket = self.loop, self.reader, self.socket
        self.reader = self.socket = None
        if reader is None or loop is None or loop.is_closed():
            return

        def stop() -> None:
            reader.cancel()
            if socket is not None:
                socket.close(linger=0)

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or not loop.is_running():
            stop()
        else:
            loop.call_soon_threadsafe(stop)
