"""Bounded staleness in the ``conduit`` trainer mode (``max_staleness``, ``on_stale``, ``group_log``).

Fast tests of our own logic: the knobs, the group versions read from verl's sample tags, the
decision (the core FIFO's rule), the ledger's check and report, and the decision installed in a
real ``ReplayBufferAsync`` (its state filled by hand: no TransferQueue). End to end:
``test_staleness_e2e.py`` (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402

from conduit.buffer.samplers import is_stale  # noqa: E402
from conduit.errors import ConfigError  # noqa: E402


def _cfg(knobs: dict | None):
    v1: dict = {"trainer_mode": "conduit"}
    if knobs is not None:
        v1["conduit"] = knobs
    return OmegaConf.create({"trainer": {"v1": v1}})


def _tag(step: int, lo: int | None, hi: int | None = None, **extra) -> dict:
    return {
        "global_steps": step,
        "min_global_steps": lo,
        "max_global_steps": lo if hi is None else hi,
        **extra,
    }


# -- knobs -------------------------------------------------------------------------------------


def test_knob_defaults_and_values() -> None:
    from conduit_verl.config import ConduitTrainerConfig

    default = ConduitTrainerConfig.from_verl(_cfg(None))
    assert (default.max_staleness, default.on_stale, default.group_log) == (0, "drop", None)
    got = ConduitTrainerConfig.from_verl(
        _cfg({"max_staleness": 2, "on_stale": "recompute", "group_log": "g.jsonl"})
    )
    assert (got.max_staleness, got.on_stale, got.group_log) == (2, "recompute", "g.jsonl")


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"max_staleness": -1}, "max_staleness must be an int >= 0"),
        ({"max_staleness": 1.5}, "max_staleness must be an int >= 0"),
        ({"max_staleness": True}, "max_staleness must be an int >= 0"),
        ({"max_staleness": 1, "on_stale": "keep"}, "on_stale must be 'drop' or 'recompute'"),
        ({"group_log": ""}, "group_log must be a file path or null"),
        ({"max_staleness": 1, "overlap": "sync"}, "max_staleness=1 needs overlap=async"),
        ({"on_stale": "recompute"}, "on_stale applies with max_staleness >= 1"),
        ({"overlap": "sync", "group_log": "g.jsonl"}, "group_log does not apply with overlap=sync"),
    ],
)
def test_bad_knobs_are_named(knobs: dict, match: str) -> None:
    from conduit_verl.config import ConduitTrainerConfig

    with pytest.raises(ConfigError, match=match):
        ConduitTrainerConfig.from_verl(_cfg(knobs))


def test_running_ahead_journals_when_verl_checkpoints() -> None:
    from conduit_verl.config import ConduitTrainerConfig

    assert ConduitTrainerConfig().journal_on(save_freq=5)
    assert ConduitTrainerConfig(max_staleness=1).journal_on(save_freq=5)
    assert not ConduitTrainerConfig(max_staleness=1).journal_on(save_freq=-1)
    assert not ConduitTrainerConfig(max_staleness=1, journal=False).journal_on(save_freq=5)


def test_what_running_ahead_refuses_at_trainer_start() -> None:
    from conduit_verl.config import ConduitTrainerConfig
    from conduit_verl.trainer import _check_staleness

    def config(save_freq: int, bypass: bool) -> object:
        return OmegaConf.create(
            {
                "trainer": {"save_freq": save_freq},
                "algorithm": {"rollout_correction": {"bypass_mode": bypass}},
            }
        )

    _check_staleness(config(5, True), ConduitTrainerConfig())  # k = 0: anything goes
    _check_staleness(config(-1, True), ConduitTrainerConfig(max_staleness=1))  # drop + bypass: fine
    _check_staleness(config(5, False), ConduitTrainerConfig(max_staleness=1))  # checkpoints: ahead.py
    with pytest.raises(ConfigError, match="bypass_mode=true takes them from the rollout"):
        _check_staleness(config(-1, True), ConduitTrainerConfig(max_staleness=1, on_stale="recompute"))


def test_running_ahead_has_its_own_tuner_signature(tmp_path: Path) -> None:
    from conduit_verl.trainer import _piece_tuning

    config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}})
    plain, ahead = (_piece_tuning(config, str(tmp_path), 16, 8, *a).workload for a in ((), (True, 2)))
    assert plain is not None and plain.algorithm == "verl/grpo/n8"
    assert ahead is not None and ahead.algorithm == "verl/grpo/n8/separate/k2"


# -- the schedule: colocate_async's on shared hardware, separate_async's on the rollout's own ------


class _Manager:
    """Records what the trainer asks of verl's checkpoint-engine manager."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, *args))


def _hooked(hardware: str, k: int):
    from conduit_verl.config import ConduitTrainerConfig
    from conduit_verl.trainer import ConduitTrainer

    trainer = ConduitTrainer.__new__(ConduitTrainer)  # no verl setup: only the hooks are called
    trainer.conduit_config = ConduitTrainerConfig(max_staleness=k, rollout_hardware=hardware)
    trainer.checkpoint_manager = _Manager()
    trainer.timing_raw, trainer.global_steps = {}, 7
    trainer.curr_step_profile = False
    return trainer


def test_on_separate_hardware_generation_pauses_only_for_the_weight_push() -> None:
    trainer = _hooked("separate", 1)
    assert trainer.conduit_disaggregated()
    trainer.on_sample_end()
    assert trainer.checkpoint_manager.calls == []  # nothing aborted, nothing put to sleep
    trainer.on_step_end()
    assert trainer.checkpoint_manager.calls == [
        ("abort_replicas",),
        ("update_weights", 7),
        ("resume_generation_replicas",),
    ]
    assert trainer.timing_raw["update_weights"] >= 0


def test_on_shared_hardware_generation_pauses_for_the_step() -> None:
    trainer = _hooked("shared", 1)
    assert not trainer.conduit_disaggregated()
    trainer.on_sample_end()
    names = [c[0] for c in trainer.checkpoint_manager.calls]
    assert names == ["abort_replicas", "sleep_replicas"]  # colocate_async: paused at the sample's end
    trainer.on_step_end()
    names = [c[0] for c in trainer.checkpoint_manager.calls]
    assert names[2:] == ["update_weights", "resume_generation_replicas"]


def test_on_policy_never_runs_the_disaggregated_schedule() -> None:
    assert not _hooked("separate", 0).conduit_disaggregated()


# -- group versions and the decision -----------------------------------------------------------


def test_group_versions_take_the_oldest_and_newest_of_the_samples() -> None:
    from conduit_verl.staleness import GroupVersions, group_versions

    keys = ["a_0_0", "a_1_0", "b_0_0", "b_1_0", "pad_0_0"]
    tags = [_tag(3, 2), _tag(3, 1, 2), _tag(4, 3), _tag(4, None), {"is_padding": True}]
    got = group_versions(keys, tags)
    assert got == {
        "a": GroupVersions("a", generated=1, generated_max=2, submitted=3),
        # no version reported: the weights of the step it was submitted in (4 - 1 = 3)
        "b": GroupVersions("b", generated=3, generated_max=3, submitted=4),
    }


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_decision_is_the_core_fifo_rule(k: int) -> None:
    from conduit_verl.staleness import GroupVersions, stale_uids

    groups = [GroupVersions(f"g{v}", v, v, v + 1) for v in range(6)]
    consumer = 5
    want = {g.uid for g, s in zip(groups, is_stale(torch.arange(6), consumer, k).tolist(), strict=True) if s}
    assert stale_uids(groups, consumer, k) == want
    assert stale_uids(groups, consumer, k) == {f"g{v}" for v in range(6) if v + k < consumer}
    assert stale_uids([], consumer, k) == set()


def test_replay_buffer_decision_drops_only_under_drop() -> None:
    from conduit_verl.staleness import replay_buffer_decision

    groups = {"old": {"old_0_0": _tag(1, 0)}, "new": {"new_0_0": _tag(3, 2)}}
    # step 4 trains version 3: version 0 is 3 behind, version 2 is 1 behind
    assert replay_buffer_decision(1, "drop")(groups, 4) == {"old"}
    assert replay_buffer_decision(3, "drop")(groups, 4) == set()
    assert replay_buffer_decision(1, "recompute")(groups, 4) == set()


# -- the ledger ----------------------------------------------------------------------------------


def test_ledger_records_checks_and_reports(tmp_path: Path) -> None:
    from conduit_verl.errors import StaleGroupError
    from conduit_verl.staleness import StalenessLedger, read_group_log

    log = tmp_path / "groups.jsonl"
    ledger = StalenessLedger(1, "drop", str(log))
    # step 3 trains version 2: versions 2 (lag 0) and 1 (lag 1) are within k=1
    assert ledger.admit(["a_0_0", "a_1_0", "b_0_0"], [_tag(3, 2), _tag(3, 2), _tag(2, 1)], 3) == 0
    ledger.dropped(2)
    with pytest.raises(StaleGroupError, match=r"max_staleness=1.*c generated by version 0"):
        ledger.admit(["c_0_0"], [_tag(1, 0)], 3)
    m = ledger.end_step(3)
    assert m["conduit/stale_dropped"] == 2 and m["conduit/stale_recomputed"] == 0
    assert (m["conduit/staleness/min"], m["conduit/staleness/median"], m["conduit/staleness/max"]) == (
        0,
        0.5,
        1,
    )
    assert m["conduit/staleness/groups"] == 2 and m["conduit/max_staleness"] == 1
    rows = read_group_log(log)
    assert [(r["uid"], r["generated"], r["trained"], r["staleness"]) for r in rows] == [
        ("a", 2, 2, 0),
        ("b", 1, 2, 1),
    ]
    assert ledger.end_step(4) == {
        "conduit/max_staleness": 1.0,
        "conduit/stale_dropped": 0.0,
        "conduit/stale_recomputed": 0.0,
        "conduit/staleness/groups": 0.0,
    }  # a new step starts empty
    assert len(log.read_text().splitlines()) == 2


def test_ledger_under_recompute_trains_and_counts_stale_groups() -> None:
    from conduit_verl.staleness import StalenessLedger

    ledger = StalenessLedger(1, "recompute")
    assert ledger.admit(["c_0_0", "d_0_0"], [_tag(1, 0), _tag(3, 2)], 3) == 1
    m = ledger.end_step(3)
    assert m["conduit/stale_recomputed"] == 1 and m["conduit/staleness/max"] == 2


# -- the decision inside verl's own async replay buffer ---------------------------------------


def _async_buffer(threshold: int | None = 8):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    return ReplayBufferAsync(
        trainer_mode="colocate_async",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=threshold,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
    )


def _fill(buffer, groups: dict[str, tuple[int, int | None]], status: str = "finished") -> None:
    """Prompt groups ``uid -> (submitted step, generating version)``, two samples each, as
    ``_sync_metadata_from_transfer_queue`` leaves them."""
    for uid, (step, version) in groups.items():
        getattr(buffer, f"{status}_keys")["train"].add(uid)
        buffer.prompt_global_steps["train"][uid] = step
        for s in range(2):
            buffer.partitions["train"][f"{uid}_{s}_0"] = _tag(step, version, status="success")


def test_gated_buffer_evicts_what_conduit_decides() -> None:
    from conduit_verl import compat
    from conduit_verl.staleness import replay_buffer_decision

    buffer = _async_buffer(threshold=8)
    assert compat.gate_replay_buffer(buffer, replay_buffer_decision(1, "drop")) == 8
    assert isinstance(buffer, compat.GatedReplayBuffer) and buffer.max_off_policy_threshold is None
    _fill(buffer, {"old": (1, 0), "edge": (2, 1), "new": (3, 2)})
    _fill(buffer, {"running": (1, 0)}, status="running")  # not terminal: never evicted
    # step 3 trains version 2: "old" (version 0) is 2 behind
    stale, dapo, failed, _ = buffer._terminal_eviction_reasons(3, "train")
    assert (stale, dapo, failed) == ({"old"}, set(), set())
    assert buffer._sampleable_terminal_keys("train", (stale, dapo, failed, None)) == {"edge", "new"}
    assert buffer._stale_terminal_keys(3, "val") == set()
    # verl's own rule would have kept "old" (its span 3 is within its threshold 8): it is off
    assert buffer._terminal_eviction_reasons(9, "train")[0] == {"old", "edge", "new"}


def test_gate_refuses_a_buffer_that_is_not_verls_async_one() -> None:
    from conduit_verl import compat
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    sync = ReplayBuffer(
        trainer_mode="sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
    )
    with pytest.raises(ConfigError, match="needs verl's built-in async replay buffer, got ReplayBuffer"):
        compat.gate_replay_buffer(sync, lambda groups, step: set())


def test_evicted_groups_reads_verls_eviction_metrics() -> None:
    from conduit_verl import compat

    assert compat.evicted_groups({}) == (0, 0)
    metrics = {
        "training/off_policy/evicted_samples": 2,
        "training/rollout_failure/evicted_samples": 1,
        "training/filter_groups/evicted_samples": 3,
        "training/off_policy/evicted_samples_staleness/max": 4.0,
    }
    assert compat.evicted_groups(metrics) == (2, 6)


def test_group_log_rows_are_json(tmp_path: Path) -> None:
    from conduit_verl.staleness import StalenessLedger

    ledger = StalenessLedger(0, group_log=str(tmp_path / "sub" / "g.jsonl"))
    ledger.admit(["a_0_0"], [_tag(1, 0)], 1)
    ledger.end_step(1)
    row = json.loads((tmp_path / "sub" / "g.jsonl").read_text())
    assert row == {
        "step": 1,
        "uid": "a",
        "submitted": 1,
        "generated": 0,
        "generated_max": 0,
        "trained": 0,
        "staleness": 0,
        "over_bound": False,
    }


def test_eviction_counts_add_up_over_pieces() -> None:
    """verl's eviction metrics come per sample call (per piece here): counts add, extremes stay."""
    from conduit_verl.streaming import merge_metrics

    stale = "training/off_policy/evicted_samples"
    worst = "training/off_policy/evicted_samples_staleness"
    got = merge_metrics(
        [
            (16, {stale: 1, f"{worst}/max": 3.0, f"{worst}/min": 3.0, "actor/entropy": 1.0}),
            (8, {"actor/entropy": 4.0}),
            (16, {stale: 2, f"{worst}/max": 2.0, f"{worst}/min": 2.0, "actor/entropy": 1.0}),
        ]
    )
    assert got[stale] == 3 and got[f"{worst}/max"] == 3.0 and got[f"{worst}/min"] == 2.0
    assert got["actor/entropy"] == pytest.approx(64 / 40)  # others: the sample-weighted mean, as before
