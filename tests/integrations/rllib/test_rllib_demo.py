"""The README demo (``./dev demo`` runs ``benchmarks/rllib_demo.py``) runs on a tiny budget and writes its JSON and plot."""

import importlib.util
import json
from pathlib import Path

import pytest
from benchmark_modules import load

pytestmark = pytest.mark.ray
DEMO = Path(__file__).resolve().parents[3] / "benchmarks" / "rllib_demo.py"


def test_dev_demo_runs_the_demo_script():
    dev = (DEMO.parents[1] / "dev").read_text()
    assert '"$VENV/bin/python" benchmarks/rllib_demo.py "$@"' in dev


def test_demo_tiny_budget(ray_local, tmp_path, capsys):
    report = load("rllib_demo").main(
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


def test_demo_and_timing_are_not_in_the_plugin():
    assert importlib.util.find_spec("conduit_rllib.demo") is None
    assert importlib.util.find_spec("conduit_rllib.timing") is None
