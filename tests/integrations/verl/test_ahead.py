"""What a checkpoint keeps of the prompts drawn ahead (max_staleness >= 1): the rows, the file, the
resume's own logic against a recording stand-in for TransferQueue (no verl run; the end-to-end kill
case is test_resume_kill.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conduit_verl import ahead
from conduit_verl.ahead import AheadRows, kept_keys
from conduit_verl.journal import JournalGroup, JournalWriter, journal_root, journaled_steps, prune

from conduit.errors import CheckpointError


def _listing() -> dict[str, dict]:
    """A train partition at a checkpoint: t1 trained this step; a finished ahead; p pending; r running
    (a partial trajectory); f failed."""
    return {
        "t1": {"is_prompt": True, "status": "finished", "global_steps": 3},
        "t1_0_0": {"status": "success", "global_steps": 3},
        "a": {"is_prompt": True, "status": "finished", "global_steps": 3},
        "a_0_0": {"status": "success", "global_steps": 3, "min_global_steps": 2, "max_global_steps": 3},
        "a_1_0": {"status": "success", "global_steps": 3, "min_global_steps": 3, "max_global_steps": 3},
        "p": {"is_prompt": True, "status": "pending", "global_steps": 3},
        "r": {"is_prompt": True, "status": "running", "global_steps": 3},
        "r_0_0": {"status": "running", "global_steps": 3},
        "f": {"is_prompt": True, "status": "failure", "global_steps": 3},
    }


def test_kept_keys_are_the_untrained_prompts_and_the_finished_trajectories() -> None:
    prompts, trajectories = kept_keys(_listing(), ["t1_0_0"])
    assert prompts == ["a", "f", "p", "r"]
    assert trajectories == ["a_0_0", "a_1_0"]  # r's partial trajectory is re-generated, not kept


def _rows() -> AheadRows:
    prompt_fields = {
        "raw_prompt": [{"role": "user", "content": "1+2="}],
        "index": np.int64(7),
        "input_ids": torch.arange(5),
        "extra_info": {"answer": "3", "split": "train"},
    }
    traj = {"responses": torch.tensor([4, 5, 6]), "rm_scores": torch.tensor([0.0, 0.0, 1.0])}
    listing = _listing()
    keys = ["a", "p", "a_0_0"]
    return AheadRows(3, keys, [listing[k] for k in keys], [None, prompt_fields, traj])


def test_rows_round_trip_through_the_file(tmp_path) -> None:
    rows = _rows()
    assert ahead.write(tmp_path / "global_step_3", rows) > 0
    back = ahead.read(tmp_path / "global_step_3")
    assert back is not None and (back.step, back.keys, back.tags) == (3, rows.keys, rows.tags)
    assert back.samples[0] is None
    assert back.samples[1]["raw_prompt"] == rows.samples[1]["raw_prompt"]
    assert torch.equal(back.samples[1]["input_ids"], torch.arange(5)) and back.samples[1]["index"] == 7
    assert torch.equal(back.samples[2]["responses"], torch.tensor([4, 5, 6]))
    assert back.prompts(["pending", "running"]) == ["p"] and back.prompts() == ["a", "p"]
    assert [p.name for p in (tmp_path / "global_step_3").iterdir()] == [ahead.AHEAD_FILE]  # no temp left


def test_no_file_is_none_and_a_damaged_file_is_named(tmp_path) -> None:
    assert ahead.read(tmp_path) is None
    ahead.write(tmp_path, _rows())
    path = tmp_path / ahead.AHEAD_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="conduit_ahead.cdr: damaged.*earlier checkpoint"):
        ahead.read(tmp_path)
    path.write_bytes(bytes(data[: len(data) // 3]))  # torn
    with pytest.raises(CheckpointError, match="damaged"):
        ahead.read(tmp_path)


def test_a_symlinked_or_foreign_file_is_refused(tmp_path) -> None:
    other = tmp_path / "elsewhere"
    ahead.write(other, _rows())
    (tmp_path / "ck").mkdir()
    os.symlink(other / ahead.AHEAD_FILE, tmp_path / "ck" / ahead.AHEAD_FILE)
    with pytest.raises(CheckpointError, match="symbolic link"):
        ahead.read(tmp_path / "ck")
    from conduit.persist.format import frame

    (tmp_path / "f").mkdir()
    (tmp_path / "f" / ahead.AHEAD_FILE).write_bytes(b"".join(bytes(p) for p in frame({"kind": "x"}, [])))
    with pytest.raises(CheckpointError, match="not Conduit's ahead rows"):
        ahead.read(tmp_path / "f")
    rec = _rows().record()
    meta_bad = AheadRows(3, ["a", "b"], [{}], [None])  # keys and tags do not line up
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / ahead.AHEAD_FILE).write_bytes(b"".join(bytes(p) for p in meta_bad.record()))
    with pytest.raises(CheckpointError, match="do not line up"):
        ahead.read(tmp_path / "g")
    assert rec  # the good record still encodes


class _FakeTQ:
    """Records TransferQueue puts and serves one listing (unit test of the resume's own logic)."""

    def __init__(self, listing: dict | None = None, data: dict | None = None) -> None:
        self.listing, self.data, self.puts = listing or {}, data or {}, []

    def kv_list(self, partition_id):
        return {partition_id: self.listing}

    def kv_batch_get(self, keys, partition_id):
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        return list_of_dict_to_tensordict([self.data[k] for k in keys])

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.puts.append({"keys": list(keys), "fields": fields, "tags": tags})


def _journaled(uid: str, step: int, versions: tuple[int, int]) -> JournalGroup:
    samples = [{"responses": torch.tensor([1, 2, i]), "uid": uid} for i in range(2)]
    tags = [
        {
            "status": "success",
            "global_steps": step,
            "min_global_steps": versions[0],
            "max_global_steps": versions[1],
        }
        for _ in range(2)
    ]
    return JournalGroup(f"id-{uid}", step, uid, ["0_0", "1_0"], samples, tags, 1.0)


def test_snapshot_reads_what_a_checkpoint_keeps(monkeypatch) -> None:
    pytest.importorskip("verl")
    import conduit_verl.resume as resume

    data = {
        "p": {"raw_prompt": [{"role": "user", "content": "x"}], "input_ids": torch.arange(3)},
        "r": {"raw_prompt": [{"role": "user", "content": "y"}], "input_ids": torch.arange(4)},
        "a_0_0": {"responses": torch.tensor([1, 2])},
        "a_1_0": {"responses": torch.tensor([3, 4])},
    }
    monkeypatch.setattr(resume, "tq", _FakeTQ(_listing(), data))
    rows = resume.snapshot_ahead(3, ["t1_0_0"])
    assert rows.keys == ["a", "f", "p", "r", "a_0_0", "a_1_0"]
    assert rows.samples[0] is None and rows.samples[1] is None  # finished / failed prompt: tags only
    assert rows.samples[2]["raw_prompt"] == [{"role": "user", "content": "x"}]
    assert torch.equal(rows.samples[5]["responses"], torch.tensor([3, 4]))


def test_restore_puts_rows_back_and_finishes_in_flight_prompts_journaled_with_old_weights(
    tmp_path, monkeypatch
):
    pytest.importorskip("verl")
    import conduit_verl.resume as resume

    listing = _listing()
    keys = ["a", "p", "r", "f", "a_0_0", "a_1_0"]
    prompt = {"raw_prompt": [{"role": "user", "content": "x"}], "input_ids": torch.arange(3)}
    samples = [
        None,
        prompt,
        dict(prompt),
        None,
        {"responses": torch.tensor([1])},
        {"responses": torch.tensor([2])},
    ]
    rows = AheadRows(3, keys, [dict(listing[k]) for k in keys], samples)
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    # p finished after the checkpoint on the checkpoint's weights (3); r used version 4 (lost)
    writer.append([_journaled("p", 3, (3, 3)), _journaled("r", 3, (3, 4)), _journaled("zz", 3, (3, 3))])
    writer.close()
    fake = _FakeTQ()
    monkeypatch.setattr(resume, "tq", fake)
    report = resume.restore_ahead(rows, root, version=3)

    assert (report.prompts, report.finished, report.from_journal, report.newer_weights) == (4, 2, 1, 1)
    put = {k: (t, i) for p in fake.puts for i, (k, t) in enumerate(zip(p["keys"], p["tags"], strict=True))}
    assert set(put) == {"a", "p", "r", "f", "a_0_0", "a_1_0", "p_0_0", "p_1_0"}  # zz: no such prompt here
    assert put["p"][0]["status"] == "finished" and put["r"][0]["status"] == "running"
    # rows with fields went with their fields, grouped by field set; the rest as tags alone
    by_keys = {tuple(p["keys"]): p for p in fake.puts}
    assert by_keys[("a", "f")]["fields"] is None
    assert torch.equal(by_keys[("p", "r")]["fields"]["input_ids"][0], torch.arange(3))
    # every kept row put back exactly once
    flat = [k for p in fake.puts for k in p["keys"]]
    assert len(flat) == len(set(flat))


def test_the_version_filter_and_the_prune_on_resume(tmp_path) -> None:
    from conduit_verl.resume import prune_on_start, usable_at

    groups = [_journaled("a", 4, (3, 3)), _journaled("b", 4, (3, 4)), _journaled("c", 4, (4, 4))]
    kept, newer = usable_at(groups, 3)
    assert [g.uid for g in kept] == ["a"] and newer == 2
    assert usable_at(groups, None) == (groups, 0)
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    writer.append([_journaled(u, s, (s - 1, s - 1)) for u, s in (("x", 2), ("y", 3), ("z", 4), ("w", 5))])
    writer.close()
    # resumed at step 3's checkpoint, first submission at step 4: 4 kept, 5 (drawn after it) and <= 3 gone
    assert prune_on_start(root, 4, "auto") == [2, 3, 5]
    assert journaled_steps(root) == [4]
    assert prune(root, 10) == [4]
