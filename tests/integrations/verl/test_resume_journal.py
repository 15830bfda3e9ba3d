"""The rollout journal's own logic: records, torn tails, pruning, prompt matching, the knob (no verl run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conduit_verl.config import ConduitTrainerConfig
from conduit_verl.journal import (
    JournalGroup,
    JournalWriter,
    journal_root,
    journaled_steps,
    match,
    prompt_identity,
    prune,
    read_step,
    step_dir,
)

from conduit.errors import ConfigError


def _group(identity: str, step: int, n: int = 2, seed: int = 0) -> JournalGroup:
    g = torch.Generator().manual_seed(seed)
    samples = [
        {
            "responses": torch.randint(0, 100, (3 + i,), generator=g),
            "rm_scores": torch.rand(3 + i, generator=g),
            "uid": f"u{seed}",
            "raw_prompt": [{"role": "user", "content": f"{seed}+1="}],
            "extra_fields": {"min_global_steps": None, "turns": [1, 2]},
            "index": np.int64(seed),
        }
        for i in range(n)
    ]
    tags = [{"status": "success", "response_len": 3 + i, "global_steps": step} for i in range(n)]
    return JournalGroup(identity, step, f"u{seed}", [f"{i}_0" for i in range(n)], samples, tags, 1.5)


def test_groups_round_trip_through_the_journal(tmp_path):
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    groups = [_group("0:a", 3, seed=0), _group("1:b", 3, seed=1), _group("2:c", 4, seed=2)]
    assert writer.append(groups[:2]) > 0
    writer.append(groups[2:])
    writer.close()
    assert journaled_steps(root) == [3, 4]
    got, problems = read_step(root, 3)
    assert problems == []
    assert [g.identity for g in got] == ["0:a", "1:b"]
    for want, have in zip(groups[:2], got, strict=True):
        assert have.suffixes == want.suffixes and have.tags == want.tags and have.step == 3
        for a, b in zip(want.samples, have.samples, strict=True):
            assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["rm_scores"], b["rm_scores"])
            assert b["raw_prompt"] == a["raw_prompt"] and b["extra_fields"] == a["extra_fields"]
            assert b["index"] == a["index"]


def test_a_torn_tail_record_is_skipped_with_a_warning_and_the_rest_kept(tmp_path, caplog):
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    writer.append([_group("0:a", 5, seed=0), _group("1:b", 5, seed=1)])
    writer.close()
    (path,) = step_dir(root, 5).iterdir()
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # a kill in the middle of the second record
    got, problems = read_step(root, 5)
    assert [g.identity for g in got] == ["0:a"]
    assert len(problems) == 1 and "truncated" in problems[0]
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF  # a corrupt byte: the checksum catches it
    path.write_bytes(bytes(flipped))
    got, problems = read_step(root, 5)
    assert [g.identity for g in got] == ["0:a"] and "checksum" in problems[0]


def test_prune_drops_the_steps_trained_into_a_checkpoint(tmp_path):
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    writer.append([_group("0:a", s, seed=s) for s in (1, 2, 3)])
    writer.close()
    assert prune(root, 2) == [1, 2]
    assert journaled_steps(root) == [3]
    assert read_step(root, 2) == ([], [])


def test_a_group_of_another_step_in_a_step_dir_is_ignored(tmp_path):
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    writer.append([_group("0:a", 6)])
    writer.close()
    (path,) = step_dir(root, 6).iterdir()
    other = step_dir(root, 7)
    other.mkdir()
    path.rename(other / path.name)
    got, problems = read_step(root, 7)
    assert got == [] and "step 6" in problems[0]


def test_match_takes_each_group_once_and_each_prompt_once():
    groups = [_group("a", 1, seed=0), _group("b", 1, seed=1), _group("b", 1, seed=2), _group("z", 1, seed=3)]
    kept, unused = match(["b", "c", "a", "b", "b"], groups)
    assert sorted(kept) == [0, 2, 3]
    assert kept[0].uid == "u1" and kept[3].uid == "u2" and kept[2].identity == "a"
    assert [g.identity for g in unused] == ["z"]
    # every prompt row is restored or generated, never both: kept rows + the rest == all rows
    rest = [i for i in range(5) if i not in kept]
    assert sorted([*kept, *rest]) == list(range(5))


def test_prompt_identity_is_stable_across_containers_and_tells_prompts_apart():
    msgs = [{"role": "user", "content": "1+2="}]
    a = prompt_identity(torch.tensor(4), np.array(msgs, dtype=object))
    assert a == prompt_identity(4, msgs) == prompt_identity(np.int64(4), tuple(msgs))
    assert a != prompt_identity(5, msgs)
    assert a != prompt_identity(4, [{"role": "user", "content": "1+3="}])


def test_writer_fsyncs_once_per_batch(tmp_path, monkeypatch):
    import conduit_verl.journal as journal

    calls = []
    real = journal.os.fsync
    monkeypatch.setattr(journal.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    writer = JournalWriter(journal_root(tmp_path))
    writer.append([_group("0:a", 1, seed=0)])  # new step dir: the dir and the file
    calls.clear()
    writer.append([_group(f"{i}:x", 1, seed=i) for i in range(8)])
    writer.close()
    assert len(calls) == 1


def test_journal_knob():
    assert ConduitTrainerConfig().journal_on(save_freq=1)
    assert not ConduitTrainerConfig().journal_on(save_freq=-1)
    assert ConduitTrainerConfig(journal=True).journal_on(save_freq=-1)
    assert not ConduitTrainerConfig(journal=False).journal_on(save_freq=5)
    assert not ConduitTrainerConfig(overlap="sync").journal_on(save_freq=5)
    with pytest.raises(ConfigError, match="journal"):
        ConduitTrainerConfig(journal=1)  # type: ignore[arg-type]


def test_split_samples_round_trips_through_verls_tensordict():
    pytest.importorskip("verl")
    from conduit_verl.journal_worker import split_samples
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    samples = _group("a", 1, n=3).samples
    for s in samples:
        s.pop("index")
    td = list_of_dict_to_tensordict(samples)
    back = split_samples(td, 3)
    for a, b in zip(samples, back, strict=True):
        assert torch.equal(a["responses"], b["responses"])
        assert b["raw_prompt"] == a["raw_prompt"] and b["uid"] == a["uid"]


def test_journal_with_sync_overlap_is_refused():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {"v1": {"conduit": {"overlap": "sync", "journal": True}}}})
    with pytest.raises(ConfigError, match="journal does not apply with overlap=sync"):
        ConduitTrainerConfig.from_verl(cfg)


class _FakeTQ:
    """Records TransferQueue puts (unit test of the resume's own logic)."""

    def __init__(self) -> None:
        self.puts: list[dict] = []

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.puts.append({"keys": list(keys), "partition_id": partition_id, "fields": fields, "tags": tags})


class _FakeChannel:
    def __init__(self) -> None:
        self.told = 0
        outer = self

        class _Finished:
            def remote(self, partition_id):
                assert partition_id == "train"
                outer.told += 1

        self.finished = _Finished()


def test_submit_restores_the_journaled_groups_and_generates_only_the_rest(tmp_path, monkeypatch):
    pytest.importorskip("verl")
    import conduit_verl.resume as resume
    from verl.utils import tensordict_utils as tu

    root = journal_root(tmp_path)
    msgs = [[{"role": "user", "content": f"{i}+1="}] for i in range(4)]
    ids = [prompt_identity(i, m) for i, m in enumerate(msgs)]
    writer = JournalWriter(root)
    writer.append([_group(ids[1], 3, seed=1), _group(ids[3], 3, seed=3), _group("9:elsewhere", 3, seed=9)])
    writer.close()
    batch = tu.get_tensordict(
        {
            "index": torch.arange(4),
            "raw_prompt": np.array(msgs + [[]], dtype=object)[:4],
            "uid": np.array([f"new{i}" for i in range(4)], dtype=object),
        }
    )
    fake, channel, sent = _FakeTQ(), _FakeChannel(), []
    monkeypatch.setattr(resume, "tq", fake)
    report = resume.submit_with_journal(root, 3, batch, lambda b: sent.append(b) or len(b), channel)

    assert (report.restored, report.generated, report.unused) == (2, 2, 1)
    (gen,) = sent
    assert list(gen["uid"]) == ["new0", "new2"]  # only the prompts without a journaled group
    traj, prompts = fake.puts
    assert traj["keys"] == ["new1_0_0", "new1_1_0", "new3_0_0", "new3_1_0"]
    assert list(traj["fields"]["uid"]) == ["new1", "new1", "new3", "new3"]  # the new draw's uid
    want = _group(ids[1], 3, seed=1).samples[0]["responses"]
    assert torch.equal(traj["fields"]["responses"][0], want)
    assert traj["tags"][0] == {"status": "success", "response_len": 3, "global_steps": 3}
    assert prompts["keys"] == ["new1", "new3"]
    assert all(t == {"is_prompt": True, "status": "finished", "global_steps": 3} for t in prompts["tags"])
    assert channel.told == 2
    # every prompt row restored or generated, exactly once
    assert sorted([*prompts["keys"], *gen["uid"]]) == [f"new{i}" for i in range(4)]


def test_groups_with_different_fields_are_restored_with_all_their_fields(tmp_path, monkeypatch):
    """verl builds a put's tensordict from its first row's keys: trajectories whose fields differ go
    in one put per field set, none losing a field (one put for all dropped or failed on them)."""
    pytest.importorskip("verl")
    import conduit_verl.resume as resume

    plain, extra = _group("0:a", 3, seed=0), _group("1:b", 3, seed=1)
    for sample in extra.samples:
        sample["ref_log_prob"] = torch.zeros(2)
    fake = _FakeTQ()
    monkeypatch.setattr(resume, "tq", fake)
    resume._restore({0: plain, 1: extra}, ["new0", "new1"], 3)

    first, second, prompts = fake.puts
    assert first["keys"] == ["new0_0_0", "new0_1_0"] and "ref_log_prob" not in first["fields"].keys()
    assert second["keys"] == ["new1_0_0", "new1_1_0"] and "ref_log_prob" in second["fields"].keys()
    assert prompts["keys"] == ["new0", "new1"]


def test_submit_without_a_journal_generates_everything(tmp_path, monkeypatch):
    import conduit_verl.resume as resume

    monkeypatch.setattr(resume, "tq", _FakeTQ())
    sent = []
    report = resume.submit_with_journal(journal_root(tmp_path), 1, ["a", "b"], lambda b: sent.append(b) or 2)
    assert (report.restored, report.generated) == (0, 2) and sent == [["a", "b"]]


def test_prune_on_start(tmp_path):
    from conduit_verl.resume import prune_on_start

    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    writer.append([_group("0:a", s, seed=s) for s in (2, 3, 4)])
    writer.close()
    # resumed from step 2's checkpoint: step 2 is in it; step 3's groups came from its weights; step 4's
    # (trainer.save_freq > 1: step 3 trained, then the kill) from step 3's weights, lost with the kill
    assert prune_on_start(root, 3, "auto") == [2, 4]
    assert prune_on_start(root, 1, "disable") == [3]  # a fresh run takes nothing of an earlier one
    assert journaled_steps(root) == []


def test_cpu_launcher_resume_flags():
    run = pytest.importorskip("conduit_verl_cpu.run")
    args, _ = run.parse_args(["--trainer-mode", "conduit", "--save-freq", "1", "--journal", "off"])
    out = run.resume_overrides(["data.seed=0", "trainer.save_freq=-1"], args)
    assert out == ["data.seed=0", "trainer.save_freq=1", "+trainer.v1.conduit.journal=false"]
    args, _ = run.parse_args(["--trainer-mode", "conduit"])
    assert run.resume_overrides(["trainer.save_freq=-1"], args) == ["trainer.save_freq=-1"]
    with pytest.raises(SystemExit):
        run.parse_args(["--trainer-mode", "sync", "--journal", "on"])


def test_a_corrupt_record_mid_file_loses_that_group_only(tmp_path):
    root = journal_root(tmp_path)
    writer = JournalWriter(root)
    writer.append([_group("0:a", 5, seed=0), _group("1:b", 5, seed=1), _group("2:c", 5, seed=2)])
    writer.close()
    (path,) = step_dir(root, 5).iterdir()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside the second record
    path.write_bytes(bytes(data))
    got, problems = read_step(root, 5)
    assert [g.identity for g in got] == ["0:a", "2:c"]  # the group after the damage is kept
    assert len(problems) == 1 and "checksum" in problems[0] and "skipped bytes" in problems[0]


def test_the_lag_file_stays_bounded(tmp_path, monkeypatch):
    pytest.importorskip("verl")
    import json

    import conduit_verl.journal as journal
    from conduit_verl.journal_worker import LAG_FILE, _JournalingWorker

    monkeypatch.setattr(journal, "LAG_MAX_BYTES", 4096)

    class _Worker:  # what _write uses of the worker
        _journal_root = journal_root(tmp_path)
        _journal_writer = JournalWriter(_journal_root)

    worker = _Worker()
    for i in range(300):  # a line per journaled batch
        _JournalingWorker._write(worker, [_group(f"{i}:x", i)])
    worker._journal_writer.close()
    lag = worker._journal_root / LAG_FILE
    assert lag.stat().st_size <= 4096 + 200
    lines = [json.loads(x) for x in lag.read_text().splitlines()]
    assert 10 < len(lines) < 300 and all(line["groups"] == 1 for line in lines)
