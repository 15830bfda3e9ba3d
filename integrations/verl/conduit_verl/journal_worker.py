"""The agent-loop worker that journals each finished prompt group as it lands (``journal.py``).

It is the notifying worker of ``completion.py`` plus a journal: when a training prompt group
reaches a terminal status, the worker queues it; a background task on the worker's event loop
takes every group queued so far, reads their trajectories back from TransferQueue (one tag
listing, one get for the whole batch: exactly what the agent loop wrote), and hands them to a
thread that appends them to this worker's journal file of the step and fsyncs once. Nothing runs
on the trainer; the generation tasks only enqueue. Failed groups are not journaled (verl's sampler
regenerates them). A group the trainer already consumed and cleared before it was read is
logged and skipped (it was trained; its step is past).

The worker finds the journal under ``trainer.default_local_dir`` (made absolute by the trainer).
Each batch's durability lag (group finished → on disk) is appended to ``lag.jsonl`` in the
journal directory, for the benchmark (bounded: ``journal.append_lag`` keeps its newest lines).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from conduit_verl.compat import set_agent_loop_workers, tq
from conduit_verl.completion import ConduitAgentLoopManager, _NotifyingWorker
from conduit_verl.journal import (
    LAG_FILE,
    JournalGroup,
    JournalWriter,
    append_lag,
    journal_root,
    prompt_identity,
)

logger = logging.getLogger(__name__)

MANAGER_FQN = "conduit_verl.journal_worker.JournalingAgentLoopManager"
__all__ = [
    "LAG_FILE",
    "MANAGER_FQN",
    "JournalingAgentLoopManager",
    "JournalingAgentLoopWorker",
    "split_samples",
]


def split_samples(data: Any, size: int) -> list[dict[str, Any]]:
    """A TransferQueue batch (TensorDict) as ``size`` per-sample dicts of tensors and Python values."""
    from tensordict import NonTensorData, NonTensorStack, TensorDictBase

    samples: list[dict[str, Any]] = [{} for _ in range(size)]
    for name in data.keys():
        col = data.get(name)
        if isinstance(col, NonTensorStack):
            values = col.tolist()
        elif isinstance(col, NonTensorData):
            values = [col.data] * size
        elif isinstance(col, TensorDictBase):
            values = [col[i].to_dict() for i in range(size)]
        else:
            values = list(col.unbind(0))
        for sample, value in zip(samples, values, strict=True):
            sample[name] = value
    return samples


class _JournalingWorker(_NotifyingWorker):  # type: ignore[misc]
    """verl's agent-loop worker that reports and journals each finished prompt group."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._journal_root = journal_root(self.config.trainer.default_local_dir)
        self._journal_writer = JournalWriter(self._journal_root)
        self._journal_queue: asyncio.Queue | None = None
        self._journal_task: asyncio.Task | None = None

    async def _run_prompt(
        self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False
    ) -> None:
        validate = bool(trajectory["validate"])
        uid, step = str(prompt["uid"]), int(prompt["global_steps"])
        identity = prompt_identity(prompt.get("index"), prompt.get("raw_prompt"))
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
        finally:
            if not validate:
                self._journal_queue_get().put_nowait((uid, identity, step, time.time()))

    def _journal_queue_get(self) -> asyncio.Queue:
        if self._journal_queue is None:  # created on the actor's event loop
            self._journal_queue = asyncio.Queue()
            self._journal_task = asyncio.create_task(self._journal_loop())
        return self._journal_queue

    async def _journal_loop(self) -> None:
        queue = self._journal_queue
        assert queue is not None
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            try:
                groups = await self._read_groups(batch)
                if groups:
                    await asyncio.to_thread(self._write, groups)
            except Exception:  # the journal must never stop generation
                logger.warning("conduit journal: could not journal %d group(s)", len(batch), exc_info=True)

    async def _read_groups(self, batch: list[tuple[str, str, int, float]]) -> list[JournalGroup]:
        """The batch's finished groups with their trajectories, read back from TransferQueue."""
        listing = (await tq.async_kv_list("train") or {}).get("train", {})
        per_uid: dict[str, list[str]] = {}
        for key, tag in listing.items():
            if not tag.get("is_prompt", False):
                per_uid.setdefault(key.split("_", 1)[0], []).append(key)
        wanted, keys = [], []
        for uid, identity, step, t_done in batch:
            status = listing.get(uid, {}).get("status")
            traj = sorted(per_uid.get(uid, ()))
            if status != "finished" or not traj:
                if status not in (None, "failure"):
                    logger.warning("conduit journal: group %s has status %r; not journaled", uid, status)
                continue
            wanted.append((uid, identity, step, t_done, traj))
            keys.extend(traj)
        if not keys:
            return []
        data = await tq.async_kv_batch_get(keys=keys, partition_id="train")
        samples = split_samples(data, len(keys))
        groups, at = [], 0
        for uid, identity, step, t_done, traj in wanted:
            part = samples[at : at + len(traj)]
            at += len(traj)
            groups.append(
                JournalGroup(
                    identity=identity,
                    step=step,
                    uid=uid,
                    suffixes=[k.split("_", 1)[1] for k in traj],
                    samples=part,
                    tags=[dict(listing[k]) for k in traj],
                    t_done=t_done,
                )
            )
        return groups

    def _write(self, groups: list[JournalGroup]) -> None:
        nbytes = self._journal_writer.append(groups)
        now = time.time()
        line = {
            "t_durable": now,
            "groups": len(groups),
            "bytes": nbytes,
            "lag_s": [now - g.t_done for g in groups],
        }
        append_lag(self._journal_root, line)


JournalingAgentLoopWorker = ray.remote(_JournalingWorker)


class JournalingAgentLoopManager(ConduitAgentLoopManager):
    """verl's TransferQueue agent-loop manager, starting journaling workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        set_agent_loop_workers(self, JournalingAgentLoopWorker)
