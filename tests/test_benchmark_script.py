"""``benchmarks/script.py``: the command line, result file and figure every benchmark script shares."""

from __future__ import annotations

import json
from pathlib import Path

import script


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


def test_machine_ends_with_the_provenance_record() -> None:
    import provenance

    m = script.machine(provenance.start(), device="cpu")
    assert m["device"] == "cpu" and m["cpus"] and m["python"]
    assert {"git_commit", "git_dirty", "load_average_start", "load_average_end", "created_utc"} <= set(m)


def test_interleaved_runs_every_step_every_round_in_a_fresh_order() -> None:
    import random

    seen: list[str] = []

    def step(name: str) -> float:
        seen.append(name)
        return float(len(seen))

    out = script.interleaved({n: (lambda n=n: step(n)) for n in "abc"}, 4, random.Random(0))
    assert {n: len(v) for n, v in out.items()} == {"a": 4, "b": 4, "c": 4}
    rounds = [seen[i : i + 3] for i in range(0, 12, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds) and len({tuple(r) for r in rounds}) > 1
    assert script.timed(lambda: None)() >= 0.0
