"""A real verl 0.9.1 run in Conduit's CPU mode starts ``piece_groups=auto`` from a decision cached in
``trainer.v1.conduit.tuner_cache`` (about 100 s, marked slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("conduit_verl_cpu")

from conduit_verl_cpu.metrics import read_metrics  # noqa: E402
from verl_cpu_run import run_harness  # noqa: E402

from conduit.discovery import fingerprint  # noqa: E402
from conduit.piece_policy import PieceChoice, piece_tuner  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]

GROUPS, N = 4, 4  # the harness's defaults


def test_a_run_starts_from_the_cached_decision(tmp_path: Path) -> None:
    cache = tmp_path / "tuner"
    # the cached decision "one whole-batch piece", for every tokens-per-sample bucket this run can have
    tuning = piece_tuner(cache, f"verl/grpo/n{N}", GROUPS * N, fingerprint())
    for half_octaves in range(0, 21):
        tuning.recall(2.0 ** (half_octaves / 2))
        tuning.keep(PieceChoice("whole", GROUPS), "seeded by the test", {})
    work = tmp_path / "run"
    args = ("--steps", "3", "--trainer-mode", "conduit", "--tuner-cache", str(cache))
    _, tail = run_harness(work, *args, "+trainer.v1.conduit.piece_groups=auto")
    rows = read_metrics(work / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3], tail
    # the warm-up step streamed (auto's default: a quarter of the groups); it recalled at its end
    assert rows[0]["conduit/piece_groups"] < GROUPS and rows[0]["conduit/policy/recalled"] == 1.0
    for row in rows[1:]:  # after warm-up: the cached arm, no probes
        assert row["conduit/policy/recalled"] == 1.0, row
        assert row["conduit/piece_groups"] == GROUPS and row["conduit/streamed"] == 0.0, row
        assert row["conduit/policy/probe_steps"] == 0.0, row
