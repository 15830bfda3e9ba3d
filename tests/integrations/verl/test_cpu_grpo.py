"""Two real GRPO iterations of verl 0.9.1's V1 trainer in Conduit's CPU mode.

About 100 s per mode on an idle 2-core machine (≈75 s of it is Ray/verl start-up): both modes are
slow. The default suite checks the parts on their own: the harness's plugin and overrides
(``test_plugins.py``, ``test_separate_async_cpu.py``: the weight box hands each new version to the
rollout), its rendezvous (``test_cpu_rendezvous.py``), the conduit mode's pieces
(``test_streaming_parts.py``, ``test_piece_writes.py``, ``test_gae_pieces.py``) and the TransferQueue
storage (``test_tq_store_ray.py``, ``test_tq_direct_put_ray.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl_cpu.metrics import read_metrics  # noqa: E402
from verl_cpu_run import run_harness  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]


@pytest.mark.parametrize("mode", ["sync", "conduit"])
def test_cpu_grpo_two_iterations(tmp_path: Path, mode: str) -> None:
    work = tmp_path / "run"
    proc, tail = run_harness(work, "--steps", "2", "--trainer-mode", mode)

    rows = read_metrics(work / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2], tail
    for row in rows:
        for key in ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "critic/score/mean"):
            assert key in row, f"missing {key}"
        assert math.isfinite(row["actor/pg_loss"])
        assert math.isfinite(row["actor/grad_norm"])
    assert any(row["actor/grad_norm"] > 0 for row in rows), rows
    # the rollout received the actor's weights after every step (plus once at start)
    out = proc.stdout + proc.stderr
    assert "hf server: weights v3 loaded" in out, tail
    # TransferQueue storage: verl's own in verl's modes, Conduit's in the conduit mode
    summary = json.loads((work / "summary.json").read_text())
    assert summary["tq_backend_ran"] == {"sync": "SimpleStorage", "conduit": "Conduit"}[mode], summary
