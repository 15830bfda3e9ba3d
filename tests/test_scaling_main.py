"""scaling.py's main under issue 47's rules, with the measuring, the model and its simulations faked
(milliseconds): the model is given exactly the validated calibration, the result records the ratio
validation, its verdict and the poll, and a validated calibration the cluster would cut is refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import scaling
from scaling_config import SHORT_POLL_S, TOPOLOGY, Calibration, Compute, Workload

from conduit.errors import ConfigError
from conduit.topology import load

VERDICT = {"within": 1, "of": 1, "met": True}


def fake_runs(cal: Calibration, measured: float) -> dict[str, Any]:
    """``measure``'s result with a refit to ``cal``: the model's held-out ratio 0.9 against ``measured``."""
    per_iteration = [{"system": s, "nodes": n, "gpus_per_node": 1, "predicted_s": p, "measured_s": p,
                      "ratio": 1.0, "within": True}
                     for n in (1, 2, 4, 8) for s, p in (("conduit", 0.9), ("tq_simplestorage", 1.0))]  # fmt: skip
    refit = {"calibration": cal.to_dict(), "per_iteration": per_iteration, "per_call_held_out_verdict": VERDICT,
             "per_iteration_verdict": VERDICT, "per_iteration_held_out_verdict": VERDICT}  # fmt: skip
    validation = {"per_call": [], "per_iteration": per_iteration, "per_call_verdict": VERDICT,
                  "per_iteration_verdict": VERDICT, "tolerance": 0.25, "poll_s": SHORT_POLL_S, "refit": refit}  # fmt: skip
    ratios = {str(n): {"ratio": measured, "refused": None} for n in (1, 2, 4, 8)}
    return {
        "rows": [],
        "errors": [],
        "ratios": ratios,
        "validation": validation,
        "setup": {"poll_s": SHORT_POLL_S},
    }


def run_main(monkeypatch, tmp_path: Path, refit_cal: Calibration, measured: float = 0.9) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_model(args: Any, cal: Calibration) -> dict[str, Any]:
        seen["model_cal"] = cal
        rows = [{"kind": "modelled", "system": s, "nodes": 128, "gpus": 1024, "predicted_s": p, "data_path_s": 1.0,
                 "data_path_share": 0.01, "work": {"bytes": 1}} for s, p in (("conduit", 9.0), ("tq_simplestorage", 10.0))]  # fmt: skip
        return {"rows": rows, "saturation": {}, "sensitivity": {"gpus": 1024, "data_path_share": {}},
                "workload": Workload(), "compute": Compute(), "calibration": cal, "topology": load(TOPOLOGY)}  # fmt: skip

    def fake_measure(nodes, quick, cal0, reuse=None, into=None):
        seen["into"] = into
        return fake_runs(refit_cal, measured)

    def fake_write(name, args, record, plot):
        seen["record"] = record

    monkeypatch.setattr(scaling, "run_model", fake_model)
    monkeypatch.setattr(scaling, "measure", fake_measure)
    monkeypatch.setattr(scaling, "simulate", lambda *a, **k: {"data_path_share": 0.01})
    monkeypatch.setattr(scaling.script, "write_result", fake_write)
    monkeypatch.setattr(sys, "argv", ["scaling.py", "--measure", "--out", str(tmp_path / "scaling.json")])
    assert scaling.main() == 0
    return seen


def test_main_models_the_validated_calibration_and_records_the_ratio_verdict(monkeypatch, tmp_path):
    refit = Calibration(store_share=0.4)
    seen = run_main(monkeypatch, tmp_path, refit)
    assert seen["model_cal"] == refit and seen["into"] == tmp_path / "scaling_measured"
    r = seen["record"]
    assert r["summary"]["validated"] is True and r["summary"]["headline"] == "validated"
    assert r["summary"]["simplestorage_poll_s"] == SHORT_POLL_S == r["calibration"]["poll_s"]
    v = r["validation"]["ratio"]
    assert [h["nodes"] for h in v["held_out"]] == [2, 4] and v["claimed_ratio"] == 0.9
    assert v["claimed_effect"] == pytest.approx(0.1) and v["tolerance"] < v["claimed_effect"]


def test_main_reads_not_validated_where_the_held_out_ratio_misses(monkeypatch, tmp_path):
    r = run_main(monkeypatch, tmp_path, Calibration(), measured=1.1)["record"]
    assert r["summary"]["validated"] is False and r["summary"]["headline"] == "not validated"


def test_main_refuses_to_extrapolate_a_validated_term_the_cluster_would_drop(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="offpath_s"):
        run_main(monkeypatch, tmp_path, Calibration(offpath_s=7.7e-3))
