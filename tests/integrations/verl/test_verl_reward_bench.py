"""``verl_iteration.py --reward-only`` without Ray: the runs' order and flags, the final scores, the
seed-to-seed spread rule, the file rewritten after every run (a series cut short keeps what ran), a
failed run recorded as an error, and the report's renderer.

``verl_runs.run`` is replaced by a writer of the files the CPU harness writes (``metrics.jsonl``: one
``{"step", "data"}`` line per step), so what is checked is the benchmark's own logic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

import report_vllm  # noqa: E402
import verl_iteration  # noqa: E402
import verl_runs  # noqa: E402

#: final score (every step's mean score) per (system, seed) of the fake runs
SCORES = {("verl_sync", 0): 0.2, ("conduit", 0): 0.25, ("verl_sync", 1): 0.3, ("verl_sync", 2): 0.1}


def _fake_run(
    calls: list[tuple[str, int, list[str]]], fail: set[tuple[str, int]], out: Path | None = None
) -> Any:
    """Records (system, seed, flags) and, with ``out``, how many curves that file held at the call."""

    def run(work: Path, mode: str, steps: int, args: Any, extra: list[str]) -> tuple[int, str]:
        system = "conduit" if mode == "conduit" else "verl_sync"
        calls.append((system, args.seed, extra))
        if out is not None:
            held.append(len(json.loads(out.read_text())["reward_curve"]["curves"]) if out.exists() else 0)
        if (system, args.seed) in fail:
            return 1, "boom"
        work.mkdir(parents=True, exist_ok=True)
        score = SCORES.get((system, args.seed), 0.2)
        lines = [json.dumps({"step": s, "data": {"critic/score/mean": score}}) for s in range(1, steps + 1)]
        (work / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        return 0, ""

    held: list[int] = []
    run.held = held  # type: ignore[attr-defined]
    return run


def test_parse_rules() -> None:
    args = verl_iteration.parse(
        ["--rollout", "vllm", "--reward-only", "--reward-steps", "50", "--seeds", "3"]
    )
    assert args.reward_only and args.seeds == 3 and (args.batch_size, args.n) == (16, 8)
    for bad in (
        ["--reward-only"],  # no --reward-steps
        ["--rollout", "paced", "--reward-steps", "5"],  # the paced rollout needs a calibration
        ["--reward-steps", "1"],
        ["--reward-steps", "5", "--seeds", "0"],
    ):
        with pytest.raises(SystemExit):
            verl_iteration.parse(bad)


def test_run_order_puts_a_comparison_and_the_baselines_spread_first() -> None:
    assert verl_runs.reward_order(0, 3) == [
        ("verl_sync", 0),
        ("conduit", 0),
        ("verl_sync", 1),
        ("verl_sync", 2),
        ("conduit", 1),
        ("conduit", 2),
    ]
    assert verl_runs.reward_order(5, 1) == [("verl_sync", 5), ("conduit", 5)]


def test_reward_only_writes_after_every_run_and_keeps_a_failed_runs_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int, list[str]]] = []
    out = tmp_path / "verl_reward_vllm_grpo.json"
    run = _fake_run(calls, fail={("conduit", 1)}, out=out)
    monkeypatch.setattr(verl_runs, "run", run)
    argv = ["--rollout", "vllm", "--reward-only", "--reward-steps", "12", "--seeds", "3", "--batch-size", "8"]
    argv += ["--response-length", "128", "--out", str(out), "--work", str(tmp_path / "w")]
    result, path = verl_iteration.bench(verl_iteration.parse(argv))
    assert path == out and [c[:2] for c in calls] == verl_runs.reward_order(0, 3)
    assert run.held == [0, 1, 2, 3, 4, 4]  # each run finds the file holding every run before it
    for system, _, extra in calls:
        assert extra[:2] == ["--lr", "0.003"] and "--rollout" in extra and "vllm" in extra
        assert ("--batch-size" in extra) and extra[extra.index("--response-length") + 1] == "128"
        assert ("--poll-interval" in extra) == (system == "verl_sync")
    doc = json.loads(out.read_text())
    rc = doc["reward_curve"]
    assert rc["final_score"]["verl_sync"] == {"0": 0.2, "1": 0.3, "2": 0.1}
    assert rc["final_score"]["conduit"] == {"0": 0.25, "2": 0.2}
    assert rc["verl_sync_spread"] == [0.1, 0.3] and rc["conduit_within_spread"] is True  # mean 0.225
    assert set(doc["errors"]) == {"reward_conduit_s1"}
    assert doc["machine"]["git_commit"] and doc["machine"]["load_average_end"] is not None
    assert out.with_suffix(".png").exists()
    page = "\n".join(report_vllm.reward(doc))
    assert "| GRPO | conduit | 2 | 0.2000 |" in page and "0.1000 .. 0.3000" in page
    assert "within it: met" in page and "errors in reward_conduit_s1" in page


def test_outside_the_spread_is_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_runs, "run", _fake_run([], fail=set()))
    monkeypatch.setitem(SCORES, ("conduit", 0), 0.9)
    args = verl_iteration.parse(
        ["--reward-only", "--reward-steps", "4", "--seeds", "3", "--work", str(tmp_path)]
    )
    args.out = str(tmp_path / "r.json")
    result, _ = verl_iteration.bench(args)
    assert result["reward_curve"]["conduit_within_spread"] is False
    assert "**missed**" in "\n".join(report_vllm.reward(result))
