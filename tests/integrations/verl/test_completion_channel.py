"""The completion channel: the streaming wait wakes when a group finishes, not on a timer."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("verl")
ray = pytest.importorskip("ray")

from conduit_verl import group_wait  # noqa: E402
from conduit_verl.completion import CompletionChannel  # noqa: E402
from conduit_verl.group_wait import GroupWait  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def channel(ray_shared):
    handle = CompletionChannel.remote()
    yield handle
    ray.kill(handle)


def test_wait_wakes_on_finish_and_times_out(channel) -> None:
    t0 = time.perf_counter()
    assert ray.get(channel.wait.remote("p1", 1, 0.2)) == 0  # nothing finished: returns at the timeout
    assert time.perf_counter() - t0 >= 0.2

    woke: list[float] = []

    def waiter() -> None:
        ray.get(channel.wait.remote("p1", 2, 30.0))
        woke.append(time.perf_counter())

    thread = threading.Thread(target=waiter)
    thread.start()
    ray.get(channel.finished.remote("p1"))
    time.sleep(0.3)
    assert not woke, "woke before the second group finished"
    t_finish = time.perf_counter()
    ray.get(channel.finished.remote("p1"))
    thread.join(10.0)
    assert woke and woke[0] - t_finish < 2.0  # woken by the event, long before the 30 s timeout
    assert ray.get(channel.wait.remote("p2", 0, 0.0)) == 0  # partitions are counted apart


def test_group_wait_takes_every_finished_group(channel) -> None:
    wait = GroupWait(channel, partition_id="p3")
    for _ in range(3):
        ray.get(channel.finished.remote("p3"))
    assert wait.next_piece(None, piece_groups=1, remaining=4) == 3  # generation ran ahead: take all three
    wait.took(3)
    ray.get(channel.finished.remote("p3"))
    assert wait.next_piece(None, piece_groups=2, remaining=1) == 1  # never more than what is left
    wait.took(1)
    assert len(wait.step_finish_times(0.0)) == 4  # the four groups taken since it was made
    ray.get(channel.finished.remote("p3"))
    wait.took(1)
    assert len(wait.step_finish_times(0.0)) == 1  # the next step: only its own group


class _Finished:
    """verl's replay buffer as the polled wait reads it: ``finished`` prompt groups."""

    def __init__(self, finished: int) -> None:
        self.finished_keys = {"train": {f"u{i}" for i in range(finished)}}
        self.failure_keys: dict[str, set[str]] = {}

    def _sync_metadata_from_transfer_queue(self) -> None:
        pass


def test_a_dead_channel_falls_back_to_polling(channel) -> None:
    doomed = CompletionChannel.remote()
    wait = GroupWait(doomed)
    ray.kill(doomed)
    assert wait.next_piece(_Finished(3), piece_groups=1, remaining=4) == 3  # polled TQ instead of hanging
    assert wait.channel is None and wait.step_finish_times(0.0) == []


def test_long_generation_stays_event_driven(channel, monkeypatch) -> None:
    monkeypatch.setattr(group_wait, "CHANNEL_TIMEOUT_S", 0.2)
    fresh = CompletionChannel.remote()
    wait = GroupWait(fresh)
    threading.Timer(1.0, lambda: ray.get(fresh.finished.remote("train"))).start()
    t0 = time.perf_counter()
    # nothing in TQ either: keeps waiting past several timeouts, wakes on the report
    assert wait.next_piece(_Finished(0), piece_groups=1, remaining=4) == 1
    assert 0.9 < time.perf_counter() - t0 < 5.0
    wait.took(1)
    # no report, but TQ shows two finished groups (a lost report): taken from the TQ re-read
    assert wait.next_piece(_Finished(2), piece_groups=1, remaining=4) == 2
    ray.kill(fresh)


def test_early_rows_run_between_slices_until_the_groups_finish(channel) -> None:
    fresh = CompletionChannel.remote()
    wait = GroupWait(fresh)
    calls: list[float] = []
    wait.idle = lambda: calls.append(time.perf_counter())
    threading.Timer(0.8, lambda: ray.get(fresh.finished.remote("train"))).start()
    t0 = time.perf_counter()
    assert wait.next_piece(_Finished(0), piece_groups=1, remaining=4) == 1
    assert time.perf_counter() - t0 < 5.0  # woke on the report, not on a re-read timer
    # the hook ran all along the wait, one slice apart, and not after the group was ready
    assert len(calls) >= 4 and all(t < t0 + 0.8 + 2 * group_wait.IDLE_SLICE_S for t in calls)
    wait.took(1)
    ray.kill(fresh)
