"""The README demo runs on a tiny budget and writes its JSON and plot."""

import json

import pytest
from conduit_rllib import demo

pytestmark = pytest.mark.ray


def test_demo_tiny_budget(ray_local, tmp_path, capsys):
    report = demo.main(
        ["--seconds", "1", "--steps-per-iter", "40", "--max-iters", "1", "--out", str(tmp_path)]
    )
    data = json.loads((tmp_path / "demo.json").read_text())
    assert (tmp_path / "demo.png").stat().st_size > 0
    assert data["summary"] == report["summary"]
    assert {r["system"] for r in data["rows"]} == {"native", "conduit"}
    for r in data["rows"]:
        assert r["wall_s"] > 0 and r["exposed_s"] >= 0
    s = data["summary"]
    assert s["ratio_wall"] > 0 and s["ratio_exposed"] is not None
    out = capsys.readouterr().out
    assert "conduit" in out and "ratio" in out
