"""The verl CPU harness's TransferQueue call totals: all calls, and those after the warm-up iteration."""

from __future__ import annotations

import json

from conduit_verl_cpu import tq_stats


def test_calls_of_the_warm_up_iteration_are_left_out_after_its_end(tmp_path):
    (tmp_path / "tq_calls").mkdir()
    calls = [
        {"op": "put", "s": 1.4, "t": 100.5},  # warm-up: the first put waited for the storage manager
        {"op": "put", "s": 0.01, "t": 102.0},
        {"op": "get", "s": 0.02, "t": 102.5},
    ]
    (tmp_path / "tq_calls" / "1.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    events = [{"version": 1, "t0": 100.0, "t1": 100.2}, {"version": 2, "t0": 101.0, "t1": 101.3}]
    (tmp_path / "gen_events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert tq_stats.warmup_end(tmp_path) == 101.0
    everything = tq_stats.call_totals(tmp_path)
    assert everything["tq_put_calls"] == 2 and abs(everything["tq_put_s"] - 1.41) < 1e-9
    after = tq_stats.call_totals(tmp_path, after=tq_stats.warmup_end(tmp_path))
    assert after == {"tq_put_s": 0.01, "tq_put_calls": 1, "tq_get_s": 0.02, "tq_get_calls": 1}


def test_a_run_without_a_second_iteration_has_no_warm_up_end(tmp_path):
    assert tq_stats.warmup_end(tmp_path) is None
    (tmp_path / "gen_events.jsonl").write_text(json.dumps({"version": 1, "t0": 1.0, "t1": 2.0}) + "\n")
    assert tq_stats.warmup_end(tmp_path) is None
