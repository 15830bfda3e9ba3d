"""File-backed tiers are checked against their file system's free space (issue 26, item 11).

A disk or shm column is a mapping of a file: a column larger than the space left was accepted (a
sparse file), and the process died of SIGBUS when writes passed the space. Now the space is checked
with a margin and reserved (``posix_fallocate``) before the column exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conduit import BufferConfig, Column, Conduit, SchedulerConfig, Schema
from conduit.buffer import tiers
from conduit.buffer.tiers import allocate, check_free_space
from conduit.errors import CapacityError, PlacementCapacityError


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_disk_column_larger_than_the_free_space_is_refused_at_build(tmp_path):
    width = _free(str(tmp_path)) // 16 + (1 << 30)  # 16 rows: 1 GiB more than the file system has
    schema = Schema([Column("obs", torch.uint8, (width,))])
    with pytest.raises(PlacementCapacityError, match="does not fit") as info:
        Conduit(schema, BufferConfig(capacity=16, tier="disk", disk_path=str(tmp_path)), SchedulerConfig())
    assert isinstance(info.value, CapacityError)
    assert info.value.missing_bytes >= 1 << 30 and info.value.tiers == ("disk",)
    assert os.listdir(tmp_path) == []  # nothing left behind


def test_allocate_refuses_a_disk_column_over_the_free_space_and_leaves_no_file(tmp_path):
    n = _free(str(tmp_path)) + (1 << 20)
    with pytest.raises(PlacementCapacityError):
        allocate((n,), torch.uint8, "disk", str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_the_margin_is_kept(monkeypatch, tmp_path):
    class Fs:  # an 8 MiB file system with 8 MiB free (a unit test of the margin rule)
        f_frsize, f_blocks, f_bavail = 4096, 2048, 2048

    monkeypatch.setattr(tiers.os, "statvfs", lambda path: Fs)
    margin = int(tiers.SPACE_MARGIN_FRACTION * 8 * 2**20)
    check_free_space(str(tmp_path), 8 * 2**20 - margin, "disk")  # fits exactly with the margin
    with pytest.raises(PlacementCapacityError, match="kept as margin") as info:
        check_free_space(str(tmp_path), 8 * 2**20 - margin + 1, "disk")
    assert info.value.missing_bytes == 1


def test_disk_columns_reserve_their_blocks(tmp_path):
    before = _free(str(tmp_path))
    t = allocate((64 << 20,), torch.uint8, "disk", str(tmp_path))  # 64 MiB, unlinked but mapped
    reserved = before - _free(str(tmp_path))
    assert reserved >= 60 << 20, f"only {reserved} bytes reserved for a 64 MiB column"
    del t


_TMPFS_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from conduit import BufferConfig, Column, ColumnBatch, Conduit, Schema, SchedulerConfig
    from conduit.errors import PlacementCapacityError
    path = sys.argv[1]
    def build(rows):
        schema = Schema([Column("obs", torch.uint8, (1 << 20,))])  # 1 MiB rows
        return Conduit(schema, BufferConfig(capacity=rows, tier="disk", disk_path=path), SchedulerConfig())
    try:
        build(16)  # 16 MiB on an 8 MiB tmpfs
        print("ACCEPTED")
    except PlacementCapacityError as e:
        print("REFUSED", e)
    c = build(6)  # fits: every byte written, no SIGBUS
    c.put(ColumnBatch({"obs": torch.full((6, 1 << 20), 7, dtype=torch.uint8)}))
    assert int(c.get(6).batch["obs"].sum()) == 7 * 6 * (1 << 20)
    c.close()
    print("WROTE")
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root")
def test_a_full_tmpfs_refuses_the_column_instead_of_sigbus(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("this machine does not let the test mount a tmpfs")
    try:
        out = subprocess.run(
            [sys.executable, "-c", _TMPFS_SCRIPT, str(mnt)], capture_output=True, text=True, timeout=120
        )
    finally:
        subprocess.run(["umount", str(mnt)])
    assert out.returncode == 0, f"rc {out.returncode} (SIGBUS is -7): {out.stderr[-2000:]}"
    assert "REFUSED" in out.stdout and "WROTE" in out.stdout, out.stdout
