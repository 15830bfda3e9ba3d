"""The auto-tuner: rank a configuration space with the cost model, measure the few best, keep the winner.

``AutoTuner.tune(signature)`` returns a :class:`Choice`:

1. **cache**: a choice saved for this workload signature (algorithm, batch size, item size,
   hardware fingerprint) is reused without measuring, if it is still in the (pinned) space;
2. **rank**: every configuration is predicted by the model (``model(config) -> Prediction``);
3. **measure**: the ``top_k`` best predicted are run for real (``measure(config) -> seconds`` per
   iteration, the caller's), but only those predicted within ``margin`` of the best (the model's
   uncertainty: where it separates the candidates clearly, measuring them would only cost time),
   plus the best predicted of each other overlap mode (the structural choice the model gets wrong
   most often), measured right after the best so that a tight budget cannot skip it;
   measuring stops early once ``budget_s`` of tuning time is spent (the first candidate is always
   measured). With ``repeats`` > 1 the measured candidates are measured again, in rounds that
   alternate them (each round in the reverse order of the one before), and each keeps its median:
   on a machine whose speed drifts (shared cores, a VM) a single probe of each can rank them by when
   they ran. Without ``measure`` the model's best is taken;
4. **keep**: the fastest measured wins; a re-tune keeps the current configuration unless the winner
   is :func:`clearly_faster` (the one noise rule: ``HYSTERESIS`` faster, or more where the repeats
   spread wider). The choice is cached (JSON, written atomically) and logged with its reason, the
   staleness it implies and what tuning cost.

Pins (``pins={"overlap": "async"}``) overwrite a knob in every configuration of the space, so a
pinned value is honoured even where the space does not list it. :class:`DriftWatch` tells the caller
when the signature has drifted far enough, for long enough, to tune again. A caller that can only
time whole iterations of its own loop tunes with :class:`conduit.tuner_loop.LoopTuner`, the same
cache, repeats, drift watch and noise rule told one iteration at a time (the verl piece policy).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from conduit.costmodel import Prediction
from conduit.errors import ConfigError

log = logging.getLogger("conduit.tuner")

C = TypeVar("C")

#: the noise rule's floor: the share of the incumbent's seconds a challenger must be faster by
HYSTERESIS = 0.05


def spread(seconds: Sequence[float]) -> float:
    """Median absolute deviation from the median (0 for fewer than two values)."""
    if len(seconds) < 2:
        return 0.0
    mid = statistics.median(seconds)
    return statistics.median(abs(s - mid) for s in seconds)


def noise(challenger: Sequence[float], incumbent: Sequence[float]) -> float:
    """Seconds within which two measured (or predicted) candidates cannot be told apart: the larger
    of ``HYSTERESIS`` times the incumbent's median and the larger :func:`spread` of the two."""
    return max(HYSTERESIS * statistics.median(incumbent), spread(challenger), spread(incumbent))


def clearly_faster(challenger: Sequence[float], incumbent: Sequence[float]) -> bool:
    """The tuner's one noise rule: ``challenger`` replaces ``incumbent`` only when its median seconds
    are shorter by more than the :func:`noise` (samples of one candidate each: ``HYSTERESIS`` of the
    incumbent). Repeated samples that differ by their inputs (a step's responses, a shared core's
    load) widen it: three steps of each cannot tell a difference smaller than their own spread.

    Example:
        >>> clearly_faster([0.98], [1.0]), clearly_faster([0.9], [1.0])
        (False, True)
    """
    return statistics.median(challenger) < statistics.median(incumbent) - noise(challenger, incumbent)


@dataclass(frozen=True)
class Signature:
    """What a tuned choice is valid for; ``item_size`` is bytes per item or a mean sequence length."""

    algorithm: str
    batch_size: int
    item_size: float
    hardware: str

    def key(self) -> str:
        """A short stable name for the cache file."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Choice(Generic[C]):
    """A tuned configuration and why it was chosen.

    Args:
        source: ``"cache"``, ``"measured"`` or ``"model"`` (no measurement possible).
        measured_s: seconds per iteration of each measured candidate (``describe(config)``: seconds).
        tuning_s: wall seconds this ``tune`` call took (ranking, measuring, cache I/O).
    """

    config: C
    prediction: Prediction
    source: str
    reason: str
    measured_s: dict[str, float]
    tuning_s: float


def describe(config: object) -> str:
    """``name=value`` for each knob of a dataclass configuration."""
    return " ".join(f"{k}={v}" for k, v in dataclasses.asdict(config).items())  # type: ignore[call-overload]


class AutoTuner(Generic[C]):
    """Chooses a configuration (a frozen dataclass) from ``space``; see the module docstring.

    Args:
        space: candidate configurations, all of one dataclass type.
        model: predicts one configuration (typically ``IterationModel.predict`` or a wrapper of it).
        measure: runs one configuration for real and returns its seconds per iteration (or ``None``).
        cache_dir: where choices are kept per signature (default ``~/.cache/conduit/tuner``).
        top_k: how many of the best predicted configurations are measured.
        pins: knob values the user fixed; they overwrite the space's values.
        budget_s: tuning time after which no further candidate is measured (``None``: no limit).
        margin: relative distance from the best prediction within which a top-``k`` candidate is
            measured (e.g. the model's relative error on its calibration; ``None``: all ``top_k``).
        repeats: measurements of each measured candidate, in alternating rounds; the median is kept.
    """

    def __init__(
        self,
        space: Sequence[C],
        model: Callable[[C], Prediction],
        measure: Callable[[C], float] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        top_k: int = 3,
        pins: Mapping[str, Any] | None = None,
        budget_s: float | None = None,
        margin: float | None = None,
        repeats: int = 1,
    ) -> None:
        if not space:
            raise ConfigError("the tuner needs a non-empty configuration space")
        kind = type(space[0])
        if not dataclasses.is_dataclass(kind) or any(type(c) is not kind for c in space):
            raise ConfigError(
                f"the configuration space must hold instances of one dataclass, got {kind.__name__}"
            )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"top_k must be an int >= 1, got {top_k!r}")
        if budget_s is not None and not budget_s > 0:
            raise ConfigError(f"budget_s must be > 0 or None, got {budget_s!r}")
        if margin is not None and not margin >= 0:
            raise ConfigError(f"margin must be >= 0 (relative) or None, got {margin!r}")
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ConfigError(f"repeats must be an int >= 1, got {repeats!r}")
        self.pins = dict(pins or {})
        known = {f.name for f in dataclasses.fields(kind)}
        unknown = sorted(set(self.pins) - known)
        if unknown:
            raise ConfigError(f"unknown pinned knob(s) {unknown}; knobs: {sorted(known)}")
        pinned = [dataclasses.replace(c, **self.pins) for c in space]  # type: ignore[type-var]
        self.space: list[C] = list(dict.fromkeys(pinned))
        self.model, self.measure = model, measure
        self.cache: ChoiceCache[C] = ChoiceCache(kind, cache_dir)
        self.cache_dir = self.cache.cache_dir
        self.top_k, self.budget_s, self.margin, self.repeats = top_k, budget_s, margin, repeats
        self.current: Choice[C] | None = None
        self.history: list[Choice[C]] = []

    def ranked(self) -> list[tuple[C, Prediction]]:
        """Every configuration with its prediction, fastest predicted first (ties: space order)."""
        predicted = [(c, self.model(c)) for c in self.space]
        return sorted(predicted, key=lambda cp: cp[1].wall_s)

    def tune(
        self, signature: Signature, model: Callable[[C], Prediction] | None = None, fresh: bool = False
    ) -> Choice[C]:
        """The configuration for ``signature`` (cached, or ranked and measured); ``model`` replaces the
        tuner's model first (re-calibrated for a drifted workload); ``fresh`` skips the cache (a
        re-tune after drift; the new choice replaces the cached one)."""
        t0 = time.perf_counter()
        if model is not None:
            self.model = model
        cached = None if fresh else self.cache.load(signature, self.space)
        if cached is not None:
            config, reason = cached
            choice = Choice(config, self.model(config), "cache", reason, {}, time.perf_counter() - t0)
            return self._keep(choice)
        ranked = self.ranked()
        rank = {describe(c): i for i, (c, _) in enumerate(ranked)}
        if self.measure is None:
            config, pred = ranked[0]
            reason = f"model only (no measurement): predicted {pred.wall_s * 1e3:.3g} ms/iter, best of {len(ranked)}"
            choice = Choice(config, pred, "model", reason, {}, time.perf_counter() - t0)
            return self._keep(self.save(signature, choice))
        measured: dict[str, float] = {}
        configs: dict[str, tuple[C, Prediction]] = {}
        candidates = self._uncertain(ranked)
        if self.current is not None and self.current.config in self.space:
            candidates = [*candidates, (self.current.config, self.model(self.current.config))]
        for config, pred in candidates:
            name = describe(config)
            if name in measured:
                continue
            if measured and self.budget_s is not None and time.perf_counter() - t0 >= self.budget_s:
                break
            measured[name] = float(self.measure(config))
            configs[name] = (config, pred)
        samples = {name: [s] for name, s in measured.items()}
        if self.repeats > 1 and len(measured) > 1:
            samples = self._repeat(configs, measured)
            measured = {name: statistics.median(s) for name, s in samples.items()}
        best = min(measured, key=measured.__getitem__)
        why = "fastest measured"
        if self.current is not None:
            now = describe(self.current.config)
            if now in measured and best != now and not clearly_faster(samples[best], samples[now]):
                margin = noise(samples[best], samples[now])
                best, why = (
                    now,
                    f"kept (the fastest was not clearly faster: the noise rule needs {margin * 1e3:.3g} ms)",
                )
        config, pred = configs[best]
        others = sorted(v for k, v in measured.items() if k != best)
        skipped = min(self.top_k, len(ranked)) - sum(rank[n] < self.top_k for n in measured)
        reason = (
            f"{why} of {len(measured)}: {measured[best] * 1e3:.3g} ms/iter"
            + (f" (next {others[0] * 1e3:.3g} ms)" if others else "")
            + f"; model ranked it {rank[best] + 1} of {len(ranked)}, predicted {pred.wall_s * 1e3:.3g} ms"
            + (
                f"; {skipped} of the top {self.top_k} not measured (outside the margin or budget)"
                if skipped
                else ""
            )
        )
        choice = Choice(config, pred, "measured", reason, measured, time.perf_counter() - t0)
        return self._keep(self.save(signature, choice))

    def _repeat(
        self, configs: dict[str, tuple[C, Prediction]], first: dict[str, float]
    ) -> dict[str, list[float]]:
        """Each of ``configs`` measured ``repeats`` times in all, rounds alternating the order."""
        assert self.measure is not None
        seconds = {name: [s] for name, s in first.items()}
        order = list(first)
        for _ in range(self.repeats - 1):
            order.reverse()
            for name in order:
                seconds[name].append(float(self.measure(configs[name][0])))
        return seconds

    def _uncertain(self, ranked: list[tuple[C, Prediction]]) -> list[tuple[C, Prediction]]:
        """The best predicted, then the best predicted of every overlap mode not among those
        measured otherwise (whether to overlap at all is where the model errs most: measured, it ranked
        async first where sync was 1.5-1.8x faster, at 36-260 B/item), then the rest of the top
        ``top_k`` within ``margin`` of the best."""
        top = ranked[: self.top_k]
        if self.margin is not None:
            limit = top[0][1].wall_s * (1 + self.margin)
            top = [top[0], *(cp for cp in top[1:] if cp[1].wall_s <= limit)]
        modes = {getattr(c, "overlap", None) for c, _ in top}
        others = []
        for cp in ranked:
            mode = getattr(cp[0], "overlap", None)
            if mode not in modes:
                modes.add(mode)
                others.append(cp)
        return [top[0], *others, *top[1:]]

    def _keep(self, choice: Choice[C]) -> Choice[C]:
        self.current = choice
        self.history.append(choice)
        pins = f"; pinned {self.pins}" if self.pins else ""
        log.info(
            "conduit tuner chose %s: %s%s; staleness: %s; tuning took %.3g s",
            describe(choice.config),
            choice.reason,
            pins,
            choice.prediction.staleness.describe(),
            choice.tuning_s,
        )
        return choice

    def save(self, signature: Signature, choice: Choice[C]) -> Choice[C]:
        """Cache ``choice`` for ``signature`` (atomically; a failed write is logged, not raised).

        A caller that measures candidates in its own loop (not through ``measure``) saves its result here.
        """
        self.cache.save(signature, choice.config, choice.reason, choice.measured_s)
        return choice


class ChoiceCache(Generic[C]):
    """Tuned configurations (instances of the dataclass ``kind``) kept on disk, one JSON file per
    workload :class:`Signature` under ``cache_dir`` (default ``~/.cache/conduit/tuner``).

    An unreadable or foreign file is logged and treated as absent (the caller tunes again); a failed
    write is logged, never raised: the cache saves tuning time, it never stops a run.
    """

    def __init__(self, kind: type[C], cache_dir: str | os.PathLike[str] | None = None) -> None:
        if not dataclasses.is_dataclass(kind):
            raise ConfigError(f"a tuner cache holds dataclass configurations, got {kind.__name__}")
        self.kind = kind
        self.cache_dir = (
            Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "conduit" / "tuner"
        )

    def path(self, signature: Signature) -> Path:
        """The file that holds ``signature``'s choice."""
        return self.cache_dir / f"{signature.key()}.json"

    def load(self, signature: Signature, space: Sequence[C] | None = None) -> tuple[C, str] | None:
        """The cached configuration for ``signature`` and the reason recorded with it; None when none
        is cached, the file is unreadable, or the configuration is outside ``space`` (when given)."""
        path = self.path(signature)
        try:
            record = json.loads(path.read_text())
            config = self.kind(**record["config"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:  # ConfigError is a ValueError
            log.warning("ignoring the unreadable tuner cache %s (%s); tuning again", path, e)
            return None
        if space is not None and config not in space:
            log.info("the cached choice in %s is outside the (pinned) space; tuning again", path)
            return None
        return config, f"cached in {path} ({record.get('reason', 'no reason recorded')})"

    def save(
        self, signature: Signature, config: C, reason: str, measured_s: Mapping[str, float] | None = None
    ) -> None:
        """Keep ``config`` for ``signature``, with why (written atomically)."""
        path = self.path(signature)
        record = {
            "signature": dataclasses.asdict(signature),
            "config": dataclasses.asdict(config),  # type: ignore[call-overload]
            "reason": reason,
            "measured_s": dict(measured_s or {}),
            "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            log.warning("could not write the tuner cache %s: %s", path, e)


class DriftWatch:
    """Says when a workload measure (e.g. mean response length) has drifted enough to tune again.

    Hysteresis: the value must stay more than ``tolerance`` (relative) away from the reference for
    ``patience`` consecutive observations; then the reference moves to the new value.
    """

    def __init__(self, reference: float, tolerance: float = 0.25, patience: int = 3) -> None:
        if not reference > 0:
            raise ConfigError(f"drift reference must be > 0, got {reference!r}")
        if not tolerance > 0:
            raise ConfigError(f"drift tolerance must be > 0, got {tolerance!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ConfigError(f"drift patience must be an int >= 1, got {patience!r}")
        self.reference, self.tolerance, self.patience = float(reference), tolerance, patience
        self._outside = 0

    def observe(self, value: float) -> bool:
        """Record ``value``; True when it is time to re-tune (the reference is then ``value``)."""
        if abs(value - self.reference) <= self.tolerance * self.reference:
            self._outside = 0
            return False
        self._outside += 1
        if self._outside < self.patience:
            return False
        log.info("conduit tuner: workload drifted from %.4g to %.4g; tuning again", self.reference, value)
        self.reference, self._outside = float(value), 0
        return True
