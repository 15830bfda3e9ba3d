"""The buffer benchmark's ``--load`` parts: the spinners really spin only when asked, and the
loaded ÷ idle and median speed-up figures are computed from the right rows."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))

from analysis import MAX_LOADED_OVER_IDLE, compute_load_ratios, evaluate_targets  # noqa: E402
from load import CpuLoad  # noqa: E402


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_spinners_burn_cpu_only_inside_on_and_are_ended_by_close() -> None:
    load = CpuLoad(processes=1)
    pid = load._procs[0].pid
    try:
        time.sleep(0.3)
        paused = _cpu_seconds(pid)
        time.sleep(0.3)
        assert _cpu_seconds(pid) - paused < 0.05  # stopped between uses
        with load.on():
            time.sleep(0.6)
        assert _cpu_seconds(pid) - paused > 0.1  # spun while on (shares 2 busy cores at worst)
    finally:
        load.close()
    assert load._procs == [] and _zombie_or_gone(pid)


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _row(system: str, batch: int, dim: int, us: float, load: bool, op: str = "sample") -> dict:
    return {
        "system": system,
        "op": op,
        "sampler": "prioritized",
        "batch": batch,
        "dim": dim,
        "us_per_call_best": us * 0.5,  # the best round: never used by these figures
        "us_per_call_median": us,
        "load": load,
        "work": {"transitions": batch, "fields": ["obs"], "bytes": batch * dim * 4, "priority_update": True},
    }


def test_load_ratios_pair_each_loaded_row_with_its_idle_row() -> None:
    rows = [
        _row("conduit", 32, 4, 100.0, False),
        _row("conduit", 32, 4, 140.0, True),
        _row("conduit", 256, 4, 200.0, False),
        _row("conduit", 256, 4, 500.0, True),
        _row("torchrl", 32, 4, 300.0, False),
        _row("torchrl", 32, 4, 600.0, True),
    ]
    ratios = {(r["system"], r["batch"]): r["loaded_over_idle"] for r in compute_load_ratios(rows)}
    assert ratios == {("conduit", 32): 1.4, ("conduit", 256): 2.5, ("torchrl", 32): 2.0}
    targets = {t["target"]: t for t in evaluate_targets(rows, {"per_cell": []}, {})}
    load_t = next(t for name, t in targets.items() if "busy" in name)
    assert load_t["passed"] is False
    assert [c["passed"] for c in load_t["cells"]] == [True, False]  # 1.4 and 2.5 against 1.5
    assert MAX_LOADED_OVER_IDLE == 1.5
    torchrl_t = next(t for name, t in targets.items() if "torchrl" in name)
    # Medians only, idle rows only: 300 / 100 at batch 32 (the loaded rows and best rounds ignored).
    assert [(c["batch"], c["ratio"]) for c in torchrl_t["cells"]] == [(32, 3.0)]
    assert torchrl_t["passed"] is True


def test_load_target_not_evaluated_without_load_rows() -> None:
    rows = [_row("conduit", 32, 4, 100.0, False)]
    load_t = evaluate_targets(rows, {"per_cell": []}, {})[-1]
    assert load_t["passed"] is None and "--load" in load_t["reason"]
