"""How stale Conduit DQN's samples are, measured per sampled train batch (used by ``rllib_iteration.py``).

- **priority age** (gradient updates): updates made before this batch whose priorities had not reached
  the buffer when it was drawn (queued in the plugin or the Conduit, or made while the batch waited
  prepared ahead); ``None`` unless the sampler is prioritized.
- **staging delay** (transitions): transitions collected (``ConduitReplay.add``) but not yet sampleable
  when the learner asks (staged, queued for ingestion, or held back for n-step returns), over modules.

Native RLlib has both at 0 by construction. Measurement code only: it wraps a ``ConduitDQN``'s
``ConduitReplay``, its Conduits, buffers and delivery plans.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable
from typing import Any

Hist = dict[int, int]  # value -> count


class StalenessProbe:
    """Attach to a built Conduit DQN algorithm; ``take()`` returns the histograms since the last take."""

    def __init__(self, algo: Any) -> None:
        replay = algo.conduit_path
        self.replay = replay
        self.prioritized = replay.buffer_config.sampler == "prioritized"
        self.updates = 0  # gradient updates whose TD errors reached the plugin
        self.added = 0  # transitions (module steps) collected
        self._queued: dict[int, collections.deque[int]] = {}  # conduit -> updates covered per send
        self._applied: dict[int, int] = {}  # conduit -> updates covered by priorities in its buffer
        self._drawn: dict[int, int] = {}  # conduit -> _applied at its latest draw
        self.age: Hist = {}
        self.delay: Hist = {}
        for c in replay.conduits.values():
            self._watch(c)
        add, sample, update, make = replay.add, replay.sample, replay.update_priorities, replay._conduit

        def counted_add(episodes: Any, version: int) -> int:
            steps = add(episodes, version)
            self.added += steps
            return steps

        def timed_sample(batch_size: int) -> Any:
            inserted = sum(c.buffer.inserted for c in replay.conduits.values())
            _count(self.delay, self.added - inserted)
            out = sample(batch_size)
            if self.prioritized:
                for d in out.deliveries.values():
                    applied = getattr(d, "_probe_applied", None)
                    if applied is not None:
                        _count(self.age, self.updates - applied)
            return out

        def counted_update(batch: Any, td_errors: Any) -> None:
            self.updates += 1  # before the call: a send inside it covers this update
            update(batch, td_errors)

        def watched(*args: Any, **kwargs: Any) -> Any:
            c = make(*args, **kwargs)
            self._watch(c)
            return c

        replay.add, replay.sample, replay.update_priorities = counted_add, timed_sample, counted_update
        replay._conduit = watched

    def _watch(self, c: Any) -> None:
        key = id(c)
        if key in self._queued:
            return
        self._queued[key] = collections.deque()
        self._applied[key] = self._drawn[key] = 0
        send, buf_update, buf_sample = c.update_priorities_at, c.buffer.update_priorities, c.buffer.sample
        plan = c._scheduler.plan
        lay_out = plan.lay_out

        def sent(*args: Any, **kwargs: Any) -> None:
            self._queued[key].append(self.updates)
            send(*args, **kwargs)

        def applied(*args: Any, **kwargs: Any) -> Any:
            out = buf_update(*args, **kwargs)
            if self._queued[key]:
                self._applied[key] = self._queued[key].popleft()
            return out

        def drawn(*args: Any, **kwargs: Any) -> Any:
            self._drawn[key] = self._applied[key]
            return buf_sample(*args, **kwargs)

        def tagged(*args: Any, **kwargs: Any) -> Any:
            d = lay_out(*args, **kwargs)
            d._probe_applied = self._drawn[key]
            return d

        c.update_priorities_at, c.buffer.update_priorities, c.buffer.sample = sent, applied, drawn
        plan.lay_out = tagged

    def take(self) -> tuple[Hist | None, Hist]:
        """``(priority-age histogram or None, staging-delay histogram)`` since the last take; resets."""
        age, self.age = self.age, {}
        delay, self.delay = self.delay, {}
        return (age if self.prioritized else None), delay


def _count(hist: Hist, value: int) -> None:
    hist[value] = hist.get(value, 0) + 1


def pooled(hists: Iterable[dict[Any, int] | None]) -> Hist | None:
    """The histograms added up (keys may be strings, as after a JSON round trip); None if all are None."""
    out: Hist = {}
    seen = False
    for h in hists:
        if h is None:
            continue
        seen = True
        for k, n in h.items():
            out[int(k)] = out.get(int(k), 0) + int(n)
    return out if seen else None


def summary(hist: dict[Any, int] | None) -> dict[str, float | int] | None:
    """``{"median", "p90", "max", "n"}`` of a histogram (None for None or empty)."""
    h = pooled([hist])
    if not h:
        return None
    values = [v for v, n in sorted(h.items()) for _ in range(n)]
    return {
        "median": statistics.median(values),
        "p90": values[min(len(values) - 1, int(0.9 * len(values)))],
        "max": values[-1],
        "n": len(values),
    }
