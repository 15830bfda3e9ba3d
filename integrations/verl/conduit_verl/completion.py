"""Event-driven group completion for the streaming step (TransferQueue 0.1.11 has no notification).

verl's agent-loop workers mark a prompt group finished by writing the TransferQueue tag
``status="finished"``; the replay buffer only sees it by re-reading TQ's metadata on a timer. Here
the worker also tells a small Ray actor, the ``CompletionChannel``, *after* the tag is written, and
the trainer blocks on that channel until enough groups are done: it wakes when a group finishes,
not on a poll period.

The worker and manager are verl's own (``AgentLoopWorkerTQ``, ``AgentLoopManagerTQ``) with one
added call (``compat.NotifyingAgentLoopWorker``); the trainer selects them through verl's
``rollout.agent.agent_loop_manager_class``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from conduit_verl.compat import AgentLoopManagerTQ, NotifyingAgentLoopWorker, set_agent_loop_workers

MANAGER_FQN = "conduit_verl.completion.ConduitAgentLoopManager"


def channel_name() -> str:
    """The channel's Ray actor name: one per Ray job (trainer and agent loops share the job)."""
    return f"conduit_completion_{ray.get_runtime_context().get_job_id()}"


@ray.remote(num_cpus=0)
class CompletionChannel:
    """Counts finished prompt groups per TransferQueue partition; wakes waiters on each one."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.times: dict[str, list[float]] = {}  # finish times of groups number first[p] onwards
        self.first: dict[str, int] = {}
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # created on the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def finished(self, partition_id: str) -> None:
        """One group of ``partition_id`` reached a terminal status (finished or failed)."""
        cond = self._condition()
        async with cond:
            self.counts[partition_id] = self.counts.get(partition_id, 0) + 1
            self.times.setdefault(partition_id, []).append(time.time())
            cond.notify_all()

    async def wait(self, partition_id: str, at_least: int, timeout_s: float) -> int:
        """Block until ``at_least`` groups of the partition are done (or ``timeout_s``); the count."""
        cond = self._condition()
        async with cond:
            try:
                await asyncio.wait_for(
                    cond.wait_for(lambda: self.counts.get(partition_id, 0) >= at_least), timeout_s
                )
            except TimeoutError:
                pass
            return self.counts.get(partition_id, 0)

    def finish_times(self, partition_id: str, since: int) -> list[float]:
        """Wall-clock finish times of the partition's groups number ``since`` onwards (older ones
        are forgotten: the trainer asks once per step, for that step's groups)."""
        times = self.times.get(partition_id, [])
        drop = max(0, since - self.first.get(partition_id, 0))
        del times[:drop]
        self.first[partition_id] = self.first.get(partition_id, 0) + drop
        return list(times)


class _NotifyingWorker(NotifyingAgentLoopWorker):  # type: ignore[misc]
    """verl's TransferQueue agent-loop worker that also reports each finished group."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conduit_channel = ray.get_actor(channel_name())

    async def conduit_group_done(self, partition_id: str) -> None:
        # the TQ tag (finished / failure) is written by now: the trainer may sample the group
        await self._conduit_channel.finished.remote(partition_id)


ConduitAgentLoopWorker = ray.remote(_NotifyingWorker)


class ConduitAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager, starting notifying workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        set_agent_loop_workers(self, ConduitAgentLoopWorker)


def start_channel() -> Any:
    """Create (or find) this job's channel; call from the trainer before the agent loops start."""
    return CompletionChannel.options(name=channel_name(), get_if_exists=True).remote()
