"""Pieces of the streaming mode that need no Ray: piece sizing, metric merging, the group FIFO."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit_verl.checks import piece_unit  # noqa: E402
from conduit_verl.delivery import GroupFifo  # noqa: E402
from conduit_verl.errors import VerlIntegrationError  # noqa: E402
from conduit_verl.group_wait import GroupWait  # noqa: E402
from conduit_verl.streaming import merge_metrics  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402

from conduit.errors import ConfigError, ShapeError  # noqa: E402


class _FakeBuffer:
    def __init__(self, finished: int) -> None:
        self.finished_keys = {"train": {f"u{i}" for i in range(finished)}}

    def _sync_metadata_from_transfer_queue(self) -> None:
        pass


@pytest.mark.parametrize(
    ("piece_groups", "finished", "remaining", "want"),
    [(1, 1, 4, 1), (1, 3, 4, 3), (2, 2, 4, 2), (2, 9, 3, 3)],
)
def test_polled_piece_size(piece_groups: int, finished: int, remaining: int, want: int) -> None:
    assert GroupWait(None).next_piece(_FakeBuffer(finished), piece_groups, remaining) == want


def test_merge_metrics_weights_by_samples() -> None:
    got = merge_metrics([(4, {"a": 1.0, "tag": "x"}), (12, {"a": 3.0})])
    assert got == {"a": 2.5, "tag": "x"}


def test_piece_unit_keeps_pieces_in_whole_micro_batches() -> None:
    assert piece_unit(4, 4, {"rollout": 4, "ref": 2}, 1) == 1
    assert piece_unit(8, 4, {"rollout": 8, "ref": None}, "auto") == 2  # 8-sample micro-batches: 2 groups
    assert piece_unit(9, 4, {"rollout": 6}, 3) == 3  # lcm: 3 groups = 12 samples
    assert piece_unit(4, 4, {"rollout": 4}, "auto", dp=2) == 2  # 2 ranks × 4-sample micro-batches
    with pytest.raises(ConfigError, match="piece_groups=1"):
        piece_unit(4, 4, {"rollout": 8}, 1)
    with pytest.raises(ConfigError, match="2 data-parallel"):
        piece_unit(4, 4, {"rollout": 4}, 1, dp=2)
    with pytest.raises(ConfigError, match="train_batch_size=5"):  # the last piece would be 1 group
        piece_unit(5, 4, {"rollout": 8}, "auto")


def test_polled_piece_rounds_to_whole_units() -> None:
    wait = GroupWait(None, unit=2)
    assert wait.next_piece(_FakeBuffer(5), 2, 8) == 4  # 5 finished: take 4 (2 units), leave 1
    assert wait.next_piece(_FakeBuffer(3), 2, 8) == 2  # 3 finished: take 2 (1 unit), leave 1


def test_group_fifo_whole_groups_once_in_order() -> None:
    fifo = GroupFifo(group_size=2, capacity=16)
    p = KVBatchMeta(partition_id="train", keys=["a_0_0", "b_0_0", "a_1_0", "b_1_0"], tags=[{}] * 4)
    fifo.put(p, [[0, 2], [1, 3]], version=1)
    with pytest.raises(ShapeError):  # half a group never lands
        fifo.put(p, [[0]], version=1)
    assert len(fifo) == 4
    assert fifo.take(2, version=1).keys == ["a_0_0", "a_1_0"]
    assert fifo.take(2, version=1).keys == ["b_0_0", "b_1_0"]
    assert len(fifo) == 0
    counts = fifo.end_step()  # the step's buffer counters reach the trainer's metrics
    assert counts == {"conduit/buffer/inserted": 4, "conduit/buffer/sampled": 4}
    assert fifo.pieces == []


def test_group_fifo_refuses_to_end_a_step_with_samples_not_delivered() -> None:
    fifo = GroupFifo(group_size=2, capacity=16)
    fifo.put(KVBatchMeta(partition_id="train", keys=["a_0_0", "a_1_0"], tags=[{}] * 2), [[0, 1]], version=1)
    with pytest.raises(VerlIntegrationError, match="2 samples of this step were never delivered"):
        fifo.end_step()


def test_a_failing_verl_stage_is_an_operator_error_naming_it_and_the_piece() -> None:
    from conduit_verl import streaming

    from conduit import Metrics
    from conduit.errors import OperatorError

    def broken(meta: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        raise RuntimeError("worker died")

    def tag(meta: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        metrics["tagged"] = len(meta)
        return meta

    piece = streaming._Piece(KVBatchMeta(keys=["a_0_0", "a_1_0"], tags=[{}, {}], partition_id="train"))
    m = Metrics()
    with pytest.raises(
        OperatorError, match=r"verl stage 'old_log_prob' failed on a piece of 2 samples.*worker died"
    ):
        streaming.run_stages([("reward", tag), ("old_log_prob", broken)], piece, {}, m)
    assert piece.metrics == {"tagged": 2}  # the stage before it ran, once
    assert {"op/ingest/reward_s", "op/ingest/old_log_prob_s"} <= set(m.end_iteration())
