"""benchmarks/rllib_atari.py's judgement and its native and TorchRL cells, without a full run: ratios only
at equal work, native refused (with what it needs) where it cannot fit, the env-side stacks RLlib's buffer
accepts; TorchRL's cell run small in its venv (skipped where the venv is not built) and refused, saying
why, where the venv is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from benchmark_modules import BENCHMARKS, load

atari = load("rllib_atari")
native = load("rllib_atari_native")
stream = load("atari_stream")
TORCHRL_MISSING = atari.ensure_env(atari.DEFAULT_PYTHON, False)

WORK = {"env_steps": 1000, "inserted": 1000, "samples": 300, "updates": 300}


def _row(system: str, tier: str = "host", p50: float = 1.0, **kw) -> dict:
    row = {"system": system, "capacity": 1000, "frames_tier": tier, "sample_update_p50_ms": p50}
    row |= {"sample_update_p99_ms": 2 * p50, "rss_gib": 1.0, "insert_steps_per_s": 100, "work": dict(WORK)}
    return row | kw


def test_ratios_at_equal_work_and_refused_otherwise() -> None:
    rows = [_row("conduit", p50=0.5), _row("conduit", "disk", p50=1.0), _row("native", p50=2.0)]
    rows.append(_row("torchrl", "disk", p50=3.0))
    r = atari.ratios(rows)
    assert r["sample_update_p50_ms/native_over_conduit/1000/frames_on_host"] == 4.0
    assert r["sample_update_p50_ms/native_over_conduit/1000/frames_on_disk"] == 2.0
    assert r["sample_update_p50_ms/torchrl_over_conduit/1000/frames_on_host"] == 6.0
    assert r["sample_update_p50_ms/torchrl_over_conduit/1000/frames_on_disk"] == 3.0
    rows[2]["work"]["samples"] = 299
    r = atari.ratios(rows)
    assert "work differs: native" in r["refused/native/1000/frames_on_host"]
    assert (
        not any("/native_over_" in k for k in r)
        and "sample_update_p50_ms/torchrl_over_conduit/1000/frames_on_disk" in r
    )
    rows[3]["work"]["env_steps"] = 999
    r = atari.ratios(rows)
    assert "work differs: torchrl" in r["refused/torchrl/1000/frames_on_disk"]
    assert not any("_over_" in k for k in r)
    refused = {"system": "native", "capacity": 1000, "frames_tier": "host", "refused": "does not fit: x"}
    assert atari.ratios([rows[0], refused]) == {
        "refused/native/1000/frames_on_host": "native: does not fit: x"
    }


def test_the_torchrl_target_is_judged_at_1m_with_frames_on_disk_only_at_equal_work() -> None:
    big = {"capacity": atari.TARGET_CAPACITY}
    rows = [_row("conduit", "disk", p50=0.5, **big), _row("torchrl", "disk", p50=1.6, **big)]
    assert atari.targets(rows, atari.ratios(rows)) == {atari.TARGET_NAME: True}
    rows[1]["sample_update_p50_ms"] = 1.4  # 2.8x
    assert atari.targets(rows, atari.ratios(rows)) == {atari.TARGET_NAME: False}
    rows[1]["work"]["updates"] = 1
    (verdict,) = atari.targets(rows, atari.ratios(rows)).values()
    assert verdict.startswith("not judged (work differs")
    refused = {"system": "torchrl", "frames_tier": "disk", "refused": "TorchRL venv not found"} | big
    (verdict,) = atari.targets([rows[0], refused], atari.ratios([rows[0], refused])).values()
    assert verdict == "not judged (torchrl: TorchRL venv not found)"
    (verdict,) = atari.targets(rows[:1], atari.ratios(rows[:1])).values()
    assert verdict == "not judged (not run: torchrl at 1,000,000 (frames on disk))"


def test_native_refuses_a_capacity_that_does_not_fit() -> None:
    row = native.native_cell(10**9, 84, 1, 32, 4, atari.fragments, atari.memory, atari.memory_growth)
    assert row["system"] == "native" and "does not fit" in row["refused"] and "GiB" in row["refused"]


def test_env_stacks_continue_across_chunks_and_rllib_takes_them() -> None:
    from ray.rllib.utils.replay_buffers import PrioritizedEpisodeReplayBuffer

    stack = native.EnvStacker(4)
    buf = PrioritizedEpisodeReplayBuffer(capacity=10_000)
    frames = {}
    for chunks in atari.fragments(400, 8, seed=0):
        ep = stack(chunks)
        obs = np.asarray(ep.get_observations())
        assert obs.shape[1:] == (8, 8, 4) and obs.dtype == np.float32
        frames.setdefault(ep.id_, []).append(obs)
        buf.add([ep])  # RLlib checks that a chunk starts where the previous one ended
    first = next(iter(frames.values()))[0]
    assert np.all(first[0, ..., :3] == 0)  # zeros before the episode's first frame
    assert np.array_equal(first[1, ..., 2], first[0, ..., 3])  # the stack shifts by one frame per step
    assert buf.get_num_timesteps() >= 400


def _run(tmp_path, *extra: str) -> dict:
    """``rllib_atari.py --systems torchrl`` at capacity 2,000 (20 rounds); the result JSON."""
    out = tmp_path / "atari.json"
    argv = [sys.executable, str(BENCHMARKS / "rllib_atari.py"), "--systems", "torchrl", "--capacity", "2000"]
    argv += ["--rounds", "20", "--disk-dir", str(tmp_path), "--out", str(out), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(TORCHRL_MISSING is not None, reason=f"no TorchRL venv: {TORCHRL_MISSING}")
def test_torchrl_cell_fills_the_memmap_samples_the_stacks_and_counts_its_work(tmp_path) -> None:
    (row,) = _run(tmp_path)["rows"]
    steps = sum(f.t1 - f.t0 for f in stream.episode_fragments(2000, 64, seed=0))  # every cell's stream
    assert row["system"] == "torchrl" and row["capacity"] == 2000 and row["frames_tier"] == "disk"
    assert "refused" not in row
    assert row["work"] == {"env_steps": steps, "inserted": steps, "samples": 20, "updates": 20}
    assert row["batch"] == {"pixels": [32, 4, 64, 64], "next.pixels": [32, 4, 64, 64], "dtype": "torch.uint8"}
    assert 0 < row["sample_update_p50_ms"] <= row["sample_update_p99_ms"]
    assert row["insert_steps_per_s"] > 0
    assert row["frames_gib"] == round(2 * 2000 * 4 * 64 * 64 / 2**30, 3)
    assert row["disk_gib"] >= row["frames_gib"]  # the memmap files, allocated on disk
    assert row["rss_gib"] == pytest.approx(row["rss_anon_gib"] + row["rss_file_gib"], abs=0.002)
    assert row["versions"]["torchrl"] and row["versions"]["torch"]
    assert not any(p.name.startswith("torchrl_memmap_") for p in tmp_path.rglob("*"))  # scratch removed


@pytest.mark.skipif(TORCHRL_MISSING is not None, reason=f"no TorchRL venv: {TORCHRL_MISSING}")
def test_torchrl_cell_refuses_a_memmap_larger_than_the_free_disk(tmp_path) -> None:
    row = atari.torchrl_row(atari.DEFAULT_PYTHON, 10**12, 84, 1, str(tmp_path), None)
    assert row["system"] == "torchrl" and "does not fit" in row["refused"] and "GiB of disk" in row["refused"]
    assert "work" not in row


def test_torchrl_row_says_why_when_its_venv_is_missing(tmp_path) -> None:
    record = _run(tmp_path, "--torchrl-python", str(tmp_path / "no-venv" / "python"))
    (row,) = record["rows"]
    assert row["system"] == "torchrl" and row["capacity"] == 2000
    assert row["refused"].startswith("TorchRL venv not found at") and "setup_torchrl.sh" in row["refused"]
    assert "work" not in row and record["ratios"] == {}
    assert record["machine"]["git_commit"] and record["machine"]["mem_total_gib"] > 0
