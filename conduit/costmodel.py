"""The cost model: one iteration's time for a configuration, from costs calibrated on the workload.

**Operator costs.** One call of an operator (ingestion, delivery) on ``n`` items moving ``m`` bytes
takes::

    t(n, m) = a + b * n + m / W

``a`` is the fixed cost per call (Python, locks, kernel launches), ``b`` the cost per item and ``W``
the bandwidth of the link the bytes cross (measured by ``conduit.discovery``; see
:func:`link_bandwidth`), or fitted where no link applies. :meth:`OperatorCost.fit` solves for them by
least squares over measured calls (one row per sample: ``calls``, ``items``, ``bytes``, ``seconds``;
per-iteration totals are fine: ``seconds = a * calls + b * items + bytes / W``). Coefficients are
kept >= 0 (a negative per-item or per-byte term is dropped and the rest refitted; a negative ``a``
becomes 0). A fitted per-byte term that moves with the items is left out; where every call had the
same items but bytes varied, the per-item term is left out instead. When the samples cannot separate
``a`` from ``b`` (one call size only) the mean per-call time is split evenly between them.

**One iteration** (:class:`Workload`): the caller's thread runs the producer's compute ``P`` and the
consumer's compute ``C``; it puts ``F`` fragments of ``f`` items and gets ``K`` batches of ``B`` items
(``s`` bytes per item). With knobs ``(overlap, depth, g_ing, g_del, placement)`` and ``h`` seconds
per put call on the caller's thread (validation, enqueue; ``placement`` picks the measured bandwidth
``W`` of delivery's copy to the consumer)::

    sync:   I = F * t_ing(f)                              (ingestion inline in each put)
            D = ceil(K / g_del) * t_del(g_del * B)        (g_del batches drawn per call)
            wall = P + C + I + D + h * F

    async:  I = ceil(F / g_ing) * t_ing(g_ing * f)        (a background thread, g_ing fragments per call)
            T = (P + C) / K                               (compute between two gets)
            k = smallest k <= g_del with t_del(k*B) + w_d <= k * T (the delivery thread keeps up,
                woken w_d after a get frees room), else g_del
            D = K / k * t_del(k * B)                      (a background thread)
            N_i = ceil(F / g_ing),  N_d = K / k           (background ingestion / delivery calls)
            stall = K / k * max(0, t_del(k*B) - (max(depth, g_del) - k + 1) * T)
            wall = max(P + C + h * F + w_g * K + sigma * (I + D) + w_i * N_i + w_d * N_d + stall,  I,  D)

``exposed = wall - P - C`` in both modes: what does not fit under the compute it overlaps with
(``stall``, and ``I`` or ``D`` beyond the iteration when a thread cannot keep up), plus what overlap
slows down on shared cores or devices: ``sigma * (I + D)`` and the per-call terms. ``sigma`` (the
*interference*) is the fraction of background work that lands on the caller's critical path: 0 where
the background runs on hardware of its own, up to 1 where it competes for the only core. The
per-call costs are what a call costs the caller beyond its work (thread wake-ups, the interpreter
lock), and they differ by kind: ``w_g`` per get handed its batch by the delivery thread (a condition
wait and a wake-up instead of an inline call: why async loses to sync where there is little work to
hide); ``w_i`` per ingestion call (the ingestion thread's Python between kernels holds the lock while
the caller wants it); ``w_d`` per delivery call, also the delay before the delivery thread wakes to
refill, so on a fast consumer it finds several batches' room free and draws them in one call (``k``
grows with ``w_d``, up to ``g_del``; measured on 2 CPU cores: 10 calls for 16 batches at ``g_del`` 4,
16 at ``g_del`` 1). Fitted to the recorded 2-core grid, ``w_i`` came out 2-10x ``w_d``: one shared
per-call cost cannot order ``g_ing`` against ``g_del``. All four are fitted to measured async
iterations (:func:`calibrate_overlap`: non-negative least squares for ``w_g``, ``sigma``, ``w_i``, a
search for ``w_d``).

**Streaming** (verl's pieces, :func:`stream_end`): groups finish at known times; a piece waits for
``g`` groups, takes every finished one and ingests them at ``t_ing(n, m)`` with ``n`` its groups and
``m`` their work (tokens; no link applies, so the third term is fitted: per piece, per group — one
inference micro-batch each —, per token); the end of the last piece is the exposed tail. Pieces
ingested while generation still runs on the same cores run ``k`` times slower; :func:`fit_slowed` fits ``t_ing`` and ``k`` together (``seconds = k^o * t_ing``, ``o`` = 1 for those
pieces), so that the slowdown is not read as cost.

**Staleness** is declared with every prediction (:class:`Staleness`): async ingestion may hold up to
``depth * g_ing`` puts not yet sampleable; a delivery drawn ahead has not seen the priority updates of
the batches consumed after it was drawn (sync: ``g_del - 1`` batches, async: ``max(depth, g_del)``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from conduit.config import OVERLAPS
from conduit.errors import ConfigError
from conduit.topology import Topology


@dataclass(frozen=True)
class Sample:
    """Measured work: ``calls`` operator calls on ``items`` items moving ``nbytes`` took ``seconds``."""

    calls: float
    items: float
    nbytes: float
    seconds: float

    def __post_init__(self) -> None:
        for name in ("calls", "items", "nbytes", "seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"measurement {name} must be a finite number, got {value!r}")
            if value < 0:
                raise ConfigError(f"measurement {name} must be >= 0, got {value!r}")
        if self.calls <= 0:
            raise ConfigError(f"measurement calls must be > 0, got {self.calls!r}")


@dataclass(frozen=True)
class OperatorCost:
    """``seconds = a + b * items + per_byte * bytes`` for one call (``per_byte = 1 / bandwidth``)."""

    a: float
    b: float
    per_byte: float = 0.0

    def seconds(self, items: float, nbytes: float = 0.0, calls: float = 1.0) -> float:
        """Predicted seconds of ``calls`` calls moving ``items`` items and ``nbytes`` bytes in all."""
        return self.a * calls + self.b * items + self.per_byte * nbytes

    @classmethod
    def fit(cls, samples: Sequence[Sample], bandwidth: float | None = None) -> OperatorCost:
        """Least squares over ``samples``; ``bandwidth`` (bytes/s, measured) fixes the per-byte term,
        ``None`` fits it too."""
        if not samples:
            raise ConfigError("cannot fit an operator cost from no measurements")
        if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0):
            raise ConfigError(f"bandwidth must be a finite number > 0 (bytes/s), got {bandwidth!r}")
        per_byte = 0.0 if bandwidth is None else 1.0 / bandwidth
        x = np.array([[s.calls, s.items, s.nbytes] for s in samples], dtype=np.float64)
        y = np.array([s.seconds for s in samples], dtype=np.float64) - per_byte * x[:, 2]
        cols = [0, 1] if bandwidth is not None else [0, 1, 2]
        while True:
            independent = _independent(x, cols)
            if independent is None:
                return cls(*_split_evenly(x, y), per_byte=per_byte)
            cols = independent
            coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            negative = [(c, col) for c, col in zip(coef, cols, strict=True) if col > 0 and c < 0]
            if not negative:
                break
            cols.remove(min(negative)[1])  # the most negative per-item/per-byte term goes
        got = dict(zip(cols, (float(c) for c in coef), strict=True))
        fitted_byte = got.get(2, 0.0) if bandwidth is None else per_byte
        return cls(max(0.0, got[0]), got.get(1, 0.0), fitted_byte)


def _independent(x: np.ndarray, cols: list[int]) -> list[int] | None:
    """The columns of ``x`` to fit: ``cols`` if independent; else without the per-byte column (bytes
    moved with items), else without the per-item one (every call the same size while bytes varied);
    None when neither is (calls and items move together: :func:`_split_evenly`)."""
    options = [cols, [c for c in cols if c != 2]]
    if 2 in cols:
        options.append([c for c in cols if c != 1])
    for keep in options:
        if np.linalg.matrix_rank(x[:, keep]) == len(keep):
            return keep
    return None


def _split_evenly(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` when one call size cannot separate them: half the mean per-call time each."""
    per_call = max(0.0, float(y.sum() / x[:, 0].sum()))
    items_per_call = float(x[:, 1].sum() / x[:, 0].sum())
    if items_per_call <= 0:
        return per_call, 0.0
    return per_call / 2, per_call / 2 / items_per_call


#: the slowdowns :func:`fit_slowed` tries, 1 (no contention) to 4x, in steps of 0.05
SLOWDOWNS = np.round(np.linspace(1.0, 4.0, 61), 2)


def fit_slowed(
    samples: Sequence[Sample], slowed: Sequence[bool], bandwidth: float | None = None
) -> tuple[OperatorCost, float]:
    """An operator's own cost and the slowdown ``k`` of the calls in ``slowed`` (those that ran beside
    other work on the same cores or device): ``seconds = k * t(n, m)`` for them, ``t(n, m)`` for the
    rest. For each ``k`` of :data:`SLOWDOWNS` the slowed samples' seconds are divided by ``k`` and
    :meth:`OperatorCost.fit` fits ``t``; the ``k`` with the least squared error over the measured
    seconds wins (the smallest on a tie). With only one kind measured, ``k = 1``.

    Fitting both kinds as one line instead reads the slowdown as cost: light calls that ran slowed
    beside heavy ones that did not flatten the per-item term to zero and inflate the fixed cost.
    """
    if len(slowed) != len(samples):
        raise ConfigError(f"{len(samples)} samples but {len(slowed)} slowed flags")
    if all(slowed) or not any(slowed):
        return OperatorCost.fit(samples, bandwidth), 1.0
    seconds = np.array([s.seconds for s in samples])
    flags = np.array(slowed, dtype=bool)
    best: tuple[float, OperatorCost, float] | None = None
    for k in SLOWDOWNS:
        scaled = [
            dataclasses.replace(s, seconds=s.seconds / k) if o else s
            for s, o in zip(samples, slowed, strict=True)
        ]
        cost = OperatorCost.fit(scaled, bandwidth)
        pred = np.array([cost.seconds(s.items, s.nbytes, s.calls) for s in samples])
        err = float(np.sum((seconds - np.where(flags, k, 1.0) * pred) ** 2))
        if best is None or err < best[0] * (1 - 1e-9):
            best = (err, cost, float(k))
    assert best is not None
    return best[1], best[2]


class CostWindow:
    """The last ``size`` samples of one operator, refitted on demand (:meth:`OperatorCost.fit`;
    :meth:`fit_slowed` for samples flagged as run beside other work)."""

    def __init__(self, size: int, bandwidth: float | None = None) -> None:
        if size < 1:
            raise ConfigError(f"cost window size must be >= 1, got {size!r}")
        self.samples: deque[Sample] = deque(maxlen=size)
        self.slowed: deque[bool] = deque(maxlen=size)
        self.bandwidth = bandwidth

    def record(
        self, calls: float, items: float, seconds: float, nbytes: float = 0.0, slowed: bool = False
    ) -> None:
        self.samples.append(Sample(calls, items, nbytes, seconds))
        self.slowed.append(slowed)

    def __len__(self) -> int:
        return len(self.samples)

    def fit(self) -> OperatorCost:
        return OperatorCost.fit(list(self.samples), self.bandwidth)

    def fit_slowed(self) -> tuple[OperatorCost, float]:
        """The operator's own cost and the slowdown of the flagged samples (:func:`fit_slowed`)."""
        return fit_slowed(list(self.samples), list(self.slowed), self.bandwidth)


def link_bandwidth(topology: Topology, src: str, dst: str) -> float:
    """Measured bandwidth (bytes/s) of the link from tier ``src`` to tier ``dst``."""
    link = topology.link(src, dst)
    if link is None:
        raise ConfigError(f"topology {topology.source!r} has no link {src!r} -> {dst!r}")
    return link.gb_per_s * 1e9


def _need_ints(obj: object, names: Sequence[str], what: str = "") -> None:
    """Refuse (:class:`ConfigError`) unless each field ``names`` of ``obj`` is an int >= 1."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{what}{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class Knobs:
    """One configuration: the scheduler's knobs (``SchedulerConfig``) and the buffer's tier."""

    overlap: str = "sync"
    depth: int = 2
    g_ing: int = 1
    g_del: int = 1
    placement: str = "host"

    def __post_init__(self) -> None:
        if self.overlap not in OVERLAPS:
            raise ConfigError(f"overlap must be one of {OVERLAPS}, got {self.overlap!r}")
        _need_ints(self, ("depth", "g_ing", "g_del"))


@dataclass(frozen=True)
class Workload:
    """One iteration of the caller's loop (seconds, counts, sizes); see the module docstring."""

    producer_s: float
    consumer_s: float
    fragments: int
    fragment_items: int
    batches: int
    batch_size: int
    item_bytes: int

    def __post_init__(self) -> None:
        for name in ("producer_s", "consumer_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"workload {name} must be a finite number >= 0, got {value!r}")
        _need_ints(self, ("fragments", "fragment_items", "batches", "batch_size", "item_bytes"), "workload ")


@dataclass(frozen=True)
class Staleness:
    """How far a configuration delays data and priorities (all 0: as fresh as inline).

    Args:
        data_lag_puts: puts that may be queued, not yet sampleable, when a batch is drawn.
        sample_ahead_batches: batches drawn before their use (they miss those batches' priority updates).
        staged_items: items the producer holds back before one put (an integration's staging).
        held_priority_updates: priority updates queued by the caller before they are sent.
    """

    data_lag_puts: int
    sample_ahead_batches: int
    staged_items: int = 0
    held_priority_updates: int = 0

    def describe(self) -> str:
        parts = []
        if self.staged_items:
            parts.append(f"items staged up to {self.staged_items} before a put")
        if self.data_lag_puts:
            parts.append(f"data sampleable up to {self.data_lag_puts} puts late")
        if self.sample_ahead_batches:
            parts.append(f"batches drawn up to {self.sample_ahead_batches} ahead of use")
        if self.held_priority_updates:
            parts.append(f"priorities sent up to {self.held_priority_updates} updates late")
        return "; ".join(parts) or "none: data sampleable at once, priorities applied before the next draw"


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds per iteration: ``wall_s`` in all, ``exposed_s`` of it on the data path."""

    exposed_s: float
    wall_s: float
    staleness: Staleness
    terms: dict[str, float] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class IterationModel:
    """Predicts one iteration of ``workload`` under any :class:`Knobs` (equations: module docstring).

    Args:
        ingest, deliver: calibrated operator costs (per-byte terms from the measured links).
        call_s: ``h``, fixed cost of one put call on the caller's thread (validation, enqueue). A get
            has none of its own: inline it is its delivery, async it is its wait (``stall``, ``w_d``).
        interference: ``sigma``, the share of background work the caller's compute pays for.
        wake_ingest_s: ``w_i``, the caller's cost of one background ingestion call (async only).
        wake_deliver_s: ``w_d``, the caller's cost of one background delivery call (async only).
        handoff_s: ``w_g``, the caller's cost of one get handed a batch by the delivery thread (async only).
        bandwidths: bytes/s from each placement tier to the consumer (:func:`link_bandwidth`); the
            delivery's per-byte term for ``knobs.placement`` (empty: ``deliver.per_byte`` everywhere).
    """

    workload: Workload
    ingest: OperatorCost
    deliver: OperatorCost
    call_s: float = 0.0
    interference: float = 0.0
    wake_ingest_s: float = 0.0
    wake_deliver_s: float = 0.0
    handoff_s: float = 0.0
    bandwidths: dict[str, float] = field(default_factory=dict)

    def predict(self, knobs: Knobs) -> Prediction:
        """Seconds per iteration under ``knobs``, and the staleness they imply."""
        w = self.workload
        per_byte = self._per_byte(knobs.placement)

        def t_del(batches: int) -> float:
            items = batches * w.batch_size
            return self.deliver.seconds(items) + items * w.item_bytes * per_byte

        compute = w.producer_s + w.consumer_s
        calls = self.call_s * w.fragments
        if knobs.overlap == "sync":
            ing = w.fragments * self._ing(w.fragment_items)
            dels = math.ceil(w.batches / knobs.g_del) * t_del(knobs.g_del)
            wall = compute + calls + ing + dels
            terms = {"ingest_s": ing, "deliver_s": dels, "calls_s": calls}
            staleness = Staleness(0, knobs.g_del - 1)
        else:
            ing = math.ceil(w.fragments / knobs.g_ing) * self._ing(knobs.g_ing * w.fragment_items)
            between = compute / w.batches
            wake = self.wake_deliver_s
            k = next((k for k in range(1, knobs.g_del + 1) if t_del(k) + wake <= k * between), knobs.g_del)
            dels = w.batches / k * t_del(k)
            slack = (max(knobs.depth, knobs.g_del) - k + 1) * between
            stall = w.batches / k * max(0.0, t_del(k) - slack)
            ing_calls, del_calls = math.ceil(w.fragments / knobs.g_ing), w.batches / k
            shared = (
                self.handoff_s * w.batches
                + self.interference * (ing + dels)
                + self.wake_ingest_s * ing_calls
                + self.wake_deliver_s * del_calls
            )
            wall = max(compute + calls + shared + stall, ing, dels)
            terms = {
                "ingest_s": ing,
                "deliver_s": dels,
                "calls_s": calls,
                "stall_s": stall,
                "shared_s": shared,
                "ingest_calls": ing_calls,
                "deliver_calls": del_calls,
            }
            staleness = Staleness(knobs.depth * knobs.g_ing, max(knobs.depth, knobs.g_del))
        return Prediction(wall - compute, wall, staleness, terms)

    def with_overlap(self, costs: OverlapCosts) -> IterationModel:
        """This model with the overlap costs ``costs`` (e.g. from :func:`calibrate_overlap`)."""
        return dataclasses.replace(self, **dataclasses.asdict(costs))

    def _ing(self, fragments_items: int) -> float:
        return self.ingest.seconds(fragments_items, fragments_items * self.workload.item_bytes)

    def _per_byte(self, placement: str) -> float:
        if not self.bandwidths:
            return self.deliver.per_byte
        if placement not in self.bandwidths:
            raise ConfigError(
                f"no measured bandwidth for placement {placement!r} (known: {sorted(self.bandwidths)})"
            )
        return 1.0 / self.bandwidths[placement]

    def background(self, knobs: Knobs) -> tuple[float, float, float]:
        """Seconds of background work, ingestion calls and delivery calls per iteration (async ``knobs``)."""
        terms = self.predict(knobs).terms
        return terms["ingest_s"] + terms["deliver_s"], terms["ingest_calls"], terms["deliver_calls"]


@dataclass(frozen=True)
class OverlapCosts:
    """What overlap costs the caller (module docstring): ``sigma``, ``w_i``, ``w_d``, ``w_g``."""

    interference: float = 0.0
    wake_ingest_s: float = 0.0
    wake_deliver_s: float = 0.0
    handoff_s: float = 0.0


#: the delivery wake-up costs :func:`calibrate_overlap` tries (0, then 1 us .. 10 ms, 12 per decade)
WAKE_GRID = (0.0, *np.geomspace(1e-6, 1e-2, 49).tolist())


def calibrate_overlap(
    runs: Sequence[tuple[IterationModel, Knobs, float]],
) -> OverlapCosts:
    """The overlap costs fitted to measured async iterations ``runs`` (each: the model of its
    workload, its knobs, its measured seconds).

    For each ``w_d`` of :data:`WAKE_GRID` (``w_d`` also sets how many batches a delivery call takes,
    so it is not a linear term) least squares of ``measured - predicted_without_sharing = w_g * K +
    sigma * (I + D) + w_i * N_i``, all >= 0 (a negative one is dropped, the rest refitted; ``sigma <=
    1``); the ``w_d`` with the smallest squared residual wins (ties: the smaller). A term the runs
    cannot separate from those before it is dropped (last first): one run gives ``w_g`` alone.
    """
    if not runs or any(k.overlap != "async" for _, k, _ in runs):
        raise ConfigError("overlap costs are calibrated on measured async iterations (overlap='async')")
    best: tuple[float, OverlapCosts] | None = None
    for wake in WAKE_GRID:
        x, y = _overlap_rows(runs, wake)
        coef = _nonnegative_fit(x, y)
        residual = float(((x @ coef - y) ** 2).sum())
        if best is None or residual < best[0] * (1 - 1e-9):
            best = (residual, OverlapCosts(min(1.0, float(coef[1])), float(coef[2]), wake, float(coef[0])))
    assert best is not None
    return best[1]


def _overlap_rows(
    runs: Sequence[tuple[IterationModel, Knobs, float]], wake_deliver_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per run: ``(K, I + D, N_i)`` and the excess over the prediction without them (``w_d`` charged)."""
    work, excess = [], []
    for model, knobs, measured in runs:
        p = model.with_overlap(OverlapCosts(wake_deliver_s=wake_deliver_s)).predict(knobs)
        terms = p.terms
        work.append((model.workload.batches, terms["ingest_s"] + terms["deliver_s"], terms["ingest_calls"]))
        excess.append(measured - p.wall_s)
    return np.array(work, dtype=np.float64), np.array(excess, dtype=np.float64)


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares coefficients >= 0 of ``x``'s columns; a column the rows cannot separate from
    those before it, or with a negative coefficient, is dropped (0) and the rest refitted."""
    cols = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while cols:
        if np.linalg.matrix_rank(x[:, cols]) < len(cols):
            cols.pop()
            continue
        got = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (got >= 0).all():
            coef[cols] = got
            return coef
        cols.remove(cols[int(np.argmin(got))])
    return coef


def stream_end(
    finish: Sequence[float],
    g: int,
    cost: OperatorCost,
    unit: int,
    work: Sequence[float] | None = None,
    slowdown: float = 1.0,
) -> float:
    """When the last streamed piece's ingestion ends, for groups finishing at ``finish`` (sorted).

    A piece waits for ``g`` groups, then takes every finished one (whole multiples of ``unit``, at
    least ``g``, never more than is left) and is ingested in ``cost.seconds(its groups, their work)``
    (``a + b * groups + per_byte * work``); ``work[i]`` is the work (tokens) of the group finishing
    ``i``-th (None: no per-work term).
    Until the last group finishes (generation ends) a piece runs ``slowdown`` times slower (shared
    cores or device: :func:`fit_slowed`'s ``k``), at full speed after.
    """
    done = list(itertools.accumulate(work, initial=0.0)) if work is not None else None
    total, taken, t = len(finish), 0, 0.0
    end_gen = finish[-1] if finish else 0.0
    while taken < total:
        want = min(g, total - taken)
        t = max(t, finish[taken + want - 1])
        ready = bisect.bisect_right(finish, t) - taken
        k = min(total - taken, max(want, ready // unit * unit))
        alone = cost.seconds(k, 0.0 if done is None else done[taken + k] - done[taken])
        before_end = max(0.0, end_gen - t)  # seconds of this piece's run before generation ends
        t += (
            alone * slowdown if alone * slowdown <= before_end else before_end + alone - before_end / slowdown
        )
        taken += k
    return t
