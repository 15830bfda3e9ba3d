"""The TQ store's data port carries data, never code, and only from holders of its key (issue 26, item 1).

A crafted pickle, an unsigned, forged or replayed frame, a dtype outside the list and random malformed
frames each run nothing, change nothing, are logged, and leave the port answering its clients.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import threading
import time
import tracemalloc

import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue")
zmq = pytest.importorskip("zmq")
from conduit_verl.errors import StorageBackendError  # noqa: E402
from conduit_verl.tq_store.columns import column_of  # noqa: E402
from conduit_verl.tq_store.store import PROTOCOL, NodeStore  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from port_calls import call, never_dead, raw_socket  # noqa: E402

from conduit import wire  # noqa: E402
from conduit.buffer.columns import to_wire  # noqa: E402
from conduit.port import DataPort, PortClient  # noqa: E402

LOGGER = "conduit.port"


class Evil:
    """Unpickling this runs ``exec``: it creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('ran')",))


def scalar_wire(values: list[float]) -> tuple:
    return to_wire(column_of("v", torch.tensor(values)))


@pytest.fixture
def port():
    store = NodeStore(default_tier="shm")
    store.put(np.array([0, 1]), {"v": scalar_wire([1.0, 2.0])})
    server = DataPort(store, PROTOCOL, threading.Lock(), "127.0.0.1")
    yield server
    server.close()
    store.close()


@pytest.fixture
def raw(port):
    with raw_socket(port.address) as sock:
        yield sock


def stored(store: NodeStore) -> list[float]:
    """Field ``v`` of keys 0 and 1, read from the store's array (not through the port, counting nothing)."""
    return store.fields["v"].read(torch.tensor([0, 1])).tolist()


def request(key: bytes, method: str, args: tuple, session: str | None = None, seq: int = 1, **over) -> list:
    """A request as a client signs it (``over``: header fields replaced)."""
    body, arrays = PROTOCOL.encode(method, args)
    header = {
        "d": "q",
        "s": session or os.urandom(16).hex(),
        "n": seq,
        "t": time.time(),
        "id": seq,
        "m": method,
    }
    return wire.seal(key, {**header, **over}, body, arrays)


def forge(key: bytes, header: bytes, buffers: list[bytes]) -> list[bytes]:
    """Any header bytes and buffers under a valid MAC."""
    return [wire.mac(key, [header, *buffers]), header, *buffers]


def probe(sock, key: bytes, refusals: int = 0) -> dict:
    """A signed ``get`` on ``sock``; the header of its reply, after exactly ``refusals`` error replies
    (the port answers a connection's requests in order, so every frame sent before has been handled)."""
    sock.send_multipart(request(key, "get", (np.array([0]), ["v"]), seq=7, id=4242))
    for _ in range(refusals):
        assert sock.poll(5000), "the port stopped answering"
        header = json.loads(sock.recv_multipart()[1])
        assert header["ok"] is False and header["b"][0] == "StorageBackendError", header
    assert sock.poll(5000), "the port stopped answering"
    header = json.loads(sock.recv_multipart()[1])
    assert header["id"] == 4242 and header["ok"] is True, header
    return header


def test_a_crafted_pickle_runs_nothing_and_is_logged(port, raw, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    target = tmp_path / "ran"
    evil = pickle.dumps((1, "clear", (Evil(str(target)),)), protocol=5)
    raw.send_multipart([evil])  # what the old port unpickled first thing
    raw.send_multipart([bytes(32), evil])  # behind a made-up MAC
    raw.poll(1000)
    assert not target.exists(), "a frame from the wire ran code in the store"
    probe(raw, port.key)
    assert not target.exists()
    assert port.refused["unsigned"] == 1 and port.refused["forged"] == 1
    assert "refused a frame (unsigned)" in caplog.text and "refused a frame (forged)" in caplog.text
    assert stored(port.target) == [1.0, 2.0]


def test_an_unauthenticated_clear_does_not_clear(port, raw):
    raw.send_multipart([pickle.dumps((1, "clear", (np.array([0, 1]),)), protocol=5)])
    raw.poll(1000)
    assert stored(port.target) == [1.0, 2.0], "an unauthenticated clear cleared"
    other_key = os.urandom(32)  # a store's key is its own: another's does not open it
    raw.send_multipart(request(other_key, "clear", (np.array([0, 1]),)))
    probe(raw, port.key)
    assert stored(port.target) == [1.0, 2.0]
    assert port.refused["forged"] == 1
    assert call(port, "get", np.array([1]), ["v"])["v"][2].tolist() == [2.0]


def test_unsigned_and_replayed_frames_are_refused_and_logged(port, raw, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    sent: list[list[bytes]] = []

    class Recording(PortClient):
        async def _send(self, socket, frames):
            sent.append([bytes(memoryview(f)) for f in frames])
            await super()._send(socket, frames)

    async def legit() -> None:
        client = Recording(port.address, port.key, PROTOCOL)
        await client.call("put", (np.array([5]), {"v": scalar_wire([9.0])}), 10, never_dead)
        await client.call("clear", (np.array([5]),), 10, never_dead)
        client.close()

    asyncio.run(legit())
    put_frames, clear_frames = sent
    raw.send_multipart(put_frames)  # the captured put again: it would store key 5 again
    raw.send_multipart(put_frames[1:])  # its header and buffers without the MAC
    raw.send_multipart([bytes(32), *put_frames[1:]])  # with a zero MAC
    raw.send_multipart(clear_frames)  # the captured clear: it would clear key 5 again
    probe(raw, port.key)  # the first reply on this connection is the probe's: none of the above answered
    assert port.target.fields["v"].missing(torch.tensor([5])) == [5], "a replayed put stored its data again"
    assert port.refused["replayed"] == 2 and port.refused["unsigned"] == 1 and port.refused["forged"] == 1
    assert "refused a frame (replayed)" in caplog.text and "refused a frame (unsigned)" in caplog.text
    assert stored(port.target) == [1.0, 2.0]


def test_a_reordered_or_stale_frame_is_refused(port, raw):
    session = os.urandom(16).hex()
    later = request(port.key, "put", (np.array([6]), {"v": scalar_wire([6.0])}), session, seq=5)
    earlier = request(port.key, "put", (np.array([7]), {"v": scalar_wire([7.0])}), session, seq=4)
    stale = request(port.key, "put", (np.array([8]), {"v": scalar_wire([8.0])}), t=time.time() - 3600)
    for frames in (later, earlier, stale):
        raw.send_multipart(frames)
    assert raw.poll(5000)
    assert json.loads(raw.recv_multipart()[1])["ok"] is True  # seq 5: taken
    probe(raw, port.key)  # seq 4 after 5, and the hour-old one: no answer
    assert port.target.fields["v"].missing(torch.tensor([6, 7, 8])) == [7, 8]
    assert port.refused["replayed"] == 2


def test_dtypes_outside_the_list_are_refused_and_nothing_is_stored(port, raw):
    # a buffer declaring a dtype that is not on the list, under a valid MAC
    body, arrays = PROTOCOL.encode("put", (np.array([3]), {"v": scalar_wire([3.0])}))
    for dtype in ("object", "V8", ">i8", "O"):
        header = {"v": 1, "d": "q", "s": os.urandom(16).hex(), "n": 1, "t": time.time(), "id": 1, "m": "put",
                  "a": [[dtype, list(a.shape), a.nbytes] for a in arrays], "b": body}  # fmt: skip
        raw.send_multipart(forge(port.key, json.dumps(header).encode(), [a.tobytes() for a in arrays]))
        assert raw.poll(5000)
        reply = json.loads(raw.recv_multipart()[1])
        assert reply["ok"] is False and f"dtype {dtype!r} is not one of" in reply["b"][1], reply
    assert port.refused["malformed"] == 4
    # a column's tensor dtype outside the list (a name torch would resolve to a function)
    for name in ("load", "torch.load", "complex64"):
        with pytest.raises(StorageBackendError, match=f"dtype {name!r} is not one of"):
            call(port, "put", np.array([3]), {"v": ("scalar", name, np.zeros(1, dtype=np.float32))})
    with pytest.raises(StorageBackendError, match="dtype 'load' is not one of"):
        call(port, "write_plan", np.array([3]), {"v": ("scalar", "load", (), 0)}, True)
    assert port.target.fields["v"].missing(torch.tensor([3])) == [3]
    assert stored(port.target) == [1.0, 2.0]
    probe(raw, port.key)


def test_what_is_not_data_is_refused_by_the_writer_naming_field_and_type(port):
    class Opaque:
        pass

    with pytest.raises(
        StorageBackendError, match=r"field 'uid': put wires\['uid'\]\[1\]\[1\] holds a .*Opaque"
    ):
        call(port, "put", np.array([4, 5]), {"uid": ("object", ["a", Opaque()])})
    with pytest.raises(StorageBackendError, match="field 'uid'.*dtype \\|O"):
        call(port, "put", np.array([4]), {"uid": ("object", [np.array([object()])])})
    assert "uid" not in port.target.fields
    # what verl's object columns hold does travel: strings, numbers, dicts, lists, tensors (strided nested)
    items = [
        "text",
        {"k": [1, 2.5, None, True], "t": torch.arange(3)},
        (1, "x"),
        torch.ones(2, 2),
        b"\x00\x01",
    ]
    call(port, "put", np.arange(10, 15), {"o": ("object", items)})
    back = call(port, "get", np.arange(10, 15), ["o"])["o"][1]
    assert back[0] == "text" and back[2] == (1, "x") and back[4] == b"\x00\x01"
    assert back[1]["k"] == [1, 2.5, None, True] and back[1]["t"].tolist() == [0, 1, 2]
    assert torch.equal(back[3], torch.ones(2, 2))


def test_a_store_error_is_raised_at_the_caller_as_its_class_never_unpickled(port):
    with pytest.raises(StorageBackendError, match=r"global index -1 is outside"):
        call(port, "get", np.array([-1]), ["v"])
    assert PROTOCOL.error_body(ValueError("x")) == ["StorageBackendError", "ValueError: x"]
    assert isinstance(PROTOCOL.error_of(["NotAClass", "m"]), StorageBackendError)


def test_a_client_refuses_an_unsigned_reply_and_runs_nothing(tmp_path, caplog):
    """A fake store answering with a crafted pickle: the client runs nothing, logs, and times out."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    target = tmp_path / "ran"
    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    server.setsockopt(zmq.LINGER, 0)
    address = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"

    def answer() -> None:
        if server.poll(5000):
            ident, *_ = server.recv_multipart()
            server.send_multipart([ident, pickle.dumps((1, True, Evil(str(target))), protocol=5)])

    thread = threading.Thread(target=answer)
    thread.start()

    async def main() -> None:
        client = PortClient(address, os.urandom(32), PROTOCOL)
        with pytest.raises(TimeoutError):
            await client.call("get", (np.array([0]), ["v"]), 1.0, never_dead)
        client.close()

    asyncio.run(main())
    thread.join()
    server.close()
    ctx.term()
    assert not target.exists()
    assert "refused a frame (unsigned)" in caplog.text


def test_sessions_are_bounded_and_forgotten_once_their_frames_are_stale():
    sessions = wire.Sessions(window_s=10.0, limit=2)
    sessions.admit("a", 1, 100.0, 100.0)
    sessions.admit("b", 1, 100.0, 100.0)
    with pytest.raises(wire.Refused, match="2 sessions are open"):
        sessions.admit("c", 1, 100.0, 100.0)
    with pytest.raises(wire.Refused, match="sequence number 1 after 1"):
        sessions.admit("a", 1, 100.0, 100.5)
    for ts in (80.0, 130.0):  # too old, too far ahead
        with pytest.raises(wire.Refused, match="timestamp"):
            sessions.admit("a", 2, ts, 100.0)
    sessions.admit("c", 1, 115.0, 115.0)  # a and b idle past the window: forgotten, c fits
    assert set(sessions.seen) == {"c"}


def test_the_port_listens_on_loopback_on_a_single_node_cluster(monkeypatch):
    import ray
    from conduit_verl.tq_store import backend

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.1.2.3")
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}, {"Alive": False}])
    assert backend.port_host() == "127.0.0.1"
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True}, {"Alive": True}])
    assert backend.port_host() == "10.1.2.3"


def test_the_serving_thread_survives_an_error_while_answering(port, raw, monkeypatch):
    answer = port._answer

    def broken(frames):
        monkeypatch.setattr(port, "_answer", answer)
        raise RuntimeError("boom")

    monkeypatch.setattr(port, "_answer", broken)
    raw.send_multipart([b"x"])
    raw.poll(500)
    probe(raw, port.key)
    assert port.refused["unserved"] == 1


# -- fuzzing: random malformed frames ----------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
_huge = st.lists(st.integers(min_value=0, max_value=2**62), min_size=1, max_size=3)


@st.composite
def malformed(draw) -> tuple[str, object]:
    """A recipe for a malformed frame (signed with the port's key when the recipe says so)."""
    kind = draw(
        st.sampled_from(["bytes", "signed-bytes", "truncated", "signed-truncated", "json", "huge", "mutated"])
    )
    if kind in ("bytes", "signed-bytes"):
        return kind, draw(st.lists(st.binary(max_size=64), max_size=4))
    if kind in ("truncated", "signed-truncated"):
        return kind, draw(st.integers(min_value=0, max_value=200))
    if kind == "json":
        return kind, draw(_json)
    if kind == "huge":
        return kind, (
            draw(st.sampled_from(sorted(wire.WIRE_DTYPES))),
            draw(_huge),
            draw(st.integers(0, 64)),
        )
    return kind, (draw(st.sampled_from(["v", "d", "s", "n", "t", "id", "m", "a", "b"])), draw(_json))


def _still_valid(head: dict, field: str, value: object) -> bool:
    return (
        value == head.get(field)
        or (field == "s" and isinstance(value, str) and 1 <= len(value) <= 64)
        or (field in ("n", "id") and type(value) is int)
        or (field == "t" and type(value) in (int, float))
        or (field == "m" and isinstance(value, str) and value in PROTOCOL.methods)
    )


def _frames(key: bytes, recipe: tuple[str, object]) -> list[bytes]:
    kind, arg = recipe
    legit = request(key, "put", (np.array([0, 1]), {"v": scalar_wire([5.0, 6.0])}))
    legit = [bytes(memoryview(f)) for f in legit]
    head = json.loads(legit[1])
    if kind == "bytes":
        return list(arg)
    if kind == "signed-bytes":
        return forge(key, arg[0] if arg else b"", list(arg[1:])) if arg else [b""]
    if kind == "truncated":
        return [legit[0], legit[1][:arg], *legit[2:]]
    if kind == "signed-truncated":
        return forge(key, legit[1][:arg], legit[2:])
    if kind == "json":
        return forge(key, json.dumps(arg).encode(), legit[2:])
    if kind == "huge":  # a declared size far past the bytes that come
        dtype, shape, nbytes = arg
        head["a"] = [
            [dtype, shape, int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize],
            *head["a"][1:],
        ]
        return forge(key, json.dumps(head).encode(), [b"\0" * nbytes, *legit[3:]])
    field, value = arg
    if _still_valid(head, field, value):  # a replacement that leaves the request valid would store its data
        value = {"v": 2, "d": "r", "s": 5, "n": "x", "t": "x", "id": "x", "m": "nope", "a": 5, "b": 5}[field]
    head[field] = value
    return forge(key, json.dumps(head).encode(), legit[2:])


def test_random_malformed_frames_are_refused_with_nothing_changed_and_memory_bounded():
    store = NodeStore(default_tier="shm")
    store.put(np.array([0, 1]), {"v": scalar_wire([1.0, 2.0])})
    port = DataPort(store, PROTOCOL, threading.Lock(), "127.0.0.1")
    before = (stored(store), store.stats())

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(recipe=malformed())
    def check(recipe) -> None:
        frames = _frames(port.key, recipe)
        size = sum(len(f) for f in frames)
        refused = sum(port.refused.values())
        tracemalloc.start()
        try:
            reply = port._answer(frames)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < (1 << 20) + 4 * size, f"{peak} bytes allocated for a {size}-byte frame"
        if reply is None:  # refused: logged, nothing answered
            assert sum(port.refused.values()) == refused + 1
        else:  # an authentic but malformed request: a refusal, nothing ran
            header = json.loads(bytes(memoryview(reply[1])))
            assert header["ok"] is False and header["b"][0] == "StorageBackendError", header
        assert (stored(store), store.stats()) == before

    try:
        check()
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(port.address)
        for recipe in [("bytes", [b"\xff" * 40]), ("huge", ("int64", [2**40], 8)), ("json", [1])]:
            sock.send_multipart(_frames(port.key, recipe))
        probe(sock, port.key, refusals=1)  # only the authentic one was answered (refused); alive
        sock.close()
        ctx.term()
        assert call(port, "get", np.array([0, 1]), ["v"])["v"][2].tolist() == [1.0, 2.0]
    finally:
        port.close()
        store.close()
