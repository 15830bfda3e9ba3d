"""Real process kills on the verl side: SIGKILL of the worker process of the Conduit TransferQueue
storage actor and of the completion channel. The next read / the streaming wait ends within a
bounded time with a clear error or by falling back, never a hang.

The process is found through Ray's own actor table (the worker's pid as Ray's GCS records it) and
checked to be that actor's worker before it is killed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
psutil = pytest.importorskip("psutil")

import ray  # noqa: E402
import transfer_queue as tq  # noqa: E402
from conduit_verl.completion import CompletionChannel  # noqa: E402
from conduit_verl.errors import RolloutTimeoutError  # noqa: E402
from conduit_verl.group_wait import GroupWait  # noqa: E402
from tensordict import TensorDict  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def actor_pid(handle: object, class_name: str) -> int:
    """The pid of ``handle``'s worker process from Ray's actor table, checked against the process."""
    info = ray._private.state.actors(handle._actor_id.hex())  # type: ignore[attr-defined]  # noqa: SLF001
    pid = int(info["Pid"])
    assert info["State"] == "ALIVE" and info["ActorClassName"].endswith(class_name), info
    assert class_name in " ".join(psutil.Process(pid).cmdline()), "not that actor's worker process"
    return pid


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    psutil.Process(pid).wait(timeout=10) if psutil.pid_exists(pid) else None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow  # its own TransferQueue; fast counterpart: test_tq_store_ray.py's dead storage actor test
def test_sigkill_of_the_storage_actor_fails_the_next_read_clearly(conduit_tq) -> None:
    with conduit_tq({"timeout_s": 5}):
        responses = torch.nested.nested_tensor_from_jagged(torch.arange(5), torch.tensor([0, 2, 5]))
        tq.kv_batch_put(
            keys=["x", "y"], partition_id="train", fields=TensorDict({"responses": responses}, [2])
        )
        assert [
            r.tolist() for r in tq.kv_batch_get(keys=["y"], partition_id="train")["responses"].unbind()
        ] == [[2, 3, 4]]
        controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
        names = ray.get(controller.get_config.remote()).backend.Conduit.actors
        actors = [ray.get_actor(n, namespace="transfer_queue") for n in names]
        for actor in actors:
            sigkill(actor_pid(actor, "StorageActor"))
        t0 = time.monotonic()
        with pytest.raises(
            Exception, match="Conduit storage actor .* (died|not reachable|did not answer)"
        ) as err:
            tq.kv_batch_get(keys=["x", "y"], partition_id="train")
        assert time.monotonic() - t0 < 30, "the read waited too long for a dead actor"
        if "died" in str(err.value):  # the lost samples are named by id
            assert "global indexes [" in str(err.value)
        t0 = time.monotonic()
        with pytest.raises(Exception, match="Conduit storage actor"):
            tq.kv_batch_put(
                keys=["z"], partition_id="train", fields=TensorDict({"rm_scores": torch.tensor([1.0])}, [1])
            )
        assert time.monotonic() - t0 < 30, "the write waited too long for a dead actor"


class _Groups:
    """verl's replay buffer as the polled wait reads it (our stand-in): ``finished`` groups done,
    the others running."""

    def __init__(self, finished: int, total: int) -> None:
        self.finished, self.total = finished, total
        self.failure_keys: dict[str, set[str]] = {}

    def _sync_metadata_from_transfer_queue(self) -> None:
        self.finished_keys = {"train": {f"uid{i}" for i in range(self.finished)}}
        self.running_keys = {"train": {f"uid{i}" for i in range(self.finished, self.total)}}


def test_sigkill_of_the_completion_channel_mid_wait_falls_back_to_polling(ray_shared) -> None:
    channel = CompletionChannel.remote()
    wait = GroupWait(channel, timeout_s=60.0, log_every_s=60.0, poll_s=0.05)
    groups = _Groups(finished=0, total=4)
    result: list[int] = []
    waiter = threading.Thread(
        target=lambda: result.append(wait.next_piece(groups, piece_groups=2, remaining=4))
    )
    waiter.start()
    time.sleep(1.0)  # the wait is now blocked on the channel (it asks for up to 5 s at a time)
    assert waiter.is_alive() and not result
    pid = actor_pid(channel, "CompletionChannel")
    groups.finished = 2  # reported to TQ; the report to the channel is lost with its process
    t_kill = time.monotonic()
    sigkill(pid)
    waiter.join(20.0)
    assert result == [2], "the wait did not fall back to polling TQ after the channel died"
    assert time.monotonic() - t_kill < 15.0
    assert wait.channel is None


def test_a_dead_channel_and_a_hung_group_end_in_a_timeout_error(ray_shared) -> None:
    channel = CompletionChannel.remote()
    wait = GroupWait(channel, timeout_s=3.0, log_every_s=60.0, poll_s=0.05)
    sigkill(actor_pid(channel, "CompletionChannel"))
    t0 = time.monotonic()
    with pytest.raises(RolloutTimeoutError, match=r"unfinished groups: uid3"):
        wait.next_piece(_Groups(finished=3, total=4), piece_groups=4, remaining=4)
    assert 3.0 <= time.monotonic() - t0 < 20.0
