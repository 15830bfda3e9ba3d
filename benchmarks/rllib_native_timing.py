"""Per-iteration timing of RLlib's native experience path, by wrapping the methods that make it up.

Experience path = replay-buffer add + sample + priority update + learner connector + minibatch
iteration (producing each minibatch, not the update on it); RLlib's own timers are moving averages per
call. ``install(timer, conduit=True)`` also wraps the Conduit plugin's replacements of those methods, so
both systems are measured by the same wrappers (``timed_train`` then no longer adds the plugin's own
``conduit/exposed_s``). The wrapped methods are RLlib 2.60 internals: measurement code only.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any


class PathTimer:
    """Accumulates wall time of wrapped calls while ``active``; ``take()`` returns and resets it."""

    def __init__(self) -> None:
        self.active = False
        self.total = 0.0
        self.by_name: dict[str, float] = {}
        self._depth = 0
        self.conduit_wrapped = False  # install(conduit=True): the plugin's path is timed by these wrappers

    def take(self) -> tuple[float, dict[str, float]]:
        out = (self.total, dict(self.by_name))
        self.total, self.by_name = 0.0, {}
        return out

    def _add(self, name: str, dt: float) -> None:
        self.by_name[name] = self.by_name.get(name, 0.0) + dt
        self.total += dt

    def wrap(self, owner: type, method: str, name: str) -> None:
        """Time ``owner.method`` into this timer. A method already wrapped (by an earlier timer: the wrappers
        stay on the class for the process's life) is handed to this one, the newest."""
        fn = getattr(owner, method)
        if getattr(fn, "_path_timed", False):
            fn._path_timer = self  # type: ignore[attr-defined]
            return

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            timer: PathTimer = timed._path_timer  # type: ignore[attr-defined]
            if not timer.active or timer._depth:
                return fn(*args, **kwargs)
            timer._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                timer._depth -= 1
                timer._add(name, time.perf_counter() - t0)

        timed._path_timed = True  # type: ignore[attr-defined]
        timed._path_timer = self  # type: ignore[attr-defined]
        setattr(owner, method, timed)

    def wrap_iter(self, owner: type, name: str, method: str = "__iter__") -> None:
        """Time each ``next()`` of the iterator ``owner.method(...)`` returns (the consumer's work between
        items is not counted); an earlier timer's wrapper is handed to this one, as in :meth:`wrap`."""
        fn = getattr(owner, method)
        if getattr(fn, "_path_timed", False):
            fn._path_timer = self  # type: ignore[attr-defined]
            return

        @functools.wraps(fn)
        def timed_iter(this: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            timer: PathTimer = timed_iter._path_timer  # type: ignore[attr-defined]
            it = iter(fn(this, *args, **kwargs))
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    if timer.active:
                        timer._add(name, time.perf_counter() - t0)
                yield item

        timed_iter._path_timed = True  # type: ignore[attr-defined]
        timed_iter._path_timer = self  # type: ignore[attr-defined]
        setattr(owner, method, timed_iter)


def install(timer: PathTimer, conduit: bool = False) -> Callable[[Any], None]:
    """Wrap the learner connector and minibatch iterators now; return a hook wrapping an algo's buffer.

    ``conduit=True`` also wraps the Conduit plugin's experience path (see the module docstring), under
    the same names where the step is the same (``buffer_add``, ``buffer_sample``, ``priority_update``,
    ``minibatch_iter``); ``ConduitReplay.sample`` also builds the learner input (native's connector).
    """
    from ray.rllib.connectors.learner.learner_connector_pipeline import LearnerConnectorPipeline
    from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator, MiniBatchDummyIterator

    timer.wrap(LearnerConnectorPipeline, "__call__", "learner_connector")
    timer.wrap_iter(MiniBatchCyclicIterator, "minibatch_iter")
    timer.wrap_iter(MiniBatchDummyIterator, "minibatch_iter")
    if conduit:
        from conduit_rllib.learner import PreparedMinibatches
        from conduit_rllib.onpolicy import ConduitOnPolicy
        from conduit_rllib.replay import ConduitReplay

        for method, name in (
            ("add", "buffer_add"),
            ("sample", "buffer_sample"),
            ("update_priorities", "priority_update"),
            ("ready", "buffer_ready"),
        ):
            timer.wrap(ConduitReplay, method, name)
        timer.wrap(ConduitOnPolicy, "add", "buffer_add")
        timer.wrap(ConduitOnPolicy, "deliver", "deliver")
        timer.wrap_iter(PreparedMinibatches, "minibatch_iter", method="minibatches")
        timer.conduit_wrapped = True

    def wrap_buffer(algo: Any) -> None:
        buf = getattr(algo, "local_replay_buffer", None)
        if buf is None:
            return
        for method, name in (
            ("add", "buffer_add"),
            ("sample", "buffer_sample"),
            ("update_priorities", "priority_update"),
        ):
            if hasattr(type(buf), method):
                timer.wrap(type(buf), method, name)

    return wrap_buffer


def timed_train(
    algo: Any, timer: PathTimer, conduit: bool
) -> tuple[dict[str, Any], float, float, dict[str, float]]:
    """One ``algo.train()``: ``(result, wall_s, exposed_s, path parts)``.

    Exposed time is the wrapped path on the training thread. For a Conduit algorithm whose plugin was
    not wrapped (``install(conduit=False)``) it adds the plugin's own timer (``conduit/exposed_s``).
    """
    timer.take()
    timer.active = True
    t0 = time.perf_counter()
    result = algo.train()
    wall = time.perf_counter() - t0
    timer.active = False
    path, parts = timer.take()
    exposed = path + (result["conduit"]["exposed_s"] if conduit and not timer.conduit_wrapped else 0.0)
    return result, wall, exposed, parts


WORK_KEYS = ("env_steps_sampled", "gradient_updates", "module_steps_trained")


class WorkCounter:
    """Counts an algorithm's gradient updates by wrapping its local learner's ``_update`` (one per minibatch).

    ``take(result)`` returns this iteration's work: env steps sampled and module steps trained from
    RLlib's own per-iteration metrics, gradient updates from the counter (then reset). Local learners
    only (``num_learners=0``), as in the benchmarks.
    """

    def __init__(self, algo: Any) -> None:
        from conduit_rllib.compat import local_learner

        learner = local_learner(algo.learner_group)
        update = learner._update
        self.updates = 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.updates += 1
            return update(*args, **kwargs)

        learner._update = counted

    def take(self, result: dict[str, Any]) -> dict[str, int]:
        updates, self.updates = self.updates, 0
        learners = result.get("learners", {}).get("__all_modules__", {})
        return {
            "env_steps_sampled": int(result["env_runners"].get("num_env_steps_sampled", 0)),
            "gradient_updates": updates,
            "module_steps_trained": int(learners.get("num_module_steps_trained", 0)) if updates else 0,
        }


class SideBySide:
    """RLlib's own algorithm and Conduit's, each built from a fresh ``make_config()``, timed by the same
    wrappers (:func:`install` with ``conduit=True``: the plugin's path too) and counted (:class:`WorkCounter`).

    ``make_native`` (default ``make_config``) builds native's config where the two must differ in how
    the env presents observations (Atari: native stacks frames in the env, its prioritized buffer cannot
    run beside RLlib's frame-stacking learner connector; ``rllib_atari_iteration.py``).

    ``train(system)`` runs one iteration of ``"native"`` or ``"conduit"``: ``(result, wall_s, exposed_s,
    path parts, work)``; ``stop()`` stops both.
    """

    def __init__(
        self,
        make_config: Callable[[], Any],
        overlap: str,
        timer: PathTimer,
        make_native: Callable[[], Any] | None = None,
    ) -> None:
        import conduit_rllib

        wrap_buffer = install(timer, conduit=True)
        native = (make_native or make_config)().build_algo()
        wrap_buffer(native)
        conduit = conduit_rllib.enable(make_config(), overlap=overlap).build_algo()
        self.timer = timer
        self.algos = {"native": native, "conduit": conduit}
        self.counters = {system: WorkCounter(algo) for system, algo in self.algos.items()}

    def train(self, system: str) -> tuple[dict[str, Any], float, float, dict[str, float], dict[str, int]]:
        result, wall, exposed, parts = timed_train(
            self.algos[system], self.timer, conduit=system == "conduit"
        )
        return result, wall, exposed, parts, self.counters[system].take(result)

    def stop(self) -> None:
        for algo in self.algos.values():
            algo.stop()


def work_totals(rows: list[dict[str, Any]], system: str) -> dict[str, int]:
    """``system``'s work summed over ``rows`` (each row carries the ``WORK_KEYS`` counters)."""
    return {k: sum(int(r[k]) for r in rows if r["system"] == system) for k in WORK_KEYS}


def ratio_or_refusal(
    native: float | None, conduit: float | None, work_native: dict[str, int], work_conduit: dict[str, int]
) -> tuple[float | None, str | None]:
    """``(conduit / native, None)`` when both sides did the same work, else ``(None, reason)``.

    The reason names each counter that differs and both values, e.g.
    ``"gradient_updates differ: native 943, conduit 942"``.
    """
    diff = [
        f"{k} differ: native {work_native.get(k)}, conduit {work_conduit.get(k)}"
        for k in WORK_KEYS
        if work_native.get(k) != work_conduit.get(k)
    ]
    if diff:
        return None, "; ".join(diff)
    if native is None or conduit is None or native <= 0:
        return None, "no measurement"
    return conduit / native, None
