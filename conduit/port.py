"""A data port: a storage's methods served over one signed ZMQ socket (needs ``pyzmq``).

A Ray actor call costs ~1.3 ms even when empty and its arguments travel through Ray's object stores;
a storage that owns a node's data (e.g. the TransferQueue backend's store) answers its data calls on a
port instead. :class:`DataPort` (one ZMQ ROUTER, in the storage's process) runs the methods its
:class:`Protocol` names on ``target`` under the storage's lock; :class:`PortClient` (one DEALER per
process and storage, on the caller's event loop) sends calls, several in flight, each answered by id.

The wire carries data, never code (:mod:`conduit.wire`): every frame is signed with the port's 32-byte
key, which the port draws at start (``os.urandom``) and its owner hands out through a trusted channel
(e.g. Ray). A refused frame (bad or missing MAC, replay, stale, malformed header) runs nothing and gets
no answer; an authentic request that does not hold up (unknown method, a dtype outside the list, sizes
that disagree, a malformed body) runs nothing and is answered with the protocol's error class. Each is
logged as a warning, at most one line per kind every ``WARN_EVERY_S``; the serving thread survives
anything a frame holds. Errors of the storage travel as a class name from :attr:`Protocol.errors` and a
message, re-raised at the caller as that class (else :attr:`Protocol.error`). A call unanswered for
:data:`LIVENESS_SLICE_S` asks ``alive()`` (which raises if the storage is gone): a dead storage is
reported as dead rather than after the whole timeout. Bind to loopback unless another node must reach it.

ZMQ receives a whole message before the port can check its MAC, so the port caps each frame at
``max_frame_bytes`` (:data:`MAX_FRAME_BYTES`, 1 GiB, by default) with ``ZMQ_MAXMSGSIZE``: a larger frame is
refused unread and its sender's connection dropped (signed or not: the sender's call goes unanswered). A
frame is one array of a call (a field's values for the call's keys, the keys, the lengths) or its header,
so the cap is the largest field one call may carry: nothing in a keyed store bounds a field (its tier
budgets are optional, count bytes and not rows, and leave object fields out), so the bound is the port's.
:class:`PortClient` refuses to send a larger frame, naming its size and the cap: split the call. ZMQ does
not bound how many frames one message holds, so a stranger can still make the port hold several frames
of up to the cap at once.

Replays are refused within a port's life: its :class:`~conduit.wire.Sessions` start empty, so with a key
passed in explicitly and reused after a restart, a frame recorded before the restart is accepted again
while it is fresh (:data:`~conduit.wire.FRESH_S`). The port's owners never pass one (the TransferQueue
backend's storage actors draw a new key at every start), so a restarted port refuses every earlier frame.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from conduit.errors import ConduitError, ConfigError
from conduit.wire import (
    FRESH_S,
    Encoder,
    NotData,
    Refused,
    Sessions,
    Warnings,
    arrays_of,
    decode,
    open_frame,
    seal,
    session_of,
)

logger = logging.getLogger(__name__)

KEY_BYTES = 32
#: the largest frame a data port receives (see the module docstring); a larger one is refused unread
MAX_FRAME_BYTES = 1 << 30
MAX_MESSAGE_CHARS = 4000  # of an error's message
LIVENESS_SLICE_S = 2.0  # a call waits this long before asking whether the storage is alive


@dataclass(frozen=True)
class Protocol:
    """What a port serves: per method the names of its arguments; ``errors``, the classes a storage's
    error travels as (by name); ``error``, the class of the port's own refusals and of any other error;
    ``records``, the dataclasses arguments and answers may hold (:class:`conduit.wire.Encoder`)."""

    methods: Mapping[str, tuple[str, ...]]
    errors: tuple[type[Exception], ...] = ()
    error: type[Exception] = ConduitError
    records: tuple[type, ...] = ()

    def encode(self, method: str, args: Any, answer: bool = False) -> tuple[Any, list[np.ndarray]]:
        """``args`` of ``method`` (or its ``answer``) as a JSON tree and its buffers; :attr:`error` naming
        the argument (and, for a dict of fields, the field) and the type of anything that is not data."""
        enc = Encoder(self.records)
        try:
            if answer:
                return enc.item(args, "answer", 0), enc.arrays
            return [enc.item(a, i, 0) for i, a in enumerate(args)], enc.arrays
        except NotData as e:
            head, *rest = e.path
            names = self.methods.get(method, ())
            where = names[head] if isinstance(head, int) and head < len(names) else str(head)
            field = f"field {rest[0]!r}: " if rest and isinstance(rest[0], str) else ""
            at = where + "".join(f"[{k!r}]" for k in rest)
            raise self.error(
                f"{field}{method} {at} holds {e.what}, which the data port does not carry (data only: "
                "numbers, strings, bools, None, lists, tuples, dicts, arrays and tensors)"
            ) from None

    def error_body(self, e: BaseException) -> list[str]:
        """An exception as ``[class name, message]``: its class if in :attr:`errors`, else its nearest
        ancestor there (the message names the class), else :attr:`error`."""
        name, message = self.error.__name__, f"{type(e).__name__}: {e}"
        known = {c.__name__: c for c in (self.error, *self.errors)}
        for cls in type(e).__mro__:
            if known.get(cls.__name__) is cls:
                name = cls.__name__
                message = str(e) if cls is type(e) else message
                break
        return [name, message[:MAX_MESSAGE_CHARS]]

    def error_of(self, body: Any) -> Exception:
        """The exception an error body names (:attr:`error` for a malformed or unknown one)."""
        if not (isinstance(body, list) and len(body) == 2 and all(isinstance(x, str) for x in body)):
            return self.error(f"the storage answered with a malformed error: {str(body)[:200]}")
        known = {c.__name__: c for c in (self.error, *self.errors)}
        return known.get(body[0], self.error)(body[1][:MAX_MESSAGE_CHARS])


def _buffers(frames: Sequence[Any]) -> list[memoryview]:
    return [f.buffer if isinstance(f, zmq.Frame) else memoryview(f) for f in frames]


def _frame_bound(max_frame_bytes: int) -> int:
    if isinstance(max_frame_bytes, bool) or not isinstance(max_frame_bytes, int) or max_frame_bytes < 1024:
        raise ConfigError(f"max_frame_bytes must be an int >= 1024 (bytes), got {max_frame_bytes!r}")
    return max_frame_bytes


class DataPort:
    """The server side: a thread answering ``protocol``'s methods of ``target`` under ``lock``, on a random
    TCP port of ``host``, to clients holding :attr:`key`; frames over ``max_frame_bytes`` are refused
    unread. ``key``: drawn at start when not given (an explicit key reused after a restart lets frames
    recorded before it be replayed while fresh: see the module docstring)."""

    def __init__(self, target: Any, protocol: Protocol, lock: threading.Lock, host: str,
                 key: bytes | None = None, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:  # fmt: skip
        self.target, self.protocol, self.lock = target, protocol, lock
        self.key = key if key is not None else os.urandom(KEY_BYTES)
        self.max_frame_bytes = _frame_bound(max_frame_bytes)
        self.sessions = Sessions()
        self.warnings = Warnings(logger, f"data port of {type(target).__name__}")
        self._seq = itertools.count(1)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)  # before a byte of a frame is kept
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="conduit-data-port", daemon=True)
        self.thread.start()

    @property
    def refused(self) -> Counter[str]:
        """Frames refused so far, per kind (unsigned, forged, replayed, malformed, unserved)."""
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
            header = open_frame(self.key, bufs)
            sid, seq, ts, call_id = session_of(header, "q")
            self.sessions.admit(sid, seq, ts, time.time())
        except Refused as e:
            self.warnings.warn(e.kind, e.detail)
            return None
        method, names = header.get("m"), self.protocol.methods
        try:
            if not isinstance(method, str) or method not in names:
                raise ValueError(f"the data port does not answer {str(method)[:64]!r}")
            args = decode(header.get("b"), arrays_of(header, bufs[2:]), self.protocol.records)
            if not isinstance(args, list) or len(args) != len(names[method]):
                raise ValueError(f"{method} takes {len(names[method])} arguments")
        except Exception as e:  # noqa: BLE001  (anything a malformed body raises)
            self.warnings.warn("malformed", f"{type(e).__name__}: {e}")
            return self._reply(
                sid, call_id, False, [self.protocol.error.__name__, f"malformed request refused: {e}"]
            )
        try:
            with self.lock:
                value = getattr(self.target, method)(*args)
        except Exception as e:  # noqa: BLE001  (the caller re-raises it)
            return self._reply(sid, call_id, False, self.protocol.error_body(e))
        try:
            return self._reply(sid, call_id, True, value, method)
        except self.protocol.error as e:
            return self._reply(sid, call_id, False, self.protocol.error_body(e))

    def _reply(self, sid: str, call_id: int, ok: bool, value: Any, method: str = "") -> list[Any]:
        body, arrays = self.protocol.encode(method, value, answer=True) if ok else (value, [])
        header = {"d": "r", "s": sid, "n": next(self._seq), "t": time.time(), "id": call_id, "ok": ok}
        return seal(self.key, header, body, arrays)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2.0)
        self.socket.close()
        self.context.term()


class PortClient:
    """One process's connection to one :class:`DataPort` (use from a single event loop); ``key`` is the
    port's secret; ``max_frame_bytes`` the port's (a call with a larger frame is refused here)."""

    def __init__(
        self, address: str, key: bytes, protocol: Protocol, max_frame_bytes: int = MAX_FRAME_BYTES
    ) -> None:
        self.address, self.key, self.protocol = address, key, protocol
        self.max_frame_bytes = _frame_bound(max_frame_bytes)
        self.session = os.urandom(16).hex()
        self._seq = itertools.count(1)
        self.last_reply = 0  # the port's sequence number of the newest reply taken
        self.warnings = Warnings(logger, f"data port client of {address}")
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
            # the reader lives as long as its loop: a loop closed under it (a client that shuts down
            # without awaiting its calls) is the normal end, not a lost task worth a log line
            self.reader._log_destroy_pending = False  # type: ignore[attr-defined]
        return self.socket

    def _reply_of(self, bufs: list[memoryview]) -> dict[str, Any]:
        header = open_frame(self.key, bufs)
        sid, seq, ts, _ = session_of(header, "r")
        if sid != self.session:
            raise Refused("replayed", "a reply to another session")
        if seq <= self.last_reply or abs(time.time() - ts) > FRESH_S:
            raise Refused("replayed", f"reply number {seq} after {self.last_reply}, or stale")
        self.last_reply = seq
        return header

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart(copy=False)
            bufs = _buffers(frames)
            try:
                header = self._reply_of(bufs)
            except Refused as e:  # the call waiting for it times out, naming the storage
                self.warnings.warn(e.kind, e.detail)
                continue
            future = self.pending.pop(header["id"], None)
            if future is None or future.done():
                continue
            try:
                body = decode(header.get("b"), arrays_of(header, bufs[2:]), self.protocol.records)
            except Exception as e:  # noqa: BLE001
                self.warnings.warn("malformed", f"{type(e).__name__}: {e}")
                future.set_exception(self.protocol.error(f"a malformed answer from {self.address}: {e}"))
                continue
            if header.get("ok") is True:
                future.set_result(body)
            else:
                future.set_exception(self.protocol.error_of(body))

    async def _send(self, socket: zmq.asyncio.Socket, frames: list[Any]) -> None:
        await socket.send_multipart(frames, copy=False)

    async def call(self, method: str, args: tuple, timeout_s: float,
                   alive: Callable[[], Awaitable[None]]) -> Any:  # fmt: skip
        """``target.method(*args)`` on the port's storage; its exception re-raised here. Arguments that
        are not data, or a frame over ``max_frame_bytes``, raise the protocol's error here, before anything
        is sent. Every :data:`LIVENESS_SLICE_S` without an answer ``alive()`` is awaited (it raises if the
        storage is gone); after ``timeout_s`` :class:`TimeoutError`."""
        body, arrays = self.protocol.encode(method, args)
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
            frames = seal(self.key, header, body, arrays)
            largest = max(memoryview(f).nbytes for f in frames)
            if largest > self.max_frame_bytes:
                raise self.protocol.error(
                    f"{method}: a frame of {largest} bytes; the data port at {self.address} receives at most "
                    f"{self.max_frame_bytes} bytes per frame (one field of a call, or its header): split the call"
                )
            await self._send(socket, frames)
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
