"""Issue 49, item 1: an incremental checkpoint reuses only segments this buffer's own history wrote.

Slots and generations (insert counts) alone do not say whose data a segment holds: two buffers that
inserted the same number of items have equal generations. Each buffer carries a lineage (a random id),
saved in the manifest; a loaded state starts a new lineage whose parent is the one it was saved from.
"""

from __future__ import annotations

from pathlib import Path

import torch

from conduit import BufferConfig, Column, ColumnBatch, Conduit, Schema
from conduit.buffer.buffer import ExperienceBuffer
from conduit.build_buffer import build_buffer
from conduit.persist import load_checkpoint, save_checkpoint

SCHEMA = Schema([Column("id", torch.int64), Column("obs", torch.float32, (4,))])


def conduit() -> Conduit:
    return Conduit(SCHEMA, BufferConfig.uniform_replay(8), seed=0)


def bare() -> ExperienceBuffer:
    return build_buffer(BufferConfig.uniform_replay(8), SCHEMA, seed=0)


def put_ids(c: Conduit, start: int, n: int = 8) -> Conduit:
    ids = torch.arange(start, start + n)
    c.put(ColumnBatch({"id": ids, "obs": ids[:, None].float().repeat(1, 4)}))
    return c


def stored_ids(c: Conduit) -> list[int]:
    return sorted(c.buffer.storage.data["id"][: min(c.buffer.inserted, 8)].tolist())


def loaded_ids(root: Path) -> list[int]:
    c = conduit()
    c.load(root)
    return stored_ids(c)


def test_another_buffers_checkpoint_in_the_root_is_never_reused(tmp_path: Path) -> None:
    put_ids(conduit(), 0).save(tmp_path)
    report = put_ids(conduit(), 100).save(tmp_path)  # same slots, same insert counts, other data
    assert report.segments_reused == 0 and report.segments_written >= 1
    assert loaded_ids(tmp_path) == list(range(100, 108))


def test_a_state_loaded_from_elsewhere_is_not_taken_for_the_roots_history(tmp_path: Path) -> None:
    put_ids(conduit(), 0).save(tmp_path)
    b = conduit()
    b.load_state_dict(put_ids(conduit(), 100).state_dict())  # equal insert counts, other data
    assert b.save(tmp_path).segments_reused == 0
    assert loaded_ids(tmp_path) == list(range(100, 108))


def test_two_forks_of_one_checkpoint_never_reuse_each_others_segments(tmp_path: Path) -> None:
    put_ids(conduit(), 0).save(tmp_path)
    first, second = conduit(), conduit()
    first.load(tmp_path)
    second.load(tmp_path)
    put_ids(first, 100).save(tmp_path)  # both forks write 8 items: generations 9..16 in both
    put_ids(second, 200).save(tmp_path)
    assert loaded_ids(tmp_path) == list(range(200, 208))


def test_a_resumed_buffer_still_reuses_what_it_loaded_and_what_it_wrote(tmp_path: Path) -> None:
    a = put_ids(conduit(), 0)
    a.save(tmp_path)
    b = conduit()
    b.load(tmp_path)
    assert b.save(tmp_path).segments_written == 0  # the loaded segments: the parent's, verified
    assert b.save(tmp_path).segments_written == 0  # its own
    put_ids(b, 50, 4)
    b.save(tmp_path)
    assert loaded_ids(tmp_path) == [4, 5, 6, 7, 50, 51, 52, 53]


def test_a_bare_buffer_follows_the_same_rule(tmp_path: Path) -> None:
    a, b = bare(), bare()
    ids = torch.arange(8)
    a.extend(ColumnBatch({"id": ids, "obs": torch.zeros(8, 4)}))
    b.extend(ColumnBatch({"id": ids + 100, "obs": torch.ones(8, 4)}))
    save_checkpoint(a, tmp_path)
    assert save_checkpoint(b, tmp_path).segments_reused == 0
    c = bare()
    load_checkpoint(c, tmp_path)
    assert c.storage.data["id"].tolist() == list(range(100, 108))
