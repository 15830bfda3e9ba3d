"""Crash-safe file operations: fsync'd writes, atomic renames and swaps, paths kept inside a root."""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from conduit.errors import CheckpointError

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_counter = itertools.count()


def inside(root: Path, name: str) -> Path:
    """``root / name``, refusing a name that would leave ``root`` (``..``, absolute paths, separators)."""
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name):
        raise CheckpointError(f"refusing file name {name!r}: it would leave {root}")
    return root / name


def local_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as an absolute local directory path (a URI such as ``s3://`` raises ``CheckpointError``)."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "://" in text or "\x00" in text:
        raise CheckpointError(f"checkpoint path must be a local directory, got {path!r}")
    return Path(text).absolute()


def temp_sibling(path: Path) -> Path:
    """A fresh name beside ``path`` for writing its next version (``<name>.tmp-<pid>-<n>``)."""
    return path.with_name(f"{path.name}.tmp-{os.getpid()}-{next(_counter)}")


def write_file(path: Path, parts: Iterable[bytes | memoryview]) -> int:
    """Write ``parts`` to a new file ``path`` and fsync it; returns the bytes written."""
    n = 0
    with open(path, "xb") as f:
        for part in parts:
            f.write(part)
            n += len(part) if isinstance(part, bytes) else part.nbytes
        f.flush()
        os.fsync(f.fileno())
    return n


def read_regular(path: Path, limit: int | None = None) -> bytearray:
    """The bytes of regular file ``path``, refusing a symbolic link (never followed) and, before reading
    anything, a file larger than ``limit``; raises :class:`CheckpointError` naming the problem."""
    if path.is_symlink():
        raise CheckpointError(f"{path.name} is a symbolic link (to {os.readlink(path)}); refusing to read it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise CheckpointError(f"cannot read {path.name}: {e}") from e
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path.name} is not a regular file; refusing to read it")
        if limit is not None and st.st_size > limit:
            raise CheckpointError(f"{path.name} holds {st.st_size} bytes, more than the {limit} it can need")
        data = bytearray(st.st_size)
        try:
            n = f.readinto(data)
        except OSError as e:
            raise CheckpointError(f"cannot read {path.name}: {e}") from e
    if n != st.st_size:
        raise CheckpointError(f"{path.name}: read {n} of its {st.st_size} bytes (changed while read)")
    return data


def link_tree(src: Path, dst: Path) -> None:
    """Recreate directory ``src`` at ``dst`` with hard links to its files (copies where links fail).

    A symbolic link in ``src`` (it may lead outside) is refused with :class:`CheckpointError`, never followed."""
    for parent, dirs, names in os.walk(src, followlinks=False):
        here = Path(parent)
        target_dir = dst / here.relative_to(src)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in [*dirs, *names]:
            entry = here / name
            if entry.is_symlink():
                raise CheckpointError(f"refusing {entry}: a symbolic link (to {os.readlink(entry)})")
        for name in names:
            entry, target = here / name, target_dir / name
            try:
                os.link(entry, target, follow_symlinks=False)
            except OSError:
                shutil.copyfile(entry, target, follow_symlinks=False)


def fsync_tree(path: Path) -> None:
    """fsync every file and directory under ``path`` (files written by others without fsync)."""
    for entry in [*path.rglob("*"), path]:
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif entry.is_dir():
            fsync_dir(entry)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(tmp: Path, path: Path) -> None:
    """Make the complete directory ``tmp`` appear as ``path`` atomically, replacing any old ``path``.

    An empty or missing ``path`` is replaced by a rename. An existing one is swapped with ``tmp`` in one
    step (Linux ``renameat2(RENAME_EXCHANGE)``) and then removed, so a crash at any moment leaves either
    the old or the new directory at ``path``. Where the swap is not available the old directory is first
    renamed aside to ``<path>.old-…`` (a crash between the two renames leaves it there, complete).
    """
    fsync_dir(tmp)
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    if not path.exists():
        os.rename(tmp, path)
        fsync_dir(path.parent)
        return
    if _exchange(tmp, path):
        fsync_dir(path.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the old version
        return
    old = path.with_name(f"{path.name}.old-{os.getpid()}-{next(_counter)}")
    os.rename(path, old)
    os.rename(tmp, path)
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(rc == 0)


def remove_stale(path: Path) -> None:
    """Remove leftovers of interrupted writes beside ``path`` (``<name>.tmp-*``, ``<name>.old-*``) made by
    processes that are no longer running."""
    parent = path.parent
    if not parent.is_dir():
        return
    if not path.exists():  # a crash between the two renames of the fallback: the old one comes back
        olds = sorted(e for e in parent.iterdir() if e.name.startswith(f"{path.name}.old-"))
        if olds:
            os.rename(olds[-1], path)
    for entry in parent.iterdir():
        for tag in (".tmp-", ".old-"):
            prefix = f"{path.name}{tag}"
            if entry.name.startswith(prefix) and not _alive(entry.name[len(prefix) :].split("-")[0]):
                shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
