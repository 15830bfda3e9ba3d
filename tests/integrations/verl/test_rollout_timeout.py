"""The streaming wait never hangs: a group that never finishes ends the wait by policy, with a log.

Most tests drive ``GroupWait`` against a scripted stand-in for verl's replay buffer (our own logic);
the Ray test uses a real completion-channel actor that stops answering.
"""

from __future__ import annotations

import logging
import time

import pytest
from omegaconf import OmegaConf

pytest.importorskip("verl")
ray = pytest.importorskip("ray")

from conduit_verl import group_wait  # noqa: E402
from conduit_verl.config import ConduitTrainerConfig  # noqa: E402
from conduit_verl.errors import RolloutTimeoutError  # noqa: E402
from conduit_verl.group_wait import GroupWait  # noqa: E402

from conduit.errors import ConduitError, ConfigError  # noqa: E402


class _Rollouts:
    """verl's replay buffer as the wait reads it: group ``uid{i}`` finishes ``finish_s[i]`` seconds
    after the start (``None``: never — a hung request)."""

    def __init__(self, finish_s: list[float | None]) -> None:
        self.finish_s = finish_s
        self.t0 = time.monotonic()
        self.finished_keys: dict[str, set[str]] = {}
        self.failure_keys: dict[str, set[str]] = {}
        self.pending_keys: dict[str, set[str]] = {}
        self.running_keys: dict[str, set[str]] = {}

    def _sync_metadata_from_transfer_queue(self) -> None:
        now = time.monotonic() - self.t0
        done = {f"uid{i}" for i, t in enumerate(self.finish_s) if t is not None and t <= now}
        self.finished_keys = {"train": done}
        self.running_keys = {"train": {f"uid{i}" for i in range(len(self.finish_s))} - done}


def wait(**kw) -> GroupWait:
    kw = {"timeout_s": 0.5, "log_every_s": 0.1, "poll_s": 0.01, **kw}
    return GroupWait(None, **kw)


def test_a_hung_group_raises_within_the_timeout_naming_it(caplog) -> None:
    rollouts = _Rollouts([0.0, 0.05, 0.1, None])
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=group_wait.__name__):
        with pytest.raises(RolloutTimeoutError, match=r"no prompt group finished for 0.5s.*uid3") as err:
            wait().next_piece(rollouts, piece_groups=4, remaining=4)
    assert 0.5 <= time.monotonic() - t0 < 3.0
    assert isinstance(err.value, ConduitError)
    assert "3 ready" in str(err.value)
    lines = [r.getMessage() for r in caplog.records if "unfinished: uid3" in r.getMessage()]
    assert len(lines) >= 2, "the wait logs what is pending while it waits"


def test_slow_but_progressing_generation_is_not_a_timeout() -> None:
    rollouts = _Rollouts([0.3, 0.6, 0.9, 1.2])  # 1.2 s in all, never 0.5 s without a finish
    assert wait().next_piece(rollouts, piece_groups=4, remaining=4) == 4


@pytest.mark.parametrize(("unit", "taken"), [(1, 3), (2, 2)])
def test_drop_takes_the_whole_groups_that_finished(unit: int, taken: int) -> None:
    rollouts = _Rollouts([0.0, 0.0, 0.0, None])
    w = wait(on_timeout="drop", unit=unit)
    assert w.next_piece(rollouts, piece_groups=4, remaining=4) == taken
    assert w.short


def test_drop_with_nothing_finished_still_raises() -> None:
    with pytest.raises(RolloutTimeoutError, match="unfinished groups: uid0, uid1"):
        wait(on_timeout="drop").next_piece(_Rollouts([None, None]), piece_groups=1, remaining=2)


def test_drop_after_earlier_pieces_ends_the_step_with_them() -> None:
    w = wait(on_timeout="drop")
    assert w.next_piece(_Rollouts([0.0, 0.0, None, None]), piece_groups=2, remaining=4) == 2
    w.took(2)
    rest = _Rollouts([None, None])
    assert w.next_piece(rest, piece_groups=2, remaining=2) == 0  # nothing more: the step ends with 2
    assert w.short
    w.step_finish_times(0.0)  # the next step starts: nothing taken in it yet
    with pytest.raises(RolloutTimeoutError):
        w.next_piece(rest, piece_groups=2, remaining=2)


@pytest.mark.parametrize(("multiple", "taken"), [(1, 3), (2, 2), (3, 3)])
def test_drop_keeps_whole_actor_mini_batches(multiple: int, taken: int) -> None:
    # verl's update splits the batch into ppo_mini_batch_size groups and refuses a remainder
    w = wait(on_timeout="drop", keep_multiple=multiple)
    assert w.next_piece(_Rollouts([0.0, 0.0, 0.0, None]), piece_groups=4, remaining=4) == taken


def test_drop_that_cannot_keep_a_whole_mini_batch_raises_naming_it() -> None:
    # the default actor mini-batch is the whole batch: nothing short of it can be trained
    with pytest.raises(RolloutTimeoutError, match=r"not a whole number of 4.*ppo_mini_batch_size.*uid3"):
        wait(on_timeout="drop", keep_multiple=4).next_piece(
            _Rollouts([0.0, 0.0, 0.0, None]), piece_groups=4, remaining=4
        )


def test_drop_after_a_piece_that_breaks_the_multiple_raises() -> None:
    w = wait(on_timeout="drop", keep_multiple=2)
    assert w.next_piece(_Rollouts([0.0, 0.0, 0.0, None]), piece_groups=3, remaining=4) == 3
    w.took(3)
    with pytest.raises(RolloutTimeoutError, match="not a whole number of 2"):
        w.next_piece(_Rollouts([None]), piece_groups=1, remaining=1)


# -- the knobs ----------------------------------------------------------------------------------


def _verl(knobs: dict):
    cfg = OmegaConf.create({"trainer": {"v1": {"trainer_mode": "conduit", "conduit": knobs}}})
    OmegaConf.set_struct(cfg, True)
    return cfg


def test_timeout_knobs_from_hydra() -> None:
    got = ConduitTrainerConfig.from_verl(_verl({"rollout_timeout_s": 30, "on_timeout": "drop"}))
    assert (got.rollout_timeout_s, got.on_timeout) == (30, "drop")
    assert ConduitTrainerConfig().rollout_timeout_s == 600.0 and ConduitTrainerConfig().on_timeout == "error"


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        ({"rollout_timeout_s": 0}, "rollout_timeout_s must be a finite number > 0"),
        ({"rollout_timeout_s": float("inf")}, "rollout_timeout_s must be a finite number > 0"),
        ({"rollout_timeout_s": "10"}, "rollout_timeout_s must be a finite number > 0"),
        ({"rollout_timeout_s": True}, "rollout_timeout_s must be a finite number > 0"),
        ({"on_timeout": "retry"}, "on_timeout must be 'error' or 'drop'"),
        ({"poll_interval_s": "fast"}, "poll_interval_s must be a finite number > 0"),
        ({"rollout_timeout": 5}, r"Unknown key trainer\.v1\.conduit\.rollout_timeout"),
        ({"overlap": "sync", "on_timeout": "drop"}, "does not apply with overlap=sync"),
    ],
)
def test_bad_timeout_knobs(knobs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ConduitTrainerConfig.from_verl(_verl(knobs))


# -- a completion channel that stops answering (a real Ray actor) -------------------------------


@ray.remote(num_cpus=0)
class _HungChannel:
    """Answers the first count, then never again (a wedged actor, not a dead one)."""

    async def wait(self, partition_id: str, at_least: int, timeout_s: float) -> int:
        import asyncio

        if at_least == 0:
            return 0
        await asyncio.sleep(3600)
        return 0


@pytest.mark.ray
def test_a_hung_channel_falls_back_to_polling_and_still_times_out(ray_shared, monkeypatch) -> None:
    monkeypatch.setattr(group_wait, "CHANNEL_GRACE_S", 0.5)
    monkeypatch.setattr(group_wait, "CHANNEL_TIMEOUT_S", 0.2)
    hung = _HungChannel.remote()
    try:
        w = GroupWait(hung, timeout_s=1.5, log_every_s=0.5, poll_s=0.01)
        t0 = time.monotonic()
        with pytest.raises(RolloutTimeoutError, match="uid1"):
            w.next_piece(_Rollouts([0.0, None]), piece_groups=2, remaining=2)
        assert w.channel is None  # gave up on the channel, polled TQ instead of hanging
        assert time.monotonic() - t0 < 6.0
    finally:
        ray.kill(hung)
