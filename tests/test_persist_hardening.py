"""conduit.persist against damaged, crafted and hostile checkpoints (issue 26 items 3, 7, 9, 10 and the
checkpoint fuzzing): a reused segment is verified and never one file in every kept checkpoint; a
checksum-valid crafted file is refused with a CheckpointError before anything changes, in bounded memory;
a failed save leaves nothing behind; symbolic links are never followed."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Ragged, Schema
from conduit.build_buffer import build_buffer
from conduit.errors import CheckpointError, ConduitError
from conduit.persist import atomic, load_checkpoint, save_checkpoint
from conduit.persist.format import _FRAME, FRAME_BYTES, MAGIC, decode, encode, frame, parse_record
from conduit.persist.tree import save_tree

SCHEMA = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
RAGGED = Schema([Column("tokens", torch.int64, ragged=True, max_len=8), Column("adv", torch.float32)])
MB = 1 << 20


def batch(n: int, start: int) -> ColumnBatch:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return ColumnBatch({"obs": x[:, None].repeat(1, 4), "reward": x})


def prioritized(capacity: int = 64) -> Conduit:
    return Conduit(SCHEMA, BufferConfig.prioritized_replay(capacity), seed=0)


def fifo(capacity: int = 64) -> Conduit:
    return Conduit(SCHEMA, BufferConfig.on_policy(capacity), seed=0)


def ragged() -> Conduit:
    return Conduit(RAGGED, BufferConfig.uniform_replay(32), seed=0)


def filled(make: Callable[[], Conduit]) -> Conduit:
    c = make()
    if "tokens" in c.buffer.schema.names:
        lengths = torch.tensor([3, 1, 8, 2])
        c.put(ColumnBatch({"tokens": Ragged.from_lengths(torch.arange(14), lengths), "adv": torch.randn(4)}))
        return c
    for s in range(0, 40, 8):
        c.put(batch(8, s))
    d = c.get(8)
    if c.buffer.sampler.has_priorities:
        c.update_priorities(d, torch.rand(8) * 5)
    return c


def snapshot(c: Conduit) -> dict[str, Any]:
    return {"state": c.state_dict(), "generator": c.shuffle_generator.get_state()}


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    else:
        assert a == b, where


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def edit_record(
    path: Path,
    header: Callable[[dict[str, Any]], dict[str, Any] | bytes] | None = None,
    payload: Callable[[dict[str, Any], bytearray], None] | None = None,
) -> None:
    """Rewrite the record file ``path`` with its JSON header and/or payload edited, and the format's
    checksum (CRC32 over header and payload, in the format's frame) recomputed: a crafted, valid file."""
    data = path.read_bytes()
    _, hlen, plen, _ = _FRAME.unpack_from(data, 0)
    head = json.loads(data[FRAME_BYTES : FRAME_BYTES + hlen])
    body = bytearray(data[FRAME_BYTES + hlen : FRAME_BYTES + hlen + plen])
    if payload is not None:
        payload(head, body)
    new = header(head) if header is not None else head
    raw = new if isinstance(new, bytes) else json.dumps(new).encode()
    crc = zlib.crc32(bytes(body), zlib.crc32(raw))
    path.unlink()
    path.write_bytes(_FRAME.pack(MAGIC, len(raw), len(body), crc) + raw + bytes(body))


def entry(tree: dict[str, Any], *keys: str) -> list[Any]:
    """The ``[key, value]`` pair at ``keys`` in an encoded state tree (``{"$d": [[k, v], ...]}``)."""
    pair: list[Any] = []
    for key in keys:
        pair = next(kv for kv in tree["$d"] if kv[0] == key)
        tree = pair[1]
    return pair


def state_edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(head: dict[str, Any]) -> dict[str, Any]:
        fn(head["meta"]["state"])
        return head

    return edit


def spec_edit(index: int, **changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(head: dict[str, Any]) -> dict[str, Any]:
        head["tensors"][index].update(changes)
        return head

    return edit


def poke(index: int, fmt: str, value: Any, at: int = 0) -> Callable[[dict[str, Any], bytearray], None]:
    """Write ``value`` into element ``at`` of tensor ``index`` of a record's payload."""

    def edit(head: dict[str, Any], body: bytearray) -> None:
        struct.pack_into(fmt, body, head["tensors"][index]["offset"] + at * struct.calcsize(fmt), value)

    return edit


def nested_list(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def nested(depth: int) -> bytes:
    return b'{"meta":' + nested_list(depth) + b',"tensors":[]}'


def _sparse_rows(vector: str, rows: int) -> Callable[[dict[str, Any]], None]:
    """Set the row count of a saved sparse sum-tree vector (``{"$sparse", "index", "values", "rows"}``)."""
    return lambda s: entry(s, "sampler", "tree", vector)[1]["$d"].__setitem__(3, ["rows", rows])


# (name, conduit, file, header edit, payload edit)
CRAFTED: list[tuple[str, Callable[[], Conduit], str, Any, Any]] = [
    (
        "fifo head/tail beyond the insert count",
        fifo,
        "state.cdr",
        state_edit(
            lambda s: (
                entry(s, "sampler", "head").__setitem__(1, 40),
                entry(s, "sampler", "tail").__setitem__(1, 60),
            )
        ),
        None,
    ),  # fmt: skip
    (
        "sum tree written vector of the wrong length",
        prioritized,
        "state.cdr",
        state_edit(_sparse_rows("written", 63)),
        None,
    ),  # fmt: skip
    (
        "priorities of 3e8 rows (2.4 GB)",
        prioritized,
        "state.cdr",
        state_edit(_sparse_rows("priorities", 300_000_000)),
        None,
    ),  # fmt: skip
    ("negative tensor size", prioritized, "seg-*.cdr", spec_edit(0, shape=[-1, -40]), None),
    ("huge tensor shape", prioritized, "seg-*.cdr", spec_edit(0, shape=[0, 2**62, 2**62], nbytes=0), None),
    ("unknown dtype string", prioritized, "seg-*.cdr", spec_edit(3, dtype="object"), None),
    ("another column dtype", prioritized, "seg-*.cdr", spec_edit(3, dtype="int32"), None),
    ("delivery generator of the wrong dtype", prioritized, "state.cdr", spec_edit(-1, dtype="int8"), None),
    ("deeply nested manifest", prioritized, "manifest.cdr", lambda h: nested(50_000), None),
    (
        "deeply nested state",
        prioritized,
        "state.cdr",
        lambda h: (
            json.dumps(h).encode().replace(b'"$d": [', b'"$d": [["x", ' + nested_list(3000) + b"], ", 1)
        ),
        None,
    ),  # fmt: skip
    (
        "manifest layout not a dict",
        prioritized,
        "manifest.cdr",
        lambda h: {**h, "meta": {**h["meta"], "layout": 5}},
        None,
    ),  # fmt: skip
    (
        "manifest insert count disagrees",
        prioritized,
        "manifest.cdr",
        lambda h: {**h, "meta": {**h["meta"], "inserted": 10}},
        None,
    ),  # fmt: skip
    (
        "insert count past int64",
        prioritized,
        "state.cdr",
        state_edit(lambda s: entry(s, "inserted").__setitem__(1, 10**30)),
        None,
    ),  # fmt: skip
    (
        "policy version a string",
        prioritized,
        "state.cdr",
        state_edit(lambda s: entry(s, "versions", "put").__setitem__(1, "abc")),
        None,
    ),  # fmt: skip
    ("slot generation not the ring's", prioritized, "seg-*.cdr", None, poke(1, "<q", 999)),
    ("ragged length beyond max_len", ragged, "seg-*.cdr", None, poke(4, "<q", 1000)),
]


@pytest.mark.parametrize("name,make,pattern,header,payload", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_a_crafted_checksum_valid_checkpoint_is_refused_and_changes_nothing(
    tmp_path: Path, name: str, make: Callable[[], Conduit], pattern: str, header: Any, payload: Any
) -> None:
    source = filled(make)
    source.save(tmp_path)
    source.close()
    edit_record(next((tmp_path / "ckpt-000001").glob(pattern)), header, payload)
    target = make()
    target.put(batch(8, 100) if "obs" in target.buffer.schema.names else _tokens())
    before = snapshot(target)
    peak = peak_mb()
    with pytest.raises(CheckpointError) as err:
        target.load(tmp_path)
    assert peak_mb() - peak < 200, f"{name}: loading a crafted file took {peak_mb() - peak:.0f} MB"
    assert "ckpt-000001" in str(err.value)  # names the checkpoint (and the cause)
    assert_same(before, snapshot(target))
    target.close()


def _tokens() -> ColumnBatch:
    return ColumnBatch(
        {"tokens": Ragged.from_lengths(torch.arange(4), torch.tensor([4])), "adv": torch.ones(1)}
    )


def test_a_buffer_state_whose_sum_tree_does_not_fit_leaves_the_buffer_unchanged() -> None:
    """Before: the storage was copied in, then the sum tree's ``written`` vector raised (half-replaced)."""
    a, b = filled(prioritized), prioritized()
    b.put(batch(8, 100))
    state = a.state_dict()
    state["buffer"]["sampler"]["tree"]["written"] = state["buffer"]["sampler"]["tree"]["written"][:10]
    before = snapshot(b)
    with pytest.raises(CheckpointError, match="written"):
        b.load_state_dict(state)
    assert_same(before, snapshot(b))
    a.close()
    b.close()


# -- item 3: reused segments ---------------------------------------------------------------------


def shared_by_all(root: Path) -> list[str]:
    """Segment files that every kept checkpoint in ``root`` holds (one inode in each)."""
    kept = sorted(root.glob("ckpt-*"))
    inodes = [{p.stat().st_ino: p.name for p in ck.glob("seg-*.cdr")} for ck in kept]
    common = set(inodes[0]).intersection(*inodes[1:]) if len(kept) > 1 else set()
    return [inodes[0][i] for i in common]


def test_a_damaged_reused_segment_is_not_reused_and_never_reaches_every_kept_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("conduit.persist.checkpoint.SEGMENT_BYTES", 16 * 36)  # 16 slots per segment
    a = prioritized(128)
    for s in range(0, 128, 8):
        a.put(batch(8, s))
    reports = []
    for i in range(5):
        a.put(batch(8, 1000 + 8 * i))  # one segment changes per save, seven stay
        reports.append(a.save(tmp_path))
        assert shared_by_all(tmp_path) == [], f"save {i + 1}: one file in every kept checkpoint"
    assert all(r.segments_reused == 7 for r in reports[1:])
    assert sum(r.segments_linked for r in reports) > 0  # still incremental: hard links where safe
    newest = sorted(tmp_path.glob("ckpt-*"))[-1]
    linked = [p for p in newest.glob("seg-*.cdr") if p.stat().st_nlink > 1]
    assert linked, "the newest checkpoint links some segment"
    bad = linked[0]
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte, in place: every checkpoint linking this file sees it
    bad.write_bytes(data)
    reference = prioritized(128)
    assert reference.load(tmp_path) != str(newest)  # a kept checkpoint without that file loads
    reference.close()
    report = a.save(tmp_path)  # the damaged file is verified, refused and written from the buffer
    assert report.segments_written == 1 and report.segments_reused == 7
    fresh = sorted(tmp_path.glob("ckpt-*"))[-1] / bad.name
    assert fresh.exists() and fresh.stat().st_ino != bad.stat().st_ino
    b = prioritized(128)
    assert b.load(tmp_path) == report.path
    assert_same(a.state_dict()["buffer"], b.state_dict()["buffer"])
    a.close()
    b.close()


# -- item 9: failed saves --------------------------------------------------------------------------


def test_a_failed_save_removes_what_it_wrote_and_names_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = filled(prioritized)
    a.save(tmp_path)
    real = atomic.write_file
    calls = []

    def full_disk(path: Path, parts: Any) -> int:
        calls.append(path)
        if len(calls) == 2:
            real(path, parts)  # part of the file made it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, parts)

    a.put(batch(8, 500))
    with monkeypatch.context() as m:
        m.setattr("conduit.persist.checkpoint.atomic.write_file", full_disk)
        with pytest.raises(CheckpointError, match="No space left on device"):
            a.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001"]  # no temporary directory left
    report = a.save(tmp_path)  # a later save that fits succeeds
    b = prioritized()
    assert b.load(tmp_path) == report.path
    assert_same(a.state_dict()["buffer"], b.state_dict()["buffer"])
    a.close()
    b.close()


FSIZE_CHILD = textwrap.dedent(
    """
    import os, resource, sys, torch
    from conduit import BufferConfig, Column, ColumnBatch, Conduit, Schema
    from conduit.errors import CheckpointError
    root = sys.argv[1]
    schema = Schema([Column("obs", torch.float32, (64,))])
    big = Conduit(schema, BufferConfig.uniform_replay(4096))
    big.put(ColumnBatch({"obs": torch.randn(2000, 64)}))  # 512 KB of rows
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, resource.RLIM_INFINITY))
    try:
        big.save(root)
        print("SAVED")
    except CheckpointError as e:
        print("REFUSED", e)
    print("LEFT", sorted(os.listdir(root)))
    small = Conduit(schema, BufferConfig.uniform_replay(4096))
    small.put(ColumnBatch({"obs": torch.randn(100, 64)}))
    print("SMALL", small.save(root).path)
    """
)


def test_a_save_past_the_file_size_limit_is_refused_cleanly_and_the_next_one_fits(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", FSIZE_CHILD, str(tmp_path / "ck")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("REFUSED") and "File too large" in lines[0], out.stdout
    assert lines[1] == "LEFT []", out.stdout  # nothing of the failed save is left
    assert lines[2].startswith("SMALL") and lines[2].endswith("ckpt-000001"), out.stdout


# -- item 10: symbolic links -------------------------------------------------------------------------


def test_a_symlinked_segment_of_the_previous_checkpoint_is_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "ck", tmp_path / "outside"
    outside.mkdir()
    a = filled(prioritized)
    a.save(root)
    seg = next((root / "ckpt-000001").glob("seg-*.cdr"))
    target = outside / "seg.cdr"
    target.write_bytes(seg.read_bytes())
    seg.unlink()
    seg.symlink_to(target)
    a.update_priorities(a.get(4), torch.ones(4))  # the segment's slots unchanged: it would be reused
    with pytest.raises(CheckpointError, match="symbolic link"):
        a.save(root)
    assert target.stat().st_nlink == 1  # never hard-linked (nor read through the link)
    assert sorted(p.name for p in root.iterdir()) == ["ckpt-000001"]
    # the same through save_tree's link of a previous framework checkpoint
    prev = tmp_path / "prev"
    (prev / "buffers").mkdir(parents=True)
    shutil.copytree(root, prev / "buffers" / "default", symlinks=True)
    with pytest.raises(CheckpointError, match="symbolic link"):
        save_tree({"conduits": {}}, {"default": a}, tmp_path / "tree2", previous=prev)
    assert target.stat().st_nlink == 1 and not (tmp_path / "tree2").exists()
    a.close()


# -- fuzzing -------------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["float32", "int64", "uint8", "bool", "$t", "$sparse", "prioritized", "fifo"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _slots(tree: Any) -> list[tuple[Any, Any]]:
    """Every ``(container, key)`` of a JSON tree (places a value can be replaced at)."""
    out: list[tuple[Any, Any]] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
        for k, v in items:
            out.append((node, k))
            stack.append(v)
    return out


@pytest.fixture(scope="module")
def saved() -> dict[str, dict[str, bytes]]:
    """The files of one valid checkpoint per sampler."""
    out = {}
    for kind, make in (("prioritized", prioritized), ("fifo", fifo)):
        with tempfile.TemporaryDirectory() as d:
            c = filled(make)
            c.save(d)
            c.close()
            out[kind] = {p.name: p.read_bytes() for p in (Path(d) / "ckpt-000001").iterdir()}
    return out


@pytest.mark.parametrize("kind", ["prioritized", "fifo"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_checksum_valid_checkpoints_load_or_raise_a_conduit_error_changing_nothing(
    saved: dict[str, dict[str, bytes]], tmp_path: Path, kind: str, data: st.DataObject
) -> None:
    files = saved[kind]
    name = data.draw(st.sampled_from(sorted(files)), label="file")
    mode = data.draw(st.sampled_from(["header json", "header bytes", "payload bytes"]), label="mode")
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    ck = root / "ckpt-000001"
    ck.mkdir()
    for n, b in files.items():
        (ck / n).write_bytes(b)

    def header(head: dict[str, Any]) -> dict[str, Any] | bytes:
        if mode == "header json":
            slots = _slots(head)
            node, key = slots[data.draw(st.integers(0, len(slots) - 1), label="at")]
            node[key] = data.draw(JSON, label="value")
            return head
        if mode == "header bytes":
            raw = bytearray(json.dumps(head).encode())
            for _ in range(data.draw(st.integers(1, 4))):
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
            return bytes(raw)
        return head

    def payload(head: dict[str, Any], body: bytearray) -> None:
        if mode == "payload bytes" and body:
            for _ in range(data.draw(st.integers(1, 8))):
                body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))

    edit_record(ck / name, header, payload)
    target = TARGETS[kind]
    before = snapshot(target)
    peak = peak_mb()
    try:
        target.load(root)
    except ConduitError:
        assert_same(before, snapshot(target))
    else:
        target.buffer.check_state(target.buffer.state_dict())  # whatever loaded is a consistent state
    assert peak_mb() - peak < 200


TARGETS: dict[str, Conduit] = {}


@pytest.fixture(scope="module", autouse=True)
def _targets() -> Any:
    for kind, make in (("prioritized", prioritized), ("fifo", fifo)):
        TARGETS[kind] = make()
        TARGETS[kind].put(batch(8, 100))
    yield
    for c in TARGETS.values():
        c.close()
    TARGETS.clear()


def test_load_checkpoint_into_a_bare_buffer_checks_it_the_same_way(tmp_path: Path) -> None:
    a = filled(fifo)
    save_checkpoint(a.buffer, tmp_path)
    edit_record(
        tmp_path / "ckpt-000001" / "state.cdr",
        state_edit(lambda s: entry(s, "sampler", "tail").__setitem__(1, 41)),
    )
    b = build_buffer(BufferConfig.on_policy(64), SCHEMA)
    with pytest.raises(CheckpointError, match="tail 41"):
        load_checkpoint(b, tmp_path)
    assert b.inserted == 0
    a.close()


def test_what_a_load_would_refuse_for_nesting_is_never_saved() -> None:
    """A state nested deeper than a load accepts (``MAX_DEPTH``) is refused at save, not found unloadable
    later; one just inside the bound round-trips."""
    deep: Any = torch.ones(2)
    for _ in range(28):
        deep = {"x": deep}
    tensors: list[torch.Tensor] = []
    data = bytearray(b"".join(bytes(p) for p in frame({"s": encode(deep, tensors)}, tensors)))
    meta, got, _ = parse_record(data, 0)
    out = decode(meta["s"], got)
    for _ in range(28):
        out = out["x"]
    assert torch.equal(out, torch.ones(2))
    for _ in range(10):
        deep = {"x": deep}
    with pytest.raises(CheckpointError, match="nested deeper"):
        frame({"s": encode(deep, [])}, [])
