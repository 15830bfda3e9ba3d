"""Issue 47's rules for scaling.py: the short SimpleStorage poll, the between-system ratio validated at
the held-out node counts, the extrapolation on exactly the validated terms, and the measured half kept
in the repository. Fakes of our own records and tiny simulations: seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import scaling_measure as sm
from scaling_config import SHORT_POLL_S, TOPOLOGY, Calibration, Cluster
from scaling_rules import HELD_OUT, RATIO_TOLERANCE, check_carried, ratio_validation

from conduit.errors import ConfigError
from conduit.topology import load

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
CLUSTER = Cluster.from_topology(load(TOPOLOGY), 1024)
#: the committed scaling.json's off-path term (made before issue 47's rules)
OLD_OFFPATH_S = 7.718e-3


def test_simplestorage_polls_at_the_short_period_in_the_model_and_the_measured_runs():
    import scaling_measure_tq

    assert SHORT_POLL_S <= 0.02
    assert Calibration().poll_s == SHORT_POLL_S == scaling_measure_tq.POLL_S == sm.POLL_S
    with pytest.raises(ConfigError, match="poll_s must be <= 0.02"):
        Calibration(poll_s=2.0)  # verl's shipped poll: refused
    assert Calibration(poll_s=0.01).poll_s == 0.01


def iterations(ratios: dict[int, float]) -> list[dict]:
    """The model's per-iteration rows on measured configurations giving these Conduit ÷ SimpleStorage ratios."""
    out = []
    for n, r in ratios.items():
        out += [{"system": "tq_simplestorage", "nodes": n, "predicted_s": 0.4},
                {"system": "conduit", "nodes": n, "predicted_s": 0.4 * r}]  # fmt: skip
    return out


def measured(ratios: dict[int, float]) -> dict[str, dict]:
    return {str(n): {"ratio": r, "refused": None} for n, r in ratios.items()}


def test_held_out_node_counts_are_the_measured_ones_not_fitted():
    assert HELD_OUT == (2, 4)


def test_the_ratio_validates_within_a_tolerance_below_the_claimed_effect():
    v = ratio_validation(iterations({2: 0.90, 4: 1.05}), measured({2: 0.88, 4: 1.07}), 0.90, 1024)
    assert v["validated"] is True and v["verdict"] == "validated"
    assert v["claimed_effect"] == pytest.approx(0.1) and v["tolerance"] == RATIO_TOLERANCE < 0.1
    assert [r["nodes"] for r in v["held_out"]] == [2, 4]
    assert v["held_out"][0] == {"nodes": 2, "measured_ratio": 0.88, "modelled_ratio": 0.9, "difference": 0.02,
                                "within": True}  # fmt: skip


def test_the_committed_files_ratios_are_not_validated():
    """The model's 2-node ratio 1.039 against the measured 0.878 (scaling.json before issue 47)."""
    v = ratio_validation(iterations({2: 1.039, 4: 1.051}), measured({2: 0.878, 4: 1.068}), 0.92, 1024)
    assert v["validated"] is False and v["verdict"] == "not validated"
    assert [r["within"] for r in v["held_out"]] == [False, True] and "[2]" in v["why"]


def test_a_claimed_effect_no_larger_than_the_tolerance_is_not_validated():
    exact = ratio_validation(iterations({2: 1.0, 4: 1.0}), measured({2: 1.0, 4: 1.0}), 0.97, 1024)
    assert all(r["within"] for r in exact["held_out"])
    assert exact["validated"] is False and exact["tolerance_below_effect"] is False
    assert "not below the claimed effect" in exact["why"]
    unequal = ratio_validation(iterations({2: 1.0, 4: 1.0}), measured({2: 1.0, 4: 1.0}), None, 1024)
    assert unequal["validated"] is False and "unequal work" in unequal["why"]


def test_a_held_out_count_without_both_ratios_fails():
    only_two = ratio_validation(iterations({2: 0.9}), measured({2: 0.9, 4: 0.9}), 0.8, 1024)
    refused = ratio_validation(
        iterations({2: 0.9, 4: 0.9}),
        {"2": {"ratio": 0.9}, "4": {"ratio": None, "refused": "work"}},
        0.8,
        1024,
    )
    nothing = ratio_validation([], {}, 0.8, 1024)
    for v, absent in ((only_two, "[4]"), (refused, "[4]"), (nothing, "[2, 4]")):
        assert v["validated"] is False and f"no measured or modelled ratio at {absent}" in v["why"]


def test_the_extrapolation_refuses_a_term_the_cluster_would_drop():
    with_term = Calibration(offpath_s=OLD_OFFPATH_S)
    with pytest.raises(ConfigError, match="offpath_s"):
        check_carried(with_term, with_term, CLUSTER)  # host_cores 0: the term would cost nothing there
    check_carried(with_term, with_term, Cluster(8, 1, 2e9, 0.0, "measured", host_cores=2))
    check_carried(Calibration(), Calibration(), CLUSTER)
    with pytest.raises(ConfigError, match="differs from the validated one in \\['offpath_s'\\]"):
        check_carried(with_term, Calibration(), CLUSTER)


def test_the_model_runs_on_the_validated_calibration_and_refuses_one_it_would_cut():
    import scaling

    good = Calibration(store_share=0.4)
    assert scaling.model_calibration({"calibration": good.to_dict()}, Calibration(), CLUSTER) == good
    assert scaling.model_calibration(None, good, CLUSTER) == good
    old = {"calibration": Calibration(offpath_s=OLD_OFFPATH_S).to_dict()}  # the pre-issue-47 calibration
    with pytest.raises(ConfigError, match="offpath_s"):
        scaling.model_calibration(old, Calibration(), CLUSTER)


def fake_calls_and_iterations() -> tuple[list[dict], list[dict]]:
    calls, iters = [], []
    for system, scale in (("Conduit", 1.0), ("SimpleStorage", 1.2)):
        for n in (1, 2, 4, 8):
            for op, base in (("get", 0.02), ("put", 0.03)):
                for samples in (16, 32):
                    calls.append({"system": system, "op": op, "nodes": n, "samples": samples,
                                  "bytes": 4096 * samples, "seconds": scale * base * (1 + samples / 32 + n / 8)})  # fmt: skip
            design = {"Conduit": "conduit", "SimpleStorage": "tq_simplestorage"}[system]
            iters.append({"system": design, "nodes": n, "gpus_per_node": 1, "agent_workers": n,
                          "data_path_s": scale * (0.3 + 0.06 * n)})  # fmt: skip
    return calls, iters


def test_the_validated_calibration_holds_no_term_the_cluster_drops():
    calls, iters = fake_calls_and_iterations()
    out = sm.refit_validation(calls, iters, Calibration(), sm.WORKLOAD, host_cores=2)
    cal = Calibration.from_dict(out["calibration"])
    assert cal.offpath_s == 0.0 == out["offpath_s"] and cal.poll_s == SHORT_POLL_S
    check_carried(cal, cal, CLUSTER)  # what was validated is what the cluster runs, term for term
    diag = out["offpath_diagnostic"]
    assert diag["used"] is False and diag["offpath_s"] >= 0
    assert {t["nodes"] for t in diag["per_iteration_held_out"]} == set(HELD_OUT)


def record(system: str, nodes: int, poll: float | None = SHORT_POLL_S) -> dict:
    calls = [{"caller": "node", "op": "agent_put", "samples": 1, "bytes": 1000, "seconds": 0.01}] * 16
    calls += [{"caller": "driver", "op": "driver_get", "samples": 16, "bytes": 4096, "seconds": 0.02}]
    it = {"data_path_s": 0.5, "phases_s": {"generate": 0.25, "update": 0.25}, "controller_requests": 50,
          "controller_request_s": 0.1, "cross_node_bytes": 0, "local_bytes": 1000, "calls": calls}  # fmt: skip
    r = {"system": system, "nodes": nodes, "startup_s": 1.0, "store_nodes": [0], "iterations": [it, it]}
    return r if poll is None else r | {"poll_s": poll}


def test_the_measured_records_are_written_to_the_repository():
    assert sm.measured_dir(None, quick=False) == BENCH / "results" / "scaling_measured"
    assert sm.measured_dir(None, quick=True) == BENCH / "results" / "scaling_quick_measured"
    assert sm.measured_dir(Path("/x/run.json"), quick=False) == Path("/x/run_measured")


def test_reuse_takes_only_records_measured_at_the_short_poll(tmp_path):
    for name, r in (("new", record("Conduit", 1)), ("old", record("Conduit", 1, poll=None)),
                    ("long", record("Conduit", 1, poll=0.05)), ("failed", {"error": "exit 1"})):  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    assert sm.reusable(tmp_path / "new.json") == record("Conduit", 1)
    for name in ("old", "long", "failed", "missing"):
        assert sm.reusable(tmp_path / f"{name}.json") is None


def test_measure_reuses_into_the_committed_folder_and_reruns_an_old_record(tmp_path, monkeypatch):
    earlier, into = tmp_path / "earlier", tmp_path / "scaling_measured"
    earlier.mkdir()
    (earlier / "Conduit_1.json").write_text(json.dumps(record("Conduit", 1)))
    (earlier / "SimpleStorage_1.json").write_text(json.dumps(record("SimpleStorage", 1, poll=None)))
    ran = []

    def fake_run(system, nodes, quick, rllib, logdir, into):
        ran.append((system, nodes))
        r = record(system, nodes)
        (into / f"{system}_{nodes}.json").write_text(json.dumps(r))
        return r

    monkeypatch.setattr(sm, "run_config", fake_run)
    out = sm.measure([1], True, Calibration(), reuse=earlier, into=into)
    assert ran == [("SimpleStorage", 1)]  # measured at the old poll: measured again
    assert sorted(p.name for p in into.iterdir()) == ["Conduit_1.json", "SimpleStorage_1.json"]
    assert json.loads((into / "Conduit_1.json").read_text()) == record("Conduit", 1)
    assert out["records"] == str(into) and out["validation"]["poll_s"] == SHORT_POLL_S


def test_the_command_line_refuses_a_calibration_the_cluster_would_cut(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(Calibration(offpath_s=OLD_OFFPATH_S).to_dict()))
    out = subprocess.run([sys.executable, str(BENCH / "scaling.py"), "--model", "--calibration", str(cal),
                          "--out", str(tmp_path / "s.json")], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "offpath_s" in out.stderr and not (tmp_path / "s.json").exists()
