"""One writer per journal directory, and prune racing commits (issue 49): a second opener is refused
with an error naming the holder, a killed writer never blocks a restart, and a commit concurrent with
``Journal.prune`` (what ``Conduit.save`` calls) is never refused and never lost."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Schema
from conduit.errors import JournalLockedError
from conduit.persist import Journal
from conduit.persist.checkpoint import covered_items
from conduit.persist.writer_lock import LOCK, WriterLock

SCHEMA = Schema([Column("obs", torch.float32, (4,)), Column("reward", torch.float32)])
ROOT = Path(__file__).resolve().parents[1]


def batch(n: int, start: int) -> ColumnBatch:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return ColumnBatch({"obs": x[:, None].repeat(1, 4), "reward": x})


def config(directory: Path, capacity: int = 256) -> BufferConfig:
    return BufferConfig.uniform_replay(capacity, journal={"path": str(directory), "flush_interval_s": 0.05})


def test_a_second_conduit_on_a_journal_directory_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    """The probe's shape: two Conduits on one journal. The second is refused, naming the directory and
    this process; once the first closes, a reopening gets back every item the first acknowledged."""
    j = tmp_path / "j"
    first = Conduit(SCHEMA, config(j))
    for i in range(10):
        first.put(batch(25, 25 * i))
    with pytest.raises(JournalLockedError, match=f"{j}.*this process.*pid {os.getpid()}"):
        Conduit(SCHEMA, config(j))
    first.put(batch(6, 250))  # the refused opener changed nothing: the first goes on
    first.close()
    again = Conduit(SCHEMA, config(j))
    assert again.buffer.inserted == 256
    assert again.buffer.storage.data["reward"].tolist() == [float(x) for x in range(256)]
    again.close()


def test_a_second_journal_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = Journal(tmp_path, flush_interval_s=10)
    with pytest.raises(JournalLockedError, match="one writer per directory"):
        Journal(tmp_path, flush_interval_s=10)
    assert sorted(p.name for p in tmp_path.glob("journal-*.cdr")) == [first.path.name]  # none made
    first.close()
    second = Journal(tmp_path, flush_interval_s=10)
    second.close()
    assert (tmp_path / LOCK).read_bytes() == b""  # released: no stale holder named


def race_to_open(directory: Path, n: int) -> tuple[list[Journal], list[BaseException]]:
    """``n`` threads open a journal on ``directory`` at once: ``(opened, refused)``."""
    start = threading.Barrier(n)
    opened: list[Journal] = []
    refused: list[BaseException] = []

    def open_one() -> None:
        start.wait()
        try:
            opened.append(Journal(directory, flush_interval_s=10))
        except BaseException as e:  # noqa: BLE001 - returned to the test
            refused.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return opened, refused


def test_threads_racing_to_open_one_journal_directory_get_one_writer(tmp_path: Path) -> None:
    for round_ in range(5):
        opened, refused = race_to_open(tmp_path / str(round_), 4)
        for journal in opened:
            journal.close()
        assert len(opened) == 1, (opened, refused)
        assert len(refused) == 3 and all(isinstance(e, JournalLockedError) for e in refused), refused


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    lock = WriterLock.acquire(tmp_path)
    pid = os.fork()
    if pid == 0:  # the child: its copy was closed at the fork, the parent's lock is untouched
        os._exit(0 if not lock.held else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock.held
    fd = os.open(tmp_path / LOCK, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # the parent still holds it after the child closed its copy
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    lock.release()


def test_a_killed_writer_never_blocks_a_restart(tmp_path: Path) -> None:
    """A child process opens the journal and is SIGKILLed: while it lives a second opener is refused
    (naming the child's pid); after, a new opener succeeds and replays what the child made durable."""
    j = tmp_path / "j"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_journal_writers import SCHEMA, batch, config
        from pathlib import Path
        from conduit import Conduit
        c = Conduit(SCHEMA, config(Path({str(j)!r})))
        for i in range(4):
            c.put(batch(8, 8 * i))
        c.journal.flush()
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read() if child.stderr else line
        with pytest.raises(JournalLockedError, match=f"another process \\(pid {child.pid} on host "):
            Conduit(SCHEMA, config(j))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    assert child.returncode == -signal.SIGKILL
    c = Conduit(SCHEMA, config(j))
    assert c.buffer.inserted == 32
    assert c.buffer.storage.data["reward"][:32].tolist() == [float(x) for x in range(32)]
    c.close()


def test_commits_racing_prune_are_never_refused_and_never_lost(tmp_path: Path) -> None:
    """One thread puts in a tight loop while another prunes again and again (what ``Conduit.save``
    does once its checkpoint is durable), for at most ~2 s: no put is refused, and a reopening
    replays every acknowledged item (checkpoint, then journal)."""
    j, ckpt = tmp_path / "j", tmp_path / "ckpt"
    a = Conduit(SCHEMA, config(j, capacity=4096))
    a.put(batch(8, 0))
    a.save(ckpt)  # a real checkpoint: the first file is pruned, the rest only rotated
    covered = covered_items(ckpt)
    assert a.journal is not None and covered == 8
    acknowledged = [8]
    errors: list[BaseException] = []
    stop = threading.Event()

    def putter() -> None:
        try:
            while not stop.is_set() and acknowledged[0] < 200_000:
                a.put(batch(8, acknowledged[0]))
                acknowledged[0] += 8
        except BaseException as e:  # noqa: BLE001 - asserted on below
            errors.append(e)

    thread = threading.Thread(target=putter)
    thread.start()
    prunes, deadline = 0, time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline and prunes < 400 and not errors:
            a.journal.prune(covered, ckpt)
            prunes += 1
    finally:
        stop.set()
        thread.join()
    assert errors == [], f"after {prunes} prunes and {acknowledged[0]} items: {errors[0]!r}"
    assert not (j / "journal-000001.cdr").exists()  # pruned: the checkpoint holds it
    a.close()
    b = Conduit(SCHEMA, config(j, capacity=4096))
    assert b.buffer.inserted == acknowledged[0]
    assert torch.equal(b.buffer.storage.data["reward"], a.buffer.storage.data["reward"])
    b.close()
