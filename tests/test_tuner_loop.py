"""The tuner told one iteration at a time (``LoopTuner``) and the one noise rule it shares with ``AutoTuner``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from conduit.costmodel import Knobs, Prediction, Staleness
from conduit.errors import ConfigError
from conduit.tuner import HYSTERESIS, AutoTuner, ChoiceCache, Signature, clearly_faster, describe, noise
from conduit.tuner_loop import LoopTuner, size_bucket


@dataclass(frozen=True)
class Pick:
    arm: str
    size: int


WORKLOAD = Signature("loop", 64, 0.0, "machine-a")


def _run(tuner: LoopTuner[Pick], seconds: dict[str, float], steps: int, favoured: str = "a") -> list[str]:
    """Steps 1..``steps``: each runs the tuner's turn and is told ``seconds[arm]``; the arms run."""
    arms = []
    for step in range(1, steps + 1):
        arm = tuner.turn(step, favoured).arm
        arms.append(arm)
        tuner.record(arm, seconds[arm])
    return arms


def test_the_noise_rule_is_a_share_of_the_incumbent_or_the_spread_whichever_is_larger() -> None:
    assert not clearly_faster([1.0 - HYSTERESIS / 2], [1.0])
    assert clearly_faster([1.0 - 2 * HYSTERESIS], [1.0])
    assert noise([0.9], [1.0]) == pytest.approx(HYSTERESIS)
    # 10% faster in the median, but the challenger's own steps spread by 0.2 s: not told apart
    wide = [0.9, 0.7, 1.1]
    assert noise(wide, [1.0, 1.0, 1.0]) == pytest.approx(0.2)
    assert not clearly_faster(wide, [1.0, 1.0, 1.0])
    assert clearly_faster([0.9, 0.89, 0.91], [1.0, 1.0, 1.0])


def test_auto_tuner_repeats_keep_the_current_choice_within_the_spread(tmp_path: Path) -> None:
    """A re-tune with repeats: the other configuration's median is 10% faster (past ``HYSTERESIS``),
    but its own three measurements spread by 0.3 s; the current one is kept. Steps that agree win."""
    one, two = Knobs("sync", g_del=1), Knobs("sync", g_del=2)
    runs: dict[int, list[float]] = {1: [1.0], 2: [0.9, 0.6, 1.2]}
    calls: dict[int, int] = {1: 0, 2: 0}

    def measure(k: Knobs) -> float:
        calls[k.g_del] += 1
        return runs[k.g_del][(calls[k.g_del] - 1) % len(runs[k.g_del])]

    def ranks_first(g_del: int):  # a model that predicts ``g_del`` fastest
        return lambda k: Prediction(0.0, 0.5 if k.g_del == g_del else 1.0, Staleness(0, 0))

    tuner = AutoTuner([one, two], ranks_first(1), measure, cache_dir=tmp_path, top_k=1, repeats=3)
    sig = Signature("dqn", 32, 1.0, "x")
    assert tuner.tune(sig).config == one  # measured alone
    again = tuner.tune(sig, model=ranks_first(2), fresh=True)
    assert calls[2] == 3 and again.measured_s[describe(two)] == pytest.approx(0.9)
    assert again.config == one and "kept" in again.reason and "noise rule" in again.reason
    runs[2] = [0.9, 0.89, 0.91]  # the same median, steps that agree: it wins
    assert tuner.tune(sig, fresh=True).config == two


def test_probes_alternate_then_the_favoured_arm_runs_unless_another_is_clearly_faster() -> None:
    tuner: LoopTuner[Pick] = LoopTuner(["a", "b"], repeats=3, reprobe_every=10)
    arms = _run(tuner, {"a": 1.0, "b": 0.98}, 14)  # b 2% faster: noise
    assert arms[:6] == ["a", "b", "a", "b", "a", "b"]
    assert arms[6:] == ["a", "a", "a", "b", "a", "a", "a", "a"]  # step 10 re-measures the other
    faster = LoopTuner[Pick](["a", "b"], repeats=3, reprobe_every=10)
    arms = _run(faster, {"a": 1.0, "b": 0.8}, 14)
    assert arms[6:] == ["b", "b", "b", "a", "b", "b", "b", "b"]
    turn = faster.turn(15, "a")
    assert turn.kind == "settled" and "median step a 1.000s, b 0.800s" in turn.reason


def test_a_decision_is_kept_recalled_by_a_later_run_and_reopened_by_drift(tmp_path: Path) -> None:
    def tuner() -> LoopTuner[Pick]:
        return LoopTuner(["a", "b"], ChoiceCache(Pick, tmp_path), WORKLOAD, repeats=2, reprobe_every=5)

    first = tuner()
    assert first.recall(64.0) is None and first.signature is not None
    assert first.signature.item_size == size_bucket(64.0) == 64.0
    _run(first, {"a": 1.0, "b": 0.5}, 4)
    first.keep(Pick("b", 3), "measured")
    first.keep(Pick("b", 3), "measured again")  # unchanged: not written again
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["config"] == {"arm": "b", "size": 3} and record["reason"] == "measured"
    assert record["measured_s"] == {"a": 1.0, "b": 0.5}

    second = tuner()
    hit = second.recall(70.0)  # the same bucket as 64
    assert hit is not None and hit[0] == Pick("b", 3)
    second.follow("b")
    turns = [second.turn(step, "a") for step in range(1, 7)]
    assert [t.arm for t in turns] == ["b", "b", "b", "b", "a", "b"]
    assert [t.kind for t in turns].count("recalled") == 5
    assert not any(second.drifted(70.0) for _ in range(5))
    assert not second.drifted(300.0) and not second.drifted(300.0) and second.drifted(300.0)
    assert second.recall(300.0) is None and second.recalled is None
    other_machine = LoopTuner(
        ["a", "b"], ChoiceCache(Pick, tmp_path), Signature("loop", 64, 0.0, "machine-b")
    )
    assert other_machine.recall(64.0) is None


def test_bad_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="two or more distinct arms"):
        LoopTuner(["a"])
    with pytest.raises(ConfigError, match="two or more distinct arms"):
        LoopTuner(["a", "a"])
    with pytest.raises(ConfigError, match="repeats"):
        LoopTuner(["a", "b"], repeats=0)
    with pytest.raises(ConfigError, match="reprobe_every"):
        LoopTuner(["a", "b"], reprobe_every=True)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="both a cache and a workload"):
        LoopTuner(["a", "b"], ChoiceCache(Pick, tmp_path))
    with pytest.raises(ConfigError, match="unknown arm"):
        LoopTuner(["a", "b"]).record("c", 1.0)
    assert size_bucket(0.0) == 0.0 and size_bucket(100.0) != size_bucket(64.0)
