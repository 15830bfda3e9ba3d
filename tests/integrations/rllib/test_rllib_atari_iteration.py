"""``benchmarks/rllib_atari_iteration.py`` (and ``./dev demo atari``, its ``--demo`` mode) on real ALE Qbert:
the smallest run's rows, work, ratios and replay memory; bad input refused; the demo as ``dev`` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from benchmark_modules import BENCHMARKS, load

pytest.importorskip("ale_py")
pytestmark = pytest.mark.ray
SCRIPT = BENCHMARKS / "rllib_atari_iteration.py"
TINY = ["--steps-per-iter", "8", "--iters", "2", "--capacity", "1000", "--hiddens", "16"]


def test_dev_demo_atari_runs_the_script_in_demo_mode():
    dev = (BENCHMARKS.parent / "dev").read_text()
    assert 'setup "rllib,atari,bench"' in dev
    assert '"$VENV/bin/python" benchmarks/rllib_atari_iteration.py --demo "$@"' in dev
    assert "./dev demo atari" in dev.splitlines()[3]  # the usage comment at the top


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--iters", "0"], "--iters must be at least 1"),
        (["--steps-per-iter", "2"], "--steps-per-iter must be at least 4"),
        (["--capacity", "100", "--steps-per-iter", "200"], "below one iteration's steps"),
        (["--quick", "--demo"], "exclusive"),
    ],
)
def test_bad_input_is_refused_by_name(argv, says, tmp_path, capsys):
    argv = [*argv, "--out", str(tmp_path / "r.json")]  # were it not refused: a smoke run, not the results
    with pytest.raises(SystemExit):
        load("rllib_atari_iteration").main(argv if "--quick" in argv else ["--quick", *argv])
    assert says in capsys.readouterr().err


def test_smallest_run_rows_work_ratios_and_memory(ray_local, tmp_path, capsys):
    bench = load("rllib_atari_iteration")
    out = bench.main(["--quick", *TINY, "--out", str(tmp_path / "r.json")])
    d = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert d["benchmark"] == "rllib_atari_iteration" and d["quick"] is True
    for key in ("git_commit", "git_dirty", "load_average_start", "load_average_end", "ale_py"):
        assert key in d["machine"]
    assert d["settings"]["env_steps_per_iteration"] == 8 and d["settings"]["n_step"] == 3
    rows = d["rows"]
    assert [(r["system"], r["iteration"]) for r in rows] == [
        ("native", 0),
        ("conduit", 0),
        ("native", 1),
        ("conduit", 1),
    ]
    for r in rows:
        assert r["wall_s"] > 0 and r["exposed_s"] > 0 and r["env"] == "ALE/Qbert-v5"
        # one fragment of 4 steps per training step, one update of 32 per fragment
        assert r["env_steps_sampled"] == 8 and r["gradient_updates"] == 2 and r["module_steps_trained"] == 64
        assert r["replay_gib"] > 0 and r["process_rss_gib"] > 0
    # native holds float32 [64, 64, 4] stacks per step, Conduit each uint8 frame once and frame references
    for native, conduit in zip(rows[::2], rows[1::2]):
        assert native["replay_gib"] > 8 * conduit["replay_gib"]
        assert native["path_parts"].keys() >= {"buffer_sample", "learner_connector"}
        assert conduit["path_parts"].keys() >= {"buffer_sample", "priority_update"}
    rat = d["ratios"]
    assert (
        rat["native_work"]
        == rat["conduit_work"]
        == {
            "env_steps_sampled": 16,
            "gradient_updates": 4,
            "module_steps_trained": 128,
        }
    )
    assert rat["ratio_refused"] is None
    assert rat["ratio_wall"] == pytest.approx(rat["conduit_wall_s"] / rat["native_wall_s"])
    assert rat["ratio_exposed"] == pytest.approx(rat["conduit_exposed_s"] / rat["native_exposed_s"])
    assert set(d["targets_met"]) == {"ratio_exposed", "ratio_wall"}
    printed = capsys.readouterr().out
    assert "native" in printed and "ratio" in printed and "replay GiB" in printed


def test_unequal_work_refuses_the_ratios():
    bench = load("rllib_atari_iteration")
    row = {"algo": "dqn", "env": "E", "train_batch_size": 32, "wall_s": 1.0, "exposed_s": 0.1}
    row |= {"env_steps_sampled": 8, "gradient_updates": 2, "module_steps_trained": 64}
    row |= {"replay_gib": 0.1, "process_rss_gib": 1.0}
    rows = [row | {"system": "native"}, row | {"system": "conduit", "gradient_updates": 1}]
    rat = bench.summary(rows, "dqn E b32")
    assert rat["ratio_wall"] is None and rat["ratio_exposed"] is None
    assert rat["ratio_refused"] == "gradient_updates differ: native 2, conduit 1"
    assert bench.targets_met(rat) == {"ratio_exposed": None, "ratio_wall": None}


@pytest.mark.slow
def test_demo_entry_writes_into_demo_results(tmp_path):
    """What ``./dev demo atari`` runs, in a fresh process from a fresh folder, one short iteration."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [sys.executable, str(SCRIPT), "--demo", "--iters", "1", "--steps-per-iter", "40", "--hiddens", "16"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    d = json.loads((tmp_path / "demo_results" / "atari_demo.json").read_text())
    assert (tmp_path / "demo_results" / "atari_demo.png").stat().st_size > 0
    assert d["settings"]["mode"] == "demo" and len(d["rows"]) == 2
    for line in ("wall s", "exposed s", "replay GiB", "gradient_updates", "Targets"):
        assert line in done.stdout
    assert "conduit  it=0" in done.stdout and "replay_gib=" in done.stdout  # per iteration, memory too


def test_a_later_timer_takes_over_wrappers_an_earlier_one_installed():
    """The wrappers stay on RLlib's classes for the process's life; the demo's timer after this module's
    run (or any later ``install``) must still see native's path, not leave it to the old, idle timer."""
    timing = load("rllib_native_timing")

    class Path:
        def step(self):
            return 1

        def items(self):
            return iter([1, 2])

    first, second = timing.PathTimer(), timing.PathTimer()
    for t in (first, second):
        t.wrap(Path, "step", "step")
        t.wrap_iter(Path, "items", method="items")
    second.active = True
    assert Path().step() == 1 and list(Path().items()) == [1, 2]
    assert set(second.take()[1]) == {"step", "items"} and first.take() == (0.0, {})
