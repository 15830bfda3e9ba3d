"""Pieces of the streaming mode that need no Ray: piece sizing, metric merging, the group FIFO."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit_verl.checks import check_piece_micro_batches  # noqa: E402
from conduit_verl.delivery import GroupFifo  # noqa: E402
from conduit_verl.streaming import GroupWait, merge_metrics  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402

from conduit import Metrics  # noqa: E402
from conduit.errors import ConfigError, ShapeError  # noqa: E402


class _FakeBuffer:
    def __init__(self, finished: int) -> None:
        self.finished_keys = {"train": {f"u{i}" for i in range(finished)}}

    def _sync_metadata_from_transfer_queue(self) -> None:
        pass


@pytest.mark.parametrize(
    ("g_ing", "finished", "remaining", "want"), [(1, 0, 4, 1), (1, 3, 4, 3), (2, 1, 4, 2), (2, 9, 3, 3)]
)
def test_polled_piece_size(g_ing: int, finished: int, remaining: int, want: int) -> None:
    assert GroupWait(None).next_piece(_FakeBuffer(finished), g_ing, remaining) == want


def test_merge_metrics_weights_by_samples() -> None:
    got = merge_metrics([(4, {"a": 1.0, "tag": "x"}), (12, {"a": 3.0})])
    assert got == {"a": 2.5, "tag": "x"}


def test_micro_batches_must_divide_pieces() -> None:
    check_piece_micro_batches(4, 1, 4, {"rollout": 4, "ref": 2})
    with pytest.raises(ConfigError, match="g_ing=1"):
        check_piece_micro_batches(4, 1, 4, {"rollout": 16})
    with pytest.raises(ConfigError):  # the last piece (1 group) is smaller
        check_piece_micro_batches(5, 2, 4, {"rollout": 8})


def test_group_fifo_whole_groups_once_in_order() -> None:
    fifo = GroupFifo(group_size=2, capacity=16, metrics=Metrics())
    p = KVBatchMeta(partition_id="train", keys=["a_0_0", "b_0_0", "a_1_0", "b_1_0"], tags=[{}] * 4)
    fifo.put(p, [[0, 2], [1, 3]], version=1)
    with pytest.raises(ShapeError):  # half a group never lands
        fifo.put(p, [[0]], version=1)
    assert len(fifo) == 4
    assert fifo.take(2, version=1).keys == ["a_0_0", "a_1_0"]
    assert fifo.take(2, version=1).keys == ["b_0_0", "b_1_0"]
    assert len(fifo) == 0
    fifo.reset()
