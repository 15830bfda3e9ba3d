"""The tuning-cost benchmark's arithmetic (``benchmarks/tuning_cost_verl.py``) on constructed runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("verl")

from tuning_cost_verl import probe_flags, tuning_cost


def _rows(arms: str, walls: list[float], probes: str) -> list[dict]:
    return [
        {"iteration": i + 2, "wall_s": w, "g_ing": 4 if a == "w" else 2, "probe": p == "p"}
        for i, (a, w, p) in enumerate(zip(arms, walls, probes, strict=True))
    ]


def test_the_cost_is_the_other_arms_excess_over_the_settled_median() -> None:
    # 3 stream probes, 3 whole probes, then stream settles; one scheduled whole re-measure
    arms = "swswsw" + "ssss" + "w" + "ssss"
    walls = [1.0, 1.3, 1.0, 1.2, 1.0, 1.4] + [1.0] * 4 + [1.5] + [1.0] * 4
    probes = "pppppp" + "...." + "p" + "...."
    res = tuning_cost(_rows(arms, walls, probes), groups=4)
    assert res["settled_arm"] == "stream" and res["probe_steps"] == 7 and res["other_arm_steps"] == 4
    assert res["tuning_s"] == pytest.approx(0.3 + 0.2 + 0.4 + 0.5)
    assert res["tuning_share"] == pytest.approx(1.4 / sum(walls), rel=1e-3)
    assert res["median_wall_s"] == {"stream": 1.0, "whole": pytest.approx(1.35)}


def test_a_run_that_settles_on_whole_batches_charges_the_streamed_steps() -> None:
    arms = "swswsw" + "wwww"
    walls = [2.0, 1.0, 2.0, 1.0, 2.0, 1.0] + [1.0] * 4
    res = tuning_cost(_rows(arms, walls, "pppppp...."), groups=4)
    assert res["settled_arm"] == "whole" and res["tuning_s"] == pytest.approx(3.0)
    # no other arm at all: nothing charged
    none = tuning_cost(_rows("ssss", [1.0, 1.1, 0.9, 1.0], "...."), groups=4)
    assert none["other_arm_steps"] == 0 and none["tuning_s"] == 0.0


def test_probe_flags_follow_the_policy_counter(tmp_path: Path) -> None:
    counts = [0, 1, 1, 2, 2, 2]
    lines = [
        json.dumps({"step": i + 1, "data": {"conduit/policy/probe_steps": c}}) for i, c in enumerate(counts)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert probe_flags(tmp_path) == {1: False, 2: True, 3: False, 4: True, 5: False, 6: False}
