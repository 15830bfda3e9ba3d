"""Issue 47, item 4: TorchRL's frame-once path is a system of the Atari replay cells (``torchrl_frames``):
in the defaults, refused (saying why) without its venv or disk, its work record (single frames stored,
sampler, n-step), ratios refused for a uniform sampler, and the page reading it as the speed comparison;
one tiny cell run in the TorchRL venv (slow; skipped where the venv is not built)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import rllib_atari as atari  # noqa: E402
import torchrl_atari  # noqa: E402  (benchmarks/peers, on the path rllib_atari sets)
import torchrl_atari_frames as frames  # noqa: E402
from atari_stream import episode_fragments  # noqa: E402
from report_rllib import NOT_COMPARED, rllib_atari  # noqa: E402

TORCHRL_MISSING = atari.ensure_env(atari.DEFAULT_PYTHON, False)
WORK = {"env_steps": 1000, "inserted": 1000, "samples": 300, "updates": 300}


def _row(system: str, tier: str = "disk", p50: float = 1.0, **work) -> dict:
    row = {"system": system, "capacity": 1000, "frames_tier": tier, "sample_update_p50_ms": p50}
    return row | {
        "sample_update_p99_ms": 2 * p50,
        "rss_gib": 1.0,
        "insert_steps_per_s": 100,
        "work": WORK | work,
    }


def _run(tmp_path: Path, *extra: str) -> dict:
    """``rllib_atari.py --systems torchrl_frames`` at capacity 2,000 (20 rounds); the result JSON."""
    out = tmp_path / "atari.json"
    argv = [sys.executable, str(BENCHMARKS / "rllib_atari.py"), "--systems", "torchrl_frames"]
    argv += ["--capacity", "2000", "--rounds", "20", "--disk-dir", str(tmp_path), "--out", str(out), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_torchrl_frames_is_a_default_system_with_its_own_cell() -> None:
    assert atari.cli().parse_args([]).systems == ["conduit", "native", "torchrl", "torchrl_frames"]
    assert "torchrl_frames" in atari.PEERS
    assert (BENCHMARKS / "peers" / atari.TORCHRL_CELLS["torchrl_frames"]).is_file()


def test_torchrl_frames_row_says_why_when_its_venv_is_missing(tmp_path: Path) -> None:
    record = _run(tmp_path, "--torchrl-python", str(tmp_path / "no-venv" / "python"))
    (row,) = record["rows"]
    assert row["system"] == "torchrl_frames" and row["capacity"] == 2000 and row["frames_tier"] == "disk"
    assert row["refused"].startswith("TorchRL venv not found at") and "setup_torchrl.sh" in row["refused"]
    assert "work" not in row and record["ratios"] == {}


def test_the_frames_cell_refuses_a_memmap_larger_than_the_free_disk(tmp_path: Path) -> None:
    row = frames.frames_cell(10**12, 84, 1, 32, tmp_path, "prioritized", True)  # before importing TorchRL
    assert (
        row["system"] == "torchrl_frames"
        and "does not fit" in row["refused"]
        and "GiB of disk" in row["refused"]
    )
    assert "[1, 84, 84]" in row["refused"] and "work" not in row


def test_the_work_record_says_what_was_stored_and_how_it_sampled() -> None:
    stored = frames.transition_bytes(64)
    assert stored == 2 * 64 * 64 + 22  # two single uint8 frames, action, episode, reward, done, terminated
    assert torchrl_atari.transition_bytes(64) > 3.9 * stored  # the recipe layout: both 4-frame stacks
    assert frames.work_record(1000, 1000, 300, True, stored) == WORK | {
        "sampler": "prioritized",
        "n_step": 1,
        "bytes_per_transition": stored,
    }
    uniform = frames.work_record(1000, 1000, 300, False, stored)
    assert uniform["sampler"] == "uniform" and uniform["updates"] == 0


def test_columns_hold_single_frames_of_the_stream_every_cell_shares() -> None:
    cols = list(frames.columns(300, 8, seed=0))
    fragments = list(episode_fragments(300, 8, seed=0))
    assert len(cols) == len(fragments)
    for c, f in zip(cols, fragments, strict=True):
        n = f.t1 - f.t0
        assert c["pixels"].shape == c["next_pixels"].shape == (n, 1, 8, 8) and c["pixels"].dtype == np.uint8
        assert np.array_equal(c["pixels"][1:], c["next_pixels"][:-1])  # next pixels: the following frame
        assert np.array_equal(c["pixels"][:, 0], f.frames[f.t0 : f.t1, ..., 0])
        assert c["done"].shape == (n, 1) and c["done"][:-1].sum() == 0 and c["done"][-1, 0] == f.terminated
    episodes = np.concatenate([c["episode"] for c in cols])
    assert episodes[0] == 0 and set(np.diff(episodes)) <= {0, 1}  # one number per episode, in order
    assert episodes[-1] + 1 == sum(f.t0 == 0 for f in fragments)


def test_ratios_set_the_frames_cell_against_conduit_only_at_equal_work() -> None:
    conduit = _row("conduit", p50=0.5)
    prioritized = _row("torchrl_frames", p50=2.0, sampler="prioritized", n_step=1, bytes_per_transition=8214)
    r = atari.ratios([conduit, prioritized])
    assert r["sample_update_p50_ms/torchrl_frames_over_conduit/1000/frames_on_disk"] == 4.0
    uniform = prioritized | {"work": prioritized["work"] | {"sampler": "uniform"}}  # even with equal counts
    r = atari.ratios([conduit, uniform])
    assert list(r) == ["refused/torchrl_frames/1000/frames_on_disk"] and "work differs" in str(r.popitem()[1])
    assert atari.same_work(_row("torchrl"), conduit)  # a row without a sampler in its work was prioritized
    refused = {"system": "torchrl_frames", "capacity": 1000, "frames_tier": "disk", "refused": "no venv"}
    assert atari.ratios([conduit, refused]) == {
        "refused/torchrl_frames/1000/frames_on_disk": "torchrl_frames: no venv"
    }


def test_the_page_reads_the_frames_cell_as_the_speed_comparison() -> None:
    big = {"capacity": 1_000_000}
    frames_row = _row("torchrl_frames", p50=3.0, sampler="prioritized", n_step=1, bytes_per_transition=8214)
    frames_row["sampler"] = {"class": "PrioritizedSliceSampler", "cache_values": True}
    rows = [_row("conduit"), _row("conduit") | big, _row("torchrl", p50=100.0) | big, frames_row]
    d = {"rows": rows, "ratios": atari.ratios(rows), "machine": {"mem_total_gib": 23.5}}
    text = "\n".join(rllib_atari(d))
    assert "| torchrl_frames (single frames, stacks at sample) | 1 000 |" in text
    assert "| torchrl, recipe layout (both stacks) | 1 000 000 |" in text
    assert "bytes stored vs TorchRL's DQN recipe layout (both 4-frame stacks per transition)" in text
    speed = text.index("- The speed comparison, Conduit against TorchRL's frame-once path")
    assert "1 000: 8 214 bytes stored per transition, prioritized (PrioritizedSliceSampler" in text[speed:]
    assert (
        text.index("torchrl_over_conduit/1000000/") < speed < text.index("torchrl_frames_over_conduit/1000/")
    )
    assert NOT_COMPARED not in text
    without = {"rows": rows[:3], "ratios": atari.ratios(rows[:3])}
    assert "\n".join(rllib_atari(without)).endswith(NOT_COMPARED)


@pytest.mark.slow
@pytest.mark.skipif(TORCHRL_MISSING is not None, reason=f"no TorchRL venv: {TORCHRL_MISSING}")
def test_a_tiny_frames_cell_stores_frames_once_and_samples_prioritized_stacks(tmp_path: Path) -> None:
    (row,) = _run(tmp_path)["rows"]
    steps = sum(f.t1 - f.t0 for f in episode_fragments(2000, 64, seed=0))  # every cell's stream
    assert row["system"] == "torchrl_frames" and "refused" not in row, row.get("refused")
    assert row["work"] == {
        "env_steps": steps,
        "inserted": steps,
        "samples": 20,
        "updates": 20,
        "sampler": "prioritized",
        "n_step": 1,
        "bytes_per_transition": frames.transition_bytes(64),  # read from the memmap: no stacks stored
    }
    assert row["sampler"] == {"class": "PrioritizedSliceSampler", "slice_len": 4, "cache_values": True}
    assert row["batch"] == {"pixels": [32, 4, 64, 64], "next.pixels": [32, 4, 64, 64], "dtype": "torch.uint8"}
    assert 0 < row["sample_update_p50_ms"] <= row["sample_update_p99_ms"] and row["insert_steps_per_s"] > 0
    assert row["frames_gib"] == round(2 * 2000 * 64 * 64 / 2**30, 3) and row["disk_gib"] >= row["frames_gib"]
    assert row["versions"]["torchrl"] == "0.14.1"
    assert not any(p.name.startswith("torchrl_memmap_") for p in tmp_path.rglob("*"))  # scratch removed
