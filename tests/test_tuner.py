"""The auto-tuner: ranks with the model, measures the best few, caches, honours pins, re-tunes on drift."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from conduit.costmodel import Knobs, Prediction, Staleness
from conduit.errors import ConfigError
from conduit.tuner import AutoTuner, DriftWatch, Signature, describe

SPACE = [Knobs("sync", g_del=g) for g in (1, 2, 4, 8)] + [Knobs("async", 2 * g, 1, g) for g in (1, 2, 4, 8)]
SIG = Signature("dqn", batch_size=32, item_size=64.0, hardware="test")


def _predicted(config: Knobs) -> Prediction:
    """A fake model (our own logic under test): async cheaper, larger g_del cheaper."""
    wall = (1.0 if config.overlap == "sync" else 0.5) + 0.1 / config.g_del
    return Prediction(wall - 0.4, wall, Staleness(0, config.g_del - 1))


class Measure:
    """A fake measurement: the truth differs from the model (async g_del=4 is really the fastest)."""

    def __init__(self) -> None:
        self.calls: list[Knobs] = []

    def __call__(self, config: Knobs) -> float:
        self.calls.append(config)
        return 0.3 if (config.overlap, config.g_del) == ("async", 4) else _predicted(config).wall_s


def test_ranks_with_the_model_and_measures_only_the_top_k(tmp_path: Path, caplog) -> None:
    measure = Measure()
    tuner = AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path, top_k=3)
    assert [c.g_del for c, _ in tuner.ranked()[:3]] == [8, 4, 2]
    with caplog.at_level(logging.INFO, logger="conduit.tuner"):
        choice = tuner.tune(SIG)
    # the best, the best predicted of the other overlap mode (sync g_del=8), the rest of the top 3
    assert [(c.overlap, c.g_del) for c in measure.calls] == [
        ("async", 8),
        ("sync", 8),
        ("async", 4),
        ("async", 2),
    ]
    assert choice.config == Knobs("async", 8, 1, 4) and choice.source == "measured"
    assert "ranked it 2 of 8" in choice.reason and choice.measured_s[describe(choice.config)] == 0.3
    assert "g_del=4" in caplog.text and "staleness" in caplog.text and choice.tuning_s >= 0


def test_cached_choice_is_reused_without_measuring(tmp_path: Path) -> None:
    AutoTuner(SPACE, _predicted, Measure(), cache_dir=tmp_path).tune(SIG)
    record = json.loads((tmp_path / f"{SIG.key()}.json").read_text())
    assert record["config"]["g_del"] == 4 and record["signature"]["algorithm"] == "dqn"
    measure = Measure()
    again = AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path).tune(SIG)
    assert again.source == "cache" and again.config.g_del == 4 and measure.calls == []
    other = Signature("dqn", 32, 4096.0, "test")  # another item size: its own entry
    assert AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path).tune(other).source == "measured"


def test_corrupt_cache_is_ignored_and_rewritten(tmp_path: Path) -> None:
    (tmp_path / f"{SIG.key()}.json").write_text("{not json")
    choice = AutoTuner(SPACE, _predicted, Measure(), cache_dir=tmp_path).tune(SIG)
    assert choice.source == "measured"
    assert json.loads((tmp_path / f"{SIG.key()}.json").read_text())["config"]["g_del"] == 4


def test_pins_are_honoured_even_outside_the_space(tmp_path: Path) -> None:
    measure = Measure()
    tuner = AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path, pins={"overlap": "sync", "g_del": 16})
    choice = tuner.tune(SIG)
    assert choice.config.overlap == "sync" and choice.config.g_del == 16
    assert all(c.overlap == "sync" and c.g_del == 16 for c in measure.calls)
    with pytest.raises(ConfigError, match="colour"):
        AutoTuner(SPACE, _predicted, pins={"colour": 1})
    with pytest.raises(ConfigError, match="g_del"):
        AutoTuner(SPACE, _predicted, pins={"g_del": 0})
    # a cached choice that breaks a pin is not reused
    AutoTuner(SPACE, _predicted, Measure(), cache_dir=tmp_path / "b").tune(SIG)
    pinned = AutoTuner(SPACE, _predicted, Measure(), cache_dir=tmp_path / "b", pins={"overlap": "sync"}).tune(
        SIG
    )
    assert pinned.source == "measured" and pinned.config.overlap == "sync"


def test_model_only_without_a_measurement(tmp_path: Path) -> None:
    choice = AutoTuner(SPACE, _predicted, None, cache_dir=tmp_path).tune(SIG)
    assert choice.source == "model" and choice.config == Knobs("async", 16, 1, 8)
    assert "model only" in choice.reason


def test_budget_stops_measuring_after_the_first(tmp_path: Path) -> None:
    measure = Measure()
    tuner = AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path, top_k=5, budget_s=1e-9)
    choice = tuner.tune(SIG)
    assert len(measure.calls) == 1 and len(choice.measured_s) == 1


def test_a_tight_budget_still_measures_the_other_overlap_mode(tmp_path: Path) -> None:
    # the budget passes after the second probe: the model's best and the other mode's best are measured
    clock = {"probes": 0}

    def slow(config: Knobs) -> float:
        clock["probes"] += 1
        time.sleep(0.02)
        return 0.2 if config.overlap == "sync" else _predicted(config).wall_s

    tuner = AutoTuner(SPACE, _predicted, slow, cache_dir=tmp_path, top_k=4, budget_s=0.03)
    choice = tuner.tune(SIG)
    assert clock["probes"] == 2 and choice.config.overlap == "sync"


def test_retune_keeps_the_current_choice_unless_clearly_faster(tmp_path: Path) -> None:
    slow_first = {"n": 0}

    def measure(config: Knobs) -> float:
        slow_first["n"] += 1
        return 1.0 if config.g_del == 8 else 0.98  # 2% apart: within hysteresis

    tuner = AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path, top_k=1)
    first = tuner.tune(SIG)
    assert first.config.g_del == 8
    drifted = Signature("dqn", 32, 128.0, "test")
    tuner.top_k = 2
    second = tuner.tune(drifted)
    assert second.config == first.config and "kept" in second.reason
    assert len(tuner.history) == 2


def test_measures_only_the_candidates_the_model_cannot_separate(tmp_path: Path) -> None:
    # predicted: async g_del 8 0.5125 s, 4 0.525 s (+2.4%), 2 0.55 s (+7.3%)
    measure = Measure()
    tuner = AutoTuner(SPACE, _predicted, measure, cache_dir=tmp_path, top_k=3, margin=0.03)
    choice = tuner.tune(SIG)
    assert [(c.overlap, c.g_del) for c in measure.calls] == [("async", 8), ("sync", 8), ("async", 4)]
    assert choice.config.g_del == 4 and "1 of the top 3 not measured" in choice.reason
    sure = Measure()
    AutoTuner(SPACE, _predicted, sure, cache_dir=tmp_path / "b", top_k=3, margin=0.0).tune(SIG)
    assert [(c.overlap, c.g_del) for c in sure.calls] == [("async", 8), ("sync", 8)]  # each mode's best
    with pytest.raises(ConfigError, match="margin"):
        AutoTuner(SPACE, _predicted, sure, margin=-0.1)


def test_the_other_overlap_mode_is_measured_and_wins_when_the_model_misranks_it(tmp_path: Path) -> None:
    # the model ranks every async configuration first; in truth sync is faster (small items)
    def truth(config: Knobs) -> float:
        return 0.2 if config.overlap == "sync" else _predicted(config).wall_s

    choice = AutoTuner(SPACE, _predicted, truth, cache_dir=tmp_path, top_k=2).tune(SIG)
    assert choice.config.overlap == "sync" and choice.source == "measured"


def test_repeats_alternate_the_candidates_and_keep_medians(tmp_path: Path) -> None:
    # the machine is slow (x1.5) for the very first probe only: one probe each ranks by when it ran
    truth = {("async", 8): 0.50, ("sync", 8): 0.55}
    calls: list[tuple[str, int]] = []

    def drifting(config: Knobs) -> float:
        calls.append((config.overlap, config.g_del))
        return truth[calls[-1]] * (1.5 if len(calls) == 1 else 1.0)

    once = AutoTuner(SPACE, _predicted, drifting, cache_dir=tmp_path / "a", top_k=1).tune(SIG)
    assert once.config.overlap == "sync"  # the slow first probe made the faster one lose
    calls.clear()
    tuner = AutoTuner(SPACE, _predicted, drifting, cache_dir=tmp_path / "b", top_k=1, repeats=3)
    choice = tuner.tune(SIG)
    assert calls == [("async", 8), ("sync", 8), ("sync", 8), ("async", 8), ("async", 8), ("sync", 8)]
    assert choice.config == Knobs("async", 16, 1, 8) and choice.measured_s[describe(choice.config)] == 0.5
    for bad in (0, 1.5, True):
        with pytest.raises(ConfigError, match="repeats"):
            AutoTuner(SPACE, _predicted, drifting, repeats=bad)  # type: ignore[arg-type]


def test_drift_watch_needs_a_sustained_change() -> None:
    watch = DriftWatch(100.0, tolerance=0.25, patience=3)
    assert not any(watch.observe(v) for v in (110, 130, 90, 140, 140))  # a blip, then only two outside
    assert watch.observe(140.0) and watch.reference == 140.0
    assert not watch.observe(150.0)  # within tolerance of the new reference
    with pytest.raises(ConfigError, match="patience"):
        DriftWatch(1.0, patience=0)


def test_tunes_with_the_real_cost_model(tmp_path: Path) -> None:
    from conduit.costmodel import IterationModel, OperatorCost, Workload

    work = Workload(0.02, 0.03, fragments=8, fragment_items=32, batches=16, batch_size=32, item_bytes=256)
    model = IterationModel(
        work, OperatorCost(2e-4, 1e-6), OperatorCost(3e-4, 2e-6), interference=0.2, wake_ingest_s=5e-5
    )
    truth = IterationModel(
        work,
        OperatorCost(3e-4, 1e-6),
        OperatorCost(3e-4, 3e-6),
        interference=0.3,
        wake_ingest_s=6e-5,
        wake_deliver_s=2e-5,
    )
    space = [Knobs("sync", g_del=g) for g in (1, 2, 4, 8)] + [
        Knobs("async", 2 * d, i, d) for i in (1, 2, 4, 8) for d in (1, 2, 4, 8)
    ]
    choice = AutoTuner(space, model.predict, lambda k: truth.predict(k).wall_s, cache_dir=tmp_path).tune(SIG)
    best = min(truth.predict(k).wall_s for k in space)
    assert truth.predict(choice.config).wall_s <= best * 1.05
    assert choice.prediction.staleness == model.predict(choice.config).staleness
