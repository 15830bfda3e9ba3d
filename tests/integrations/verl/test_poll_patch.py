"""The harness's poll patch reaches every replay buffer verl has (issue 47, item 1): verl's async
trainers wait in ``ReplayBufferAsync.sample`` and, under ``separate_async``, in
``wait_for_sampleable`` directly; the old patch wrapped only ``ReplayBuffer.sample``, so those
trainers kept verl's 2 s poll."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

from conduit_verl_cpu import patches  # noqa: E402
from verl.trainer.ppo.v1 import replay_buffer  # noqa: E402


class _Stop(Exception):
    """Raised by the fake buffer where verl would first read TransferQueue: the poll is set by then."""


class _Fake:
    poll_interval = 2.0
    filter_groups_metric = None

    def _sync_metadata_from_transfer_queue(self) -> None:
        raise _Stop

    def wait_for_sampleable(self, *args: Any) -> Any:  # what ReplayBufferAsync.sample calls first
        raise _Stop


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in patches.replay_buffers(replay_buffer):  # monkeypatch restores verl's methods after
        for name in patches.POLLED_METHODS:
            if name in vars(cls):
                monkeypatch.setattr(cls, name, vars(cls)[name])
    monkeypatch.setenv(patches.POLL_ENV, "2,0.02")
    patches._patch_poll_interval()


@pytest.mark.parametrize(
    "cls, method, args",
    [
        ("ReplayBuffer", "sample", (4,)),
        ("ReplayBufferAsync", "sample", (4,)),
        ("ReplayBufferAsync", "wait_for_sampleable", (4,)),
    ],
)
def test_every_waiting_method_takes_the_step_s_poll(
    patched: None, cls: str, method: str, args: tuple
) -> None:
    buffer = _Fake()
    with pytest.raises(_Stop):
        getattr(getattr(replay_buffer, cls), method)(buffer, 5, "train", *args)
    assert buffer.poll_interval == 0.02  # step 5 takes the schedule's last period


def test_the_async_buffer_is_among_the_patched_classes() -> None:
    names = {c.__name__ for c in patches.replay_buffers(replay_buffer)}
    assert {"ReplayBuffer", "ReplayBufferAsync"} <= names
