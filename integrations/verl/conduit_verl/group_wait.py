"""Waiting for a streamed piece's prompt groups: on the completion channel, or by re-reading TransferQueue.

Bounded: a wait logs the groups it still waits for, and ends by ``on_timeout`` once no group has
finished for ``rollout_timeout_s`` (a hung request, a dead agent loop or rollout server).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import ray

from conduit_verl import compat
from conduit_verl.config import ConduitTrainerConfig
from conduit_verl.errors import RolloutTimeoutError

logger = logging.getLogger(__name__)

#: how often a streaming wait with no reports re-reads TQ's metadata (a lost report, failed groups)
CHANNEL_TIMEOUT_S = 5.0
#: how long past its own timeout a call to the completion channel may take before it counts as hung
CHANNEL_GRACE_S = 10.0
#: how often a streaming wait logs the groups it is still waiting for
WAIT_LOG_S = 30.0
#: with early rows, how long a wait on the channel lasts before the finished responses are looked at
IDLE_SLICE_S = 0.1


class GroupWait:
    """Waits for the next piece's groups: on the completion channel, or by re-reading TQ.

    One per trainer (the channel's count runs over the whole job). ``next_piece`` returns how many
    groups to take: at least ``piece_groups`` (never over what is left), or every group already finished
    if more, so a piece catches up when generation runs ahead of ingestion; always whole multiples
    of ``unit`` groups (whole inference micro-batches).

    The wait is never unbounded: every ``log_every_s`` it logs the prompt groups still pending or
    running and the time waited, and once ``timeout_s`` pass with no group finishing (a hung
    request, a dead agent loop or rollout server) it ends by ``on_timeout``:

    - ``"error"`` raises :class:`~conduit_verl.errors.RolloutTimeoutError` naming the unfinished groups;
    - ``"drop"`` ends the step with the groups that did finish (whole GRPO groups only: a group's
      advantages need all its responses), rounded down so that the step keeps a whole number of
      ``keep_multiple`` groups (whole inference units and whole actor mini-batches: verl's update
      splits the batch into mini-batches and refuses a remainder), logs and counts the dropped
      ones (``conduit/dropped_groups``); the update then runs on a smaller batch. Where the groups
      already taken cannot be completed to such a multiple, it raises like ``"error"``. The
      unfinished groups stay in TransferQueue (a request cannot be cancelled from here); verl's
      staleness rules decide whether a later step takes them if they ever finish. With nothing
      finished at all it raises like ``"error"``.
    """

    def __init__(
        self,
        channel: Any,
        unit: int = 1,
        partition_id: str = "train",
        timeout_s: float = ConduitTrainerConfig.rollout_timeout_s,
        on_timeout: str = "error",
        log_every_s: float = WAIT_LOG_S,
        poll_s: float = 0.05,
        keep_multiple: int = 1,
    ) -> None:
        self.channel = channel
        self.unit = unit
        self.keep_multiple = math.lcm(unit, keep_multiple)  # what a step cut short must keep
        self.partition_id = partition_id
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self.log_every_s = log_every_s
        self.poll_s = poll_s
        self.taken = (self._channel_count(0, 0.0) or 0) if channel is not None else 0
        #: called between slices of a wait on the channel (early rows: ingestion while groups generate)
        self.idle: Callable[[], object] | None = None
        self._reread_at = 0.0  # when the channel wait last re-read TransferQueue's metadata
        self.step_first = self.taken
        self.short = False  # the last piece ended the step early (on_timeout="drop")

    def next_piece(self, buffer: Any, piece_groups: int, remaining: int) -> int:
        """Groups to sample now; 0 only under ``on_timeout="drop"``: end the step with those taken."""
        want = min(piece_groups, remaining)
        ready = self._wait(buffer, want)
        self.short = ready < want
        if self.short:  # timed out, and the policy is to drop
            before = self.taken - self.step_first
            keep = (before + ready) // self.keep_multiple * self.keep_multiple
            if keep == 0 or keep < before:
                raise RolloutTimeoutError(
                    f"on_timeout=drop: {before + ready} prompt group(s) of this step finished, which is "
                    f"not a whole number of {self.keep_multiple} (the inference unit and the actor "
                    f"mini-batch, actor.ppo_mini_batch_size, must each divide what a step keeps); "
                    f"unfinished groups: {_names(compat.unfinished_groups(buffer, self.partition_id))}. "
                    "Use a smaller ppo_mini_batch_size to let drop train on part of a batch"
                )
            take = keep - before
            logger.warning(
                "conduit: dropping %d unfinished prompt group(s) of this step (on_timeout=drop); "
                "taking the %d finished, %d taken before",
                remaining - take,
                take,
                self.taken - self.step_first,
            )
            return take
        return min(remaining, max(want, ready // self.unit * self.unit))

    def _wait(self, buffer: Any, want: int) -> int:
        """Groups ready to sample (>= ``want``, or fewer after a timeout under ``on_timeout="drop"``).

        Failed groups end the wait too (verl's sampler refills them).
        """
        start = last_log = progress_at = time.monotonic()
        best = -1
        while True:
            now = time.monotonic()
            budget = min(progress_at + self.timeout_s, last_log + self.log_every_s) - now
            ready, failed = self._ready(buffer, want, max(budget, 0.0))
            if ready >= want or failed:
                return ready
            now = time.monotonic()
            if ready > best:
                best, progress_at = ready, now
            if now - progress_at >= self.timeout_s:
                return self._timed_out(buffer, ready, want, now - start)
            if now - last_log >= self.log_every_s:
                last_log = now
                logger.warning(
                    "conduit: waited %.0fs for %d more prompt group(s) (%d ready); unfinished: %s",
                    now - start,
                    want - ready,
                    ready,
                    _names(compat.unfinished_groups(buffer, self.partition_id)),
                )

    def _ready(self, buffer: Any, want: int, wait_s: float) -> tuple[int, bool]:
        """(groups ready, any failed) after waiting up to ``wait_s`` for ``want`` on the channel.

        Without a channel (or when it dies or stops answering) TQ's metadata is re-read every
        ``poll_s``; with one, every ``CHANNEL_TIMEOUT_S`` (a lost report, failed groups).
        """
        if self.channel is not None:
            slice_s = min(wait_s, CHANNEL_TIMEOUT_S if self.idle is None else IDLE_SLICE_S)
            done = self._channel_count(self.taken + want, slice_s)
            if done is not None and done - self.taken >= want:
                return done - self.taken, False
            if done is not None and self.idle is not None:
                self.idle()
                if time.monotonic() - self._reread_at < CHANNEL_TIMEOUT_S:
                    return done - self.taken, False
                self._reread_at = time.monotonic()
        else:
            finished = compat.finished_groups(buffer, self.partition_id)
            if finished >= want:
                return finished, False
            time.sleep(min(wait_s, self.poll_s))
        finished = compat.finished_groups(buffer, self.partition_id)
        return finished, compat.any_failed_group(buffer, self.partition_id)

    def _channel_count(self, at_least: int, wait_s: float) -> int | None:
        """The channel's count after waiting up to ``wait_s``; None (and polling from now on) when the
        channel died or did not answer within ``wait_s + CHANNEL_GRACE_S``."""
        try:
            ref = self.channel.wait.remote(self.partition_id, at_least, wait_s)
            return int(ray.get(ref, timeout=wait_s + CHANNEL_GRACE_S))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            logger.warning("conduit: the completion channel died or hung; waiting for groups by polling TQ")
            self.channel = None
            return None

    def _timed_out(self, buffer: Any, ready: int, want: int, waited: float) -> int:
        pending = compat.unfinished_groups(buffer, self.partition_id)
        if self.on_timeout == "drop" and (ready >= self.unit or self.taken > self.step_first):
            return ready
        raise RolloutTimeoutError(
            f"no prompt group finished for {self.timeout_s:g}s (waited {waited:.0f}s for {want} group(s), "
            f"{ready} ready); unfinished groups: {_names(pending)}. A rollout request hung or an agent "
            "loop / rollout server died; raise trainer.v1.conduit.rollout_timeout_s if generation is "
            "just slow, or set on_timeout=drop to train on the finished groups"
        )

    def took(self, groups: int) -> None:
        """``groups`` were sampled out of the replay buffer."""
        self.taken += groups

    def step_finish_times(self, t0_wall: float) -> list[float]:
        """Seconds from ``t0_wall`` at which this step's groups finished (empty when polled)."""
        count, since, self.step_first = self.taken - self.step_first, self.step_first, self.taken
        if self.channel is None:
            return []
        try:
            times = ray.get(
                self.channel.finish_times.remote(self.partition_id, since), timeout=CHANNEL_GRACE_S
            )
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            self.channel = None
            return []
        return [t - t0_wall for t in times[:count]]


def _names(groups: list[str], limit: int = 10) -> str:
    """At most ``limit`` group ids, then how many more."""
    if not groups:
        return "none listed in TransferQueue"
    more = f" and {len(groups) - limit} more" if len(groups) > limit else ""
    return ", ".join(groups[:limit]) + more
