"""The vLLM benchmark's figures: response equivalence, vLLM's own counters, R, off-policy refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from conduit_verl_cpu.vllm_cpu import parse_prometheus  # noqa: E402
from verl_analysis import ratios  # noqa: E402
from verl_vllm_analysis import engine_steps, generation_cost, ingestion_floor, response_identity  # noqa: E402


def _dump(work: Path, steps: dict[int, list[tuple[list[int], list[int]]]]) -> Path:
    work.mkdir()
    lines = [
        json.dumps({"step": s, "samples": [{"prompt": p, "response": r} for p, r in samples]})
        for s, samples in steps.items()
    ]
    (work / "samples.jsonl").write_text("\n".join(lines))
    return work


def test_identity_counts_a_multiset_not_positions(tmp_path: Path) -> None:
    a = _dump(tmp_path / "a", {1: [([1], [5]), ([1], [5]), ([2], [6])], 2: [([1], [7]), ([2], [8])]})
    # same responses in another order at 1; at 2 one response differs; b repeats [1]->[5] once only
    b = _dump(tmp_path / "b", {1: [([2], [6]), ([1], [5]), ([1], [9])], 2: [([2], [8]), ([1], [4])], 3: []})
    got = response_identity(a, b)
    assert got["iterations"] == {"1": {"identical": 2, "responses": 3}, "2": {"identical": 1, "responses": 2}}
    assert got["share_identical"] == 0.6
    assert got["target>=0.95"] is False


def test_identity_of_equal_runs_meets_the_target_and_no_common_iteration_is_none(tmp_path: Path) -> None:
    steps = {1: [([1, 2], [3, 4]), ([1, 2], [3, 5])]}
    same = response_identity(_dump(tmp_path / "a", steps), _dump(tmp_path / "b", steps))
    assert same["share_identical"] == 1.0 and same["target>=0.95"] is True
    none = response_identity(tmp_path / "a", tmp_path / "missing")
    assert none["share_identical"] is None and none["target>=0.95"] is False


PROM = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 300.0
vllm:generation_tokens_total{engine="1",model_name="m"} 100.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 40.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""


def test_prometheus_sums_the_kept_series_over_labels_and_ignores_the_rest() -> None:
    got = parse_prometheus(PROM)
    assert got == {
        "vllm:generation_tokens_total": 400.0,
        "vllm:iteration_tokens_total_count": 40.0,
        "vllm:time_to_first_token_seconds_sum": 2.0,
        "vllm:time_to_first_token_seconds_count": 8.0,
    }


def test_engine_counters_per_iteration_are_differences_of_consecutive_reads(tmp_path: Path) -> None:
    reads = [
        {"version": 1, "t": 0.0, "stats": {"vllm:generation_tokens_total": 0.0}},
        {
            "version": 2,
            "t": 5.0,
            "stats": {
                "vllm:generation_tokens_total": 400.0,
                "vllm:iteration_tokens_total_count": 40.0,
                "vllm:time_to_first_token_seconds_sum": 2.0,
                "vllm:time_to_first_token_seconds_count": 8.0,
            },
        },
        {"version": 3, "t": 9.0, "error": "URLError: refused"},
    ]
    (tmp_path / "vllm_stats.jsonl").write_text("\n".join(json.dumps(r) for r in reads))
    got = engine_steps(tmp_path)
    assert set(got) == {1}  # iteration 2 has no later read: no figure rather than a wrong one
    assert got[1]["generation_tokens"] == 400.0 and got[1]["engine_steps"] == 40.0
    assert got[1]["ttft_s"] == 0.25 and got[1]["inter_token_s"] is None


def _row(system: str, it: int, wall: float, busy: float = 6.0, ingest: float = 2.0) -> dict:
    return {
        "system": system,
        "iteration": it,
        "wall_s": wall,
        "exposed_s": wall / 4,
        "ingest_s": ingest,
        "actor_loss": 0.1,
        "work": {"responses": 128, "response_tokens": 3000},
        "stages": {"gen_busy": busy, "update_actor": 1.0},
    }


def test_generation_cost_gives_tokens_per_second_and_r() -> None:
    rows = [_row("verl_sync_tuned", i, 10.0, busy=6.0 + i, ingest=2.0) for i in (2, 3, 4)]
    got = generation_cost(rows, "verl_sync_tuned")
    assert got["gen_busy_s"] == 9.0 and got["R"] == 4.5 and got["response_tokens_per_s"] == round(3000 / 9, 1)
    assert generation_cost(rows, "conduit")["R"] is None


def test_ratios_against_an_off_policy_baseline_are_refused_with_the_reason() -> None:
    rows = [_row(s, i, w) for i in (2, 3) for s, w in (("verl_colocate_async", 5.0), ("conduit", 8.0))]
    rows += [_row("verl_sync_tuned", i, 10.0) for i in (2, 3)]
    got = ratios(rows, ["verl_sync_tuned", "verl_colocate_async"], off_policy=["verl_colocate_async"])
    assert got["wall/conduit_over_verl_sync_tuned"] == 0.8
    assert "wall/conduit_over_verl_colocate_async" not in got
    assert "off-policy" in got["refused/conduit_over_verl_colocate_async"]
    assert got["median_wall_s/verl_colocate_async"] == 5.0  # reported all the same


def _floor_row(
    system: str, iteration: int, ingest_s: float, tokens: int, wait: float, exposed: float
) -> dict:
    return {
        "system": system,
        "iteration": iteration,
        "ingest_s": ingest_s,
        "work": {"response_tokens": tokens},
        "stages": {"gen_wait_exposed": wait},
        "exposed_s": exposed,
        "wall_s": 10.0,
    }


def test_ingestion_floor_queues_responses_in_finish_order_at_the_baseline_rate(tmp_path: Path) -> None:
    """Iteration 2: the baseline ingested 400 tokens in 2 s (5 ms/token). Responses of 100 tokens end
    at 0, 0.1 and 1.0 s, and one of 100 at 1.0 s too: the first two are done by 1.0 s (0.5 s each, one
    after the other), the last two take 1.0 s after generation ends: floor 1.0 s. With the baseline's
    wait of 0.2 s and exposed 3.0 s, no on-policy schedule gets under (1.0 + 0.2) / 3.0 = 0.4, nor,
    with the baseline's wall of 10 s, under a wall ratio of 0.82."""
    events = [(0.0, 100), (0.1, 100), (1.0, 100), (1.0, 100)]
    (tmp_path / "gen_events.jsonl").write_text(
        "\n".join(json.dumps({"version": 2, "t0": 0.0, "t1": t, "length": n}) for t, n in events)
    )
    rows = [
        _floor_row("verl_sync_tuned", 2, 2.0, 400, 0.2, 3.0),
        _floor_row("conduit", 2, 2.5, 400, 0.3, 1.6),
    ]
    got = ingestion_floor(rows, tmp_path, "conduit")
    assert got["per_iteration"] == {2: 1.0}
    assert got["exposed_floor_s"] == 1.2 and got["exposed_ratio_floor"] == 0.4
    assert got["wall_ratio_floor"] == 0.82  # (10 - 3 + 1.2) / 10
    assert ingestion_floor(rows[1:], tmp_path, "conduit") == {"missing": True}
