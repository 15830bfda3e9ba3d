"""``max_staleness=k`` end to end: real verl 0.9.1 runs in CPU mode on the paced rollout (slow).

Each run is 3-4 GRPO steps of 4 prompts x 4 responses (about 2.5 min on an idle 2-core machine, most
of it Ray/verl start-up). What they check:

- no group older than ``k`` is ever trained on (the ``group_log`` rows, one per trained group), for
  k = 1 and k = 2 (GRPO) and k = 1 (PPO: GAE with a critic) on separate_async's schedule (the paced
  rollout models hardware of its own: generation never pauses), and k = 1 on colocate_async's
  (``rollout_hardware=shared``), and the mode really runs ahead (groups lag by up to ``k``);
- the staleness Conduit reports per step equals what verl itself computes from the same samples'
  tags (``training/off_policy/trajectory_staleness_worst/*``);
- the weights are pushed to the rollout every step (``timing_s/update_weights``);
- k = 1 next to verl's own ``colocate_async`` on the same seed: the same lag where the schedule fixes
  it (step 1: none; step 2: every group from step 1's warm-up batch, lag 1), never more than 1;
- ``on_stale=recompute`` trains the groups over the bound and counts every one of them.

With ``--pace-scale 4 --pace-tail 8`` generation is slow and long-tailed enough that a group can
miss two steps; whether one does depends on the machine's speed, so drops are reported (and must
agree with verl's eviction count), not required. The decision itself is unit-tested on verl's own
replay buffer (``test_staleness.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("conduit_verl_cpu")  # the CPU harness: pip install --no-deps -e tools/verl_cpu

from conduit_verl.staleness import read_group_log  # noqa: E402
from conduit_verl_cpu.metrics import read_metrics  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

BATCH, N = 4, 4
#: slow, long-tailed generation: a group may miss two steps (and so be over k = 1)
STRAGGLERS = ("--pace-tail", "8", "--pace-scale", "4")
VERL_WORST = "training/off_policy/trajectory_staleness_worst"


def _run(
    work: Path,
    mode: str,
    steps: int,
    knobs: dict[str, object] | None = None,
    pace: tuple = (),
    algo: str = "grpo",
) -> list[dict]:
    """One paced run; its per-step metrics."""
    cmd = [sys.executable, "-m", "conduit_verl_cpu.run", "--trainer-mode", mode, "--rollout", "paced"]
    cmd += ["--algo", algo]
    cmd += ["--batch-size", str(BATCH), "--n", str(N), "--steps", str(steps), "--seed", "0"]
    cmd += ["--work-dir", str(work), *pace]
    if mode == "conduit":
        knobs = {"group_log": str(work / "groups.jsonl"), **(knobs or {})}
        cmd += [f"+trainer.v1.conduit.{k}={v}" for k, v in knobs.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    rows = read_metrics(work / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), tail
    for row in rows:
        assert row["timing_s/update_weights"] > 0  # the weights went to the rollout this step
    return rows


def _lags(work: Path) -> dict[int, list[int]]:
    """Per step, the lag (trained version - oldest generating version) of each trained group."""
    out: dict[int, list[int]] = {}
    for r in read_group_log(work / "groups.jsonl"):
        assert r["trained"] == r["step"] - 1 and r["staleness"] == r["trained"] - r["generated"], r
        out.setdefault(r["step"], []).append(r["staleness"])
    return out


def _agrees_with_verl(rows: list[dict], lags: dict[int, list[int]]) -> None:
    """Conduit's per-step report = the group log = verl's own computation from the samples' tags."""
    for row in rows:
        mine = lags[row["step"]]
        assert len(mine) == BATCH == row["conduit/staleness/groups"]
        assert row["conduit/staleness/max"] == max(mine) == row[f"{VERL_WORST}/max"]
        assert row["conduit/staleness/min"] == min(mine) == row[f"{VERL_WORST}/min"]
        assert row["conduit/staleness/mean"] == pytest.approx(row[f"{VERL_WORST}/mean"])  # groups of n


@pytest.mark.parametrize(
    ("algo", "k", "steps", "pace"),
    [
        ("grpo", 1, 4, STRAGGLERS),
        pytest.param("grpo", 2, 4, (), marks=pytest.mark.long),
        pytest.param("ppo", 1, 3, (), marks=pytest.mark.long),
        pytest.param("grpo", 1, 4, ("shared",) + STRAGGLERS, marks=pytest.mark.long),
    ],
    ids=["k1", "k2", "ppo_k1", "k1_shared"],
)
def test_no_group_older_than_k_is_trained_on(
    tmp_path: Path, algo: str, k: int, steps: int, pace: tuple
) -> None:
    # the paced rollout models hardware of its own (separate_async's schedule: generation never
    # pauses for training); "shared" runs colocate_async's (paused for each step)
    knobs: dict[str, object] = {"max_staleness": k}
    if pace[:1] == ("shared",):
        knobs["rollout_hardware"], pace = "shared", pace[1:]
    rows = _run(tmp_path, "conduit", steps, knobs, pace, algo)
    lags = _lags(tmp_path)
    assert sorted(lags) == list(range(1, steps + 1))
    assert all(0 <= lag <= k for step in lags.values() for lag in step), lags  # THE bound
    assert lags[1] == [0] * BATCH  # step 1 trains the initial weights' groups
    assert max(max(v) for v in lags.values()) >= 1, lags  # it did run ahead
    if k == 2:  # step 3 trains the last of the two warm-up batches, generated by version 0
        assert max(lags[3]) == 2, lags
    _agrees_with_verl(rows, lags)
    dropped = sum(r["conduit/stale_dropped"] for r in rows)
    evicted = sum(r.get("training/off_policy/evicted_samples", 0) for r in rows)
    assert dropped == evicted  # verl evicted exactly the groups Conduit's rule called stale
    assert all(r["conduit/stale_recomputed"] == 0 for r in rows)
    print(f"{algo} k={k}: lags per step {lags}; stale groups dropped {dropped:g}")


@pytest.mark.long
def test_k1_next_to_verls_colocate_async(tmp_path: Path) -> None:
    # colocate_async's schedule is Conduit's on shared hardware (the paced rollout says separate)
    mine = _run(tmp_path / "conduit", "conduit", 3, {"max_staleness": 1, "rollout_hardware": "shared"})
    verl = _run(tmp_path / "colocate_async", "colocate_async", 3)
    _agrees_with_verl(mine, _lags(tmp_path / "conduit"))
    seq = {
        name: [(r[f"{VERL_WORST}/min"], r[f"{VERL_WORST}/max"]) for r in rows]
        for name, rows in (("conduit", mine), ("verl", verl))
    }
    for rows in seq.values():
        assert rows[0] == (0, 0) and rows[1] == (1, 1), seq  # fixed by the schedule: one batch ahead
        assert all(hi <= 1 for _, hi in rows), seq
    print(f"per-step (min, max) lag: {seq}")


@pytest.mark.long
def test_recompute_trains_and_counts_the_groups_over_the_bound(tmp_path: Path) -> None:
    rows = _run(tmp_path, "conduit", 4, {"max_staleness": 1, "on_stale": "recompute"}, STRAGGLERS)
    lags = _lags(tmp_path)
    _agrees_with_verl(rows, lags)
    over = {step: sum(lag > 1 for lag in v) for step, v in lags.items()}
    assert {r["step"]: r["conduit/stale_recomputed"] for r in rows} == over
    assert all(r["conduit/stale_dropped"] == 0 for r in rows)  # nothing evicted under recompute
    print(f"recompute: lags per step {lags}")
