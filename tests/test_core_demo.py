import json

import core_demo as demo


def test_demo_runs_both_modes_and_writes_results(tmp_path, capsys):
    demo.main(
        [
            "--iters",
            "8",
            "--rounds",
            "1",
            "--batch",
            "32",
            "--dim",
            "4",
            "--fragment",
            "64",
            "--out",
            str(tmp_path),
        ]
    )
    out = json.loads((tmp_path / "demo.json").read_text())
    assert set(out) == {"sync", "async", "provenance"}
    assert {"git_commit", "git_dirty"} <= set(out["provenance"])
    for mode in ("sync", "async"):
        row = out[mode]
        assert 0 < row["exposed_s_median"] < row["iter_s_median"]
    assert out["sync"]["work"] == out["async"]["work"]
    assert "async / sync" in capsys.readouterr().out
