"""A storage actor's data port: its store's calls over one ZMQ socket instead of Ray actor calls.

A Ray actor call costs ~1.3 ms here even when empty, and its arguments travel through Ray's object
stores (between two nodes: a copy into the sender's store, chunked pushes into the receiver's, a
copy out). verl's agent loop puts one trajectory at a time, and every same-node put in place is two
calls (plan, commit). The data port answers the same :class:`~conduit_verl.tq_store.store.NodeStore`
calls over a ZMQ ROUTER socket bound to the node's address (TransferQueue's own SimpleStorage talks
to its units the same way): requests and replies are pickled with protocol 5, numpy payloads as
out-of-band frames sent without a copy. The Ray actor stays the store's owner (placement, life,
stats); its methods and the port share one lock.

:class:`PortClient` is a process's connection to one store: a DEALER socket on the caller's event
loop, several calls in flight, each answered by id. A store that does not answer within a slice is
asked through Ray whether its actor is alive, so a dead store is reported as dead (naming the keys)
rather than after the whole timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

logger = logging.getLogger(__name__)

#: the store methods the port answers (everything a TQ client calls)
METHODS = frozenset({"put", "get", "read_plan", "write_plan", "commit", "abandon", "clear"})
LIVENESS_SLICE_S = 2.0  # a call waits this long before asking Ray whether the store is alive


def _dump(obj: Any) -> list[Any]:
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return [head, *(b.raw() for b in buffers)]


def _load(frames: list[zmq.Frame]) -> Any:
    return pickle.loads(frames[0].buffer, buffers=[f.buffer for f in frames[1:]])


class StorePort:
    """The server side, in the storage actor: a thread answering ``METHODS`` of ``store`` under ``lock``."""

    def __init__(self, store: Any, lock: threading.Lock, host: str) -> None:
        self.store, self.lock = store, lock
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="conduit-tq-port", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(200):
                continue
            ident, *frames = self.socket.recv_multipart(copy=False)
            self.socket.send_multipart([ident, *_dump(self._answer(frames))], copy=False)

    def _answer(self, frames: list[Any]) -> tuple[int, bool, Any]:
        call_id = -1
        try:
            call_id, method, args = _load(frames)
            if method not in METHODS:
                raise ValueError(f"the data port does not answer {method!r}")
            with self.lock:
                return call_id, True, getattr(self.store, method)(*args)
        except Exception as e:  # noqa: BLE001  (the caller re-raises it)
            try:
                pickle.dumps(e)
            except Exception:  # noqa: BLE001
                e = RuntimeError(f"{type(e).__name__}: {e}")
            return call_id, False, e

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2.0)
        self.socket.close()
        self.context.term()


class PortClient:
    """One process's connection to one store's port (use from a single event loop)."""

    def __init__(self, address: str) -> None:
        self.address = address
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

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        while True:
            frames = await socket.recv_multipart(copy=False)
            try:
                call_id, ok, value = _load(frames)
            except Exception:  # noqa: BLE001  (the call waiting for it times out, naming the store)
                logger.exception("conduit tq store: unreadable reply from %s", self.address)
                continue
            future = self.pending.pop(call_id, None)
            if future is not None and not future.done():
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    async def call(self, method: str, args: tuple, timeout_s: float,
                   alive: Callable[[], Awaitable[None]]) -> Any:  # fmt: skip
        """``store.method(*args)`` on the store; its exception re-raised here. Every
        ``LIVENESS_SLICE_S`` without an answer ``alive()`` is awaited (it raises if the store is gone);
        after ``timeout_s`` :class:`TimeoutError`."""
        socket = self._connect()
        call_id = next(self.ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[call_id] = future
        try:
            await socket.send_multipart(_dump((call_id, method, args)), copy=False)
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
