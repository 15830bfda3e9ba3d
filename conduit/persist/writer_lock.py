"""One writer per journal directory: an exclusive lock that a crash releases.

:meth:`WriterLock.acquire` takes ``flock(LOCK_EX | LOCK_NB)`` on ``<directory>/journal.lock`` and
writes the holder (pid, host) into it; a second opener gets :class:`~conduit.errors.JournalLockedError`
naming the directory and that holder. The kernel drops the lock when its file is closed, so a writer
that dies, even by SIGKILL, never blocks a restart; the file stays (removing it would race an opener).

Within one process a registry of held locks refuses a second holder whatever the filesystem does (on
NFS, Linux emulates ``flock`` with POSIX byte-range locks: they exclude other hosts when the mount has
locking, ``lock``/NFSv4, but not another opener in the same process). A forked child closes its copies,
so a child that outlives its parent does not keep the lock. A filesystem without locks (``ENOLCK``)
gets a warning, and only the in-process registry guards it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from conduit.errors import JournalError, JournalLockedError
from conduit.persist import atomic

log = logging.getLogger(__name__)

LOCK = "journal.lock"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

_held: dict[tuple[int, int], WriterLock] = {}  # (st_dev, st_ino) of the lock file -> its holder here
_registry = threading.Lock()


class WriterLock:
    """The exclusive right to write journal directory ``directory``, held until :meth:`release`.

    Example:
        >>> lock = WriterLock.acquire(Path("/data/run1/journal"))  # JournalLockedError if held
        >>> ...                                                    # write the journal
        >>> lock.release()
    """

    def __init__(self, directory: Path, fd: int, key: tuple[int, int]) -> None:
        self.directory = directory
        self._fd = fd
        self._key = key

    @classmethod
    def acquire(cls, directory: Path) -> WriterLock:
        """Lock ``directory`` (which must exist) for writing, without waiting; raises
        :class:`JournalLockedError` naming the holder if another journal has it, :class:`JournalError`
        if the lock file cannot be opened (e.g. it is a symbolic link: never followed)."""
        path = atomic.inside(directory, LOCK)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise JournalError(f"cannot open the journal lock {path}: {e}") from e
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            with _registry:
                if key in _held:
                    raise JournalLockedError(_refusal(directory, _holder(fd), here=True))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise JournalLockedError(_refusal(directory, _holder(fd), here=False)) from None
                except OSError as e:
                    if e.errno not in _UNSUPPORTED:
                        raise
                    log.warning(
                        "journal %s: the filesystem does not lock files (%s); only writers in this process "
                        "are kept out",
                        directory,
                        e,
                    )
                lock = cls(directory, fd, key)
                _held[key] = lock
        except BaseException:
            os.close(fd)
            raise
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return lock

    @property
    def held(self) -> bool:
        """Whether this lock is still held (not released, not a forked child's copy)."""
        return self._fd >= 0

    def release(self) -> None:
        """Give the lock up (idempotent); the lock file stays, emptied."""
        with _registry:
            if self._fd < 0:
                return
            fd, self._fd = self._fd, -1
            _held.pop(self._key, None)
            try:
                os.ftruncate(fd, 0)  # still locked: no opener reads a stale holder
            finally:
                os.close(fd)


def _holder(fd: int) -> str:
    """Who wrote ``fd``'s lock file last, as words."""
    try:
        got = json.loads(os.pread(fd, 4096, 0))
        return f"pid {int(got['pid'])} on host {got['host']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "a holder that has not written its name yet"


def _refusal(directory: Path, holder: str, here: bool) -> str:
    where = "a journal of this process" if here else "another process"
    return (
        f"the journal directory {directory} is being written by {where} ({holder}): one writer per "
        "directory; close that one first, or give this one its own directory"
    )


def _forget_in_child() -> None:
    """After ``fork``: the child closes its copies of the locks (the parent keeps them; no LOCK_UN)."""
    global _registry
    _registry = threading.Lock()  # another thread may have held it at the fork
    for lock in _held.values():
        try:
            os.close(lock._fd)
        except OSError:
            pass
        lock._fd = -1
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)
