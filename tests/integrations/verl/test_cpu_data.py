"""The CPU harness's arithmetic data: every prompt distinct, so no step's batch holds one twice."""

from __future__ import annotations

import pytest

pytest.importorskip("conduit_verl_cpu")

from conduit_verl_cpu.data import make_rows  # noqa: E402

from conduit.errors import ConfigError  # noqa: E402


def test_prompts_are_distinct_and_reproducible() -> None:
    rows = make_rows(256, 0, "train")
    prompts = [r["prompt"][0]["content"] for r in rows]
    assert len(set(prompts)) == 256
    sums = [sum(map(int, p.removesuffix("=").split("+"))) for p in prompts]
    assert [str(s) for s in sums] == [r["reward_model"]["ground_truth"] for r in rows]
    assert make_rows(256, 0, "train") == rows and make_rows(256, 1, "train") != rows


def test_more_problems_than_exist_is_refused() -> None:
    with pytest.raises(ConfigError, match="400 exist"):
        make_rows(401, 0, "train")
