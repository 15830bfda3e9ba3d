"""EarlyRows: a step's finished responses ingested before their groups finish, each exactly once."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit_verl import compat  # noqa: E402
from conduit_verl.checks import row_unit  # noqa: E402
from conduit_verl.early_rows import EarlyRows  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402


def listing(done: dict[str, int], version: int = 3, running: tuple[str, ...] = ()) -> dict[str, dict]:
    """TransferQueue's kv_list of a partition: prompt keys, finished responses, running ones."""
    out: dict[str, dict] = {
        uid: {"is_prompt": True, "status": "running", "global_steps": version} for uid in "ab"
    }
    for key, steps in done.items():
        out[key] = {"status": "success", "global_steps": steps}
    for key in running:
        out[key] = {"status": "running"}
    return out


class _TQ:
    def __init__(self, partition: dict[str, dict]) -> None:
        self.partition = partition

    def kv_list(self, partition_id=None):  # noqa: ANN001
        return {partition_id: self.partition}


def test_finished_takes_this_steps_finished_responses_not_seen() -> None:
    early = EarlyRows(min_rows=2, row_unit=1)
    early.done.add("a_1_0")
    keys, tags = early.finished(
        listing({"a_0_0": 3, "a_1_0": 3, "b_0_0": 3, "b_1_0": 2}, running=("b_2_0",)), 3
    )
    assert keys == ["a_0_0", "b_0_0"]  # not a prompt, not done, not another version's, not running
    assert [t["global_steps"] for t in tags] == [3, 3]


@pytest.mark.parametrize(
    ("waiting", "min_rows", "unit", "taken"), [(3, 4, 2, 0), (5, 4, 2, 4), (7, 2, 2, 6), (8, 8, 8, 8)]
)
def test_ingest_takes_whole_units_once_enough_wait(monkeypatch, waiting, min_rows, unit, taken) -> None:  # noqa: ANN001
    monkeypatch.setattr(compat, "tq", _TQ(listing({f"a_{i}_0": 3 for i in range(waiting)})))
    early = EarlyRows(min_rows=min_rows, row_unit=unit)
    ran: list[KVBatchMeta] = []
    assert early.ingest(3, {"temperature": 1.0}, ran.append) == taken
    assert sum(len(m) for m in ran) == taken == early.rows == len(early.done)
    assert all(m.extra_info == {"temperature": 1.0} and m.partition_id == "train" for m in ran)
    assert early.ingest(3, {}, ran.append) == 0  # nothing new waits: the same rows never run twice


def test_rest_is_what_no_stage_saw_topped_up_to_whole_units() -> None:
    early = EarlyRows(min_rows=2, row_unit=2)
    piece = KVBatchMeta(
        keys=[f"a_{i}_0" for i in range(8)], tags=[{"i": i} for i in range(8)], partition_id="train"
    )
    early.done.update(["a_0_0", "a_3_0", "a_4_0", "a_5_0", "a_6_0"])
    rest = early.rest(piece)
    assert rest is not None and len(rest) % 2 == 0
    assert {"a_1_0", "a_2_0", "a_7_0"} <= set(rest.keys) and len(rest) == 4  # one done row computed again
    assert [t["i"] for t in rest.tags] == [int(k.split("_")[1]) for k in rest.keys]  # tags follow keys
    assert early.rest(piece) is None  # every row done now
    whole = KVBatchMeta(keys=["b_0_0", "b_1_0"], tags=[{}, {}], partition_id="train")
    assert early.rest(whole) is whole  # nothing done early: the piece as it is


def test_a_step_runs_every_response_once_whatever_the_finish_order(monkeypatch) -> None:  # noqa: ANN001
    """Simulated step: responses finish in random order; early calls and group pieces together run
    the per-sample stages on every response, and again only to top a piece up to whole units."""
    rng = random.Random(0)
    n, groups, unit = 4, 6, 2
    keys = [f"g{g}_{s}_0" for g in range(groups) for s in range(n)]
    order = keys[:]
    rng.shuffle(order)
    early = EarlyRows(min_rows=4, row_unit=unit)
    runs: dict[str, int] = dict.fromkeys(keys, 0)

    def run(meta: KVBatchMeta) -> None:
        for k in meta.keys:
            runs[k] += 1

    finished: dict[str, int] = {}
    sampled: set[int] = set()
    for i, key in enumerate(order, 1):
        finished[key] = 3
        monkeypatch.setattr(compat, "tq", _TQ(listing(finished)))
        if i % 3 == 0:
            early.ingest(3, {}, run)
        for g in range(groups):  # a group finished: its piece runs what is left
            members = [k for k in keys if k.startswith(f"g{g}_")]
            if g not in sampled and all(k in finished for k in members):
                sampled.add(g)
                rest = early.rest(KVBatchMeta(keys=members, tags=[{}] * n, partition_id="train"))
                if rest is not None:
                    run(rest)
    assert sampled == set(range(groups))
    assert min(runs.values()) == 1 and sum(runs.values()) - len(keys) <= groups * (unit - 1)


def test_row_unit_is_whole_micro_batches_on_every_rank() -> None:
    assert row_unit({"rollout": 4, "ref": 6}, dp=2) == 24
    assert row_unit({"rollout": None}, dp=4) == 1  # dynamic batch size: any number of rows


def test_bad_sizes_refused() -> None:
    with pytest.raises(ValueError, match="multiple"):
        EarlyRows(min_rows=3, row_unit=2)


def test_a_whole_batch_step_runs_no_early_rows_and_one_pass(monkeypatch) -> None:  # noqa: ANN001
    """The policy's "whole" arm is verl's schedule: ``begin_step(active=False)`` turns early rows off
    for the step, and the step's one piece runs every stage in one chain (not per-sample stages, then
    the advantage); the next streamed step turns them on again."""
    from types import SimpleNamespace

    from conduit_verl import streaming

    chains: list[list[str]] = []
    monkeypatch.setattr(streaming, "sample_stages", lambda t: [("old_log_prob", None), ("ref", None)])
    monkeypatch.setattr(streaming, "advantage_stage", lambda t: ("adv", None))
    monkeypatch.setattr(streaming, "run_stages", lambda st, p, r, m: chains.append([n for n, _ in st]) or 0)
    early = EarlyRows(min_rows=2, row_unit=1)
    trainer = SimpleNamespace(conduit_early=early)
    piece = streaming._Piece(KVBatchMeta(keys=["a_0_0", "a_1_0"], tags=[{}, {}], partition_id="train"))
    early.begin_step(active=False)
    assert not early.active and early.rows == 0
    streaming.ingest_piece(trainer, piece, {}, None)
    assert chains == [["old_log_prob", "ref", "adv"]]
    chains.clear()
    early.begin_step(active=True)
    early.done.add("a_0_0")  # ingested early this step
    streaming.ingest_piece(trainer, piece, {}, None)
    assert chains == [["old_log_prob", "ref"], ["adv"]]  # the rest's per-sample stages, then the advantage
