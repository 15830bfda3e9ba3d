"""Issue 47: a floor must be a floor (the vLLM ingestion floor is called one only where no measured
iteration fell below it), and the Atari replay section reads its 1M TorchRL comparison as bytes stored."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import report  # noqa: E402
from report_rllib import rllib_atari  # noqa: E402
from report_vllm import floor_line  # noqa: E402
from verl_vllm_analysis import floor_holds, ingestion_floor  # noqa: E402

FLOOR = {
    "per_token_s": 0.0005,
    "floor_s": 0.35,
    "per_iteration": {"2": 0.88, "3": 0.42},
    "baseline_gen_wait_s": 0.23,
    "exposed_floor_s": 0.58,
    "exposed_ratio_floor": 0.231,
    "wall_ratio_floor": 0.812,
}


def _rows(exposed: dict[int, float]) -> list[dict[str, Any]]:
    return [{"system": "conduit", "iteration": i, "exposed_s": e} for i, e in exposed.items()]


def test_an_iteration_below_its_floor_makes_it_no_bound() -> None:
    got = floor_holds(_rows({2: 0.9, 3: 1.5}), FLOOR, "conduit")
    assert got == {
        "is_bound": False,
        "undercut_by": [{"iteration": 2, "exposed_s": 0.9, "exposed_floor_s": 1.11}],
    }
    assert floor_holds(_rows({2: 1.2, 3: 1.5}), FLOOR, "conduit") == {"is_bound": True, "undercut_by": []}
    assert not floor_holds(_rows({7: 1.2}), FLOOR, "conduit")["is_bound"]  # nothing compared


def test_ingestion_floor_reports_whether_it_holds(tmp_path: Path) -> None:
    events = [(0.0, 100), (0.1, 100), (1.0, 100), (1.0, 100)]
    (tmp_path / "gen_events.jsonl").write_text(
        "\n".join(json.dumps({"version": 2, "t0": 0.0, "t1": t, "length": n}) for t, n in events)
    )
    base = {"system": "verl_sync_tuned", "iteration": 2, "ingest_s": 2.0, "work": {"response_tokens": 400}}
    base |= {"stages": {"gen_wait_exposed": 0.2}, "exposed_s": 3.0, "wall_s": 10.0}
    mine = base | {"system": "conduit"}
    assert ingestion_floor([base, mine | {"exposed_s": 1.6}], tmp_path, "conduit")["is_bound"] is True
    under = ingestion_floor([base, mine | {"exposed_s": 1.0}], tmp_path, "conduit")  # floor 1.0 + 0.2
    assert under["is_bound"] is False and under["undercut_by"][0]["iteration"] == 2


def test_the_renderer_says_floor_only_when_it_is_a_bound() -> None:
    bound = floor_line("GRPO", FLOOR | {"is_bound": True, "undercut_by": []})
    assert "ingestion floor" in bound and "no on-policy schedule's exposed time gets under 0.580 s" in bound
    under = [{"iteration": 2, "exposed_s": 0.9157, "exposed_floor_s": 1.1119}]
    text = floor_line("PPO", FLOOR | {"is_bound": False, "undercut_by": under})
    assert "ingestion estimate" in text and "Not a floor: conduit's exposed time fell below" in text
    assert "iteration 2 (exposed 0.916 s against 1.112 s)" in text
    assert "no on-policy schedule" not in text and "ingestion floor" not in text
    assert "Not a floor: it was not checked" in floor_line("PPO", FLOOR)  # an old file without the check


def test_the_committed_vllm_runs_record_whether_their_floor_holds() -> None:
    ppo = json.loads((report.RESULTS / "verl_iteration_vllm_ppo.json").read_text())["ingestion_floor"]
    grpo = json.loads((report.RESULTS / "verl_iteration_vllm_grpo.json").read_text())["ingestion_floor"]
    assert ppo["is_bound"] is False and [u["iteration"] for u in ppo["undercut_by"]] == [2]
    # the issue-48 rerun (ABBA 3x8): conduit's exposed time fell below the estimate at iteration 2
    assert grpo["is_bound"] is False and [u["iteration"] for u in grpo["undercut_by"]] == [2]


def test_the_atari_1m_torchrl_comparison_reads_as_bytes_stored_not_speed() -> None:
    rows = [
        {"system": "native", "capacity": 1_000_000, "refused": "does not fit"},
        {"system": "torchrl", "capacity": 1_000_000, "frames_tier": "disk", "disk_gib": 30.54},
        {"system": "conduit", "capacity": 1_000_000, "frames_tier": "disk", "frames_gib": 4.79},
    ]
    ratios = {"sample_update_p50_ms/torchrl_over_conduit/1000000/frames_on_disk": 193.76}
    text = "\n".join(rllib_atari({"rows": rows, "ratios": ratios, "machine": {"mem_total_gib": 23.5}}))
    assert "bytes stored vs TorchRL's DQN recipe layout (both 4-frame stacks per transition)" in text
    assert "not a speed headline" in text and "30.54 GiB" in text and "4.79 GiB" in text
    assert "| native, as shipped (float32 stacks) | 1 000 000 |" in text
    assert "`CatFrames.make_rb_transform_and_sampler`" in text and "not yet compared" in text
