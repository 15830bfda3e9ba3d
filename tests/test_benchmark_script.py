"""``benchmarks/script.py``: the command line, result file and figure every benchmark script shares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import script  # noqa: E402


def test_parser_has_quick_and_out() -> None:
    p = script.parser("doc", quick="a short run")
    assert vars(p.parse_args([])) == {"quick": False, "out": None}
    args = p.parse_args(["--quick", "--out", "x.json"])
    assert args.quick and args.out == Path("x.json")
    assert script.parser("doc", quick="q", out=Path("d.json")).parse_args([]).out == Path("d.json")


def test_write_result_names_the_benchmark_and_writes_the_figure_beside_it(tmp_path: Path) -> None:
    args = script.parser(None, quick="q").parse_args(["--quick", "--out", str(tmp_path / "r" / "b.json")])
    plotted: list[Path] = []
    out = script.write_result("bench", args, {"rows": [1, 2], "path": Path("p")}, plotted.append)
    assert out == tmp_path / "r" / "b.json" and plotted == [tmp_path / "r" / "b.png"]
    assert json.loads(out.read_text()) == {"benchmark": "bench", "quick": True, "rows": [1, 2], "path": "p"}


def test_default_result_path_says_quick(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(script, "RESULTS", tmp_path)
    args = script.parser(None, quick="q").parse_args(["--quick"])
    assert script.write_result("bench", args, {}, lambda png: None) == tmp_path / "bench_quick.json"
    args = script.parser(None, quick="q").parse_args([])
    assert script.write_result("bench", args, {}, lambda png: None) == tmp_path / "bench.json"


def test_save_figure_writes_a_png(tmp_path: Path) -> None:
    fig, ax = script.pyplot().subplots()
    ax.plot([0, 1], [1, 0])
    script.save_figure(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
