"""scaling.py --measure (issue 32): the aggregation of measured rows, the refused ratios, the validation
verdicts and bad input, on fakes of our own records (fast); one real node of TQ on Conduit's backend
(ray, ~20 s; SimpleStorage's and the full 1-8 node sweep are slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scaling_config import Calibration
from scaling_measure import (
    QUICK_WORKLOAD,
    backend_ratios,
    parse_nodes,
    percentiles,
    rllib_rows,
    tq_row,
    validate,
)
from scaling_validate import call_seconds

from conduit.errors import ConfigError

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def fake_config(system: str, nodes: int, seconds: float, agent_puts: int = 16) -> dict:
    """A record as scaling_measure_tq.run writes it: two iterations, the driver's and the agents' calls."""
    calls = [{"caller": "node", "op": "agent_put", "samples": 1, "bytes": 1000, "seconds": 0.01}] * agent_puts
    calls += [{"caller": "driver", "op": "driver_get", "samples": 16, "bytes": 4096, "seconds": 0.02}]
    it = {"data_path_s": seconds, "phases_s": {"generate": seconds / 2, "update": seconds / 2},
          "controller_requests": 50, "controller_request_s": 0.1, "cross_node_bytes": 100 * (nodes - 1),
          "local_bytes": 1000, "calls": calls}  # fmt: skip
    return {"system": system, "nodes": nodes, "startup_s": 1.0, "store_nodes": list(range(nodes)),
            "iterations": [{"iteration": 0, **it}, {"iteration": 1, **it}]}  # fmt: skip


def test_a_tq_row_carries_the_issue_fields_and_medians():
    r = tq_row(fake_config("Conduit", 2, 0.5), QUICK_WORKLOAD)
    for k in ("kind", "system", "nodes", "gpus", "measured_s", "data_path_share"):
        assert k in r
    assert (r["kind"], r["system"], r["nodes"], r["measured_s"]) == ("measured", "conduit", 2, 0.5)
    assert r["cross_node_bytes"] == 100 and r["controller_requests"] == 50
    assert r["per_call_s"]["agent_put"]["n"] == 32 and r["per_call_s"]["agent_put"]["p99"] == pytest.approx(
        0.01
    )
    assert r["work"]["agent_puts"] == 16


def test_percentiles():
    p = percentiles([float(x) for x in range(1, 101)])
    assert p["p50"] == pytest.approx(50.5) and p["p99"] == pytest.approx(99.01) and p["n"] == 100


def test_backend_ratio_is_refused_on_unequal_work():
    c = tq_row(fake_config("Conduit", 2, 0.5), QUICK_WORKLOAD)
    t = tq_row(fake_config("SimpleStorage", 2, 1.0), QUICK_WORKLOAD)
    assert backend_ratios([c, t])["2"] == {"ratio": 0.5, "refused": None}
    short = tq_row(fake_config("SimpleStorage", 2, 1.0, agent_puts=15), QUICK_WORKLOAD)
    got = backend_ratios([c, short])["2"]
    assert got["ratio"] is None and "work differs" in got["refused"]


def rllib_record(conduit_updates: int = 100) -> dict:
    rows = []
    for s, updates in (("native", 100), ("conduit", conduit_updates)):
        for i in range(2):
            rows.append({"system": s, "iteration": i, "wall_s": 4.0 if s == "native" else 3.0,
                         "exposed_s": 0.8 if s == "native" else 0.1, "env_steps_sampled": 200,
                         "gradient_updates": updates, "module_steps_trained": 32 * updates})  # fmt: skip
    return {"nodes": 2, "rows": rows, "runner_nodes": {"native": [0, 1], "conduit": [0, 1]}}


def test_rllib_ratios_and_their_refusal():
    n, c = rllib_rows(rllib_record())
    assert (n["system"], c["system"], c["measured_s"]) == ("rllib_native", "rllib_conduit", 0.1)
    assert c["ratio_exposed"] == 0.125 and c["ratio_wall"] == 0.75 and c["ratio_refused"] is None
    assert c["data_path_share"] == pytest.approx(0.1 / 3.0, abs=1e-4)
    _, c = rllib_rows(rllib_record(conduit_updates=99))
    assert c["ratio_exposed"] is None and c["ratio_wall"] is None
    assert "gradient_updates differ: native 200, conduit 198" in c["ratio_refused"]


def test_validation_states_met_and_missed_and_fills_predictions():
    cal = Calibration()
    raw = [fake_config("Conduit", 1, 0.5)]
    exact = call_seconds(cal, "Conduit", "get", 1, 16, 4096, 2e9)
    for it in raw[0]["iterations"]:
        it["calls"][-1]["seconds"] = exact  # the driver's call exactly as the model predicts it
    rows = [tq_row(raw[0], QUICK_WORKLOAD)]
    v = validate(rows, raw, cal, QUICK_WORKLOAD, 2)
    assert v["per_call"][0]["ratio"] == pytest.approx(1.0) and v["per_call_verdict"]["met"] is True
    assert rows[0]["predicted_s"] > 0 and v["per_iteration"][0]["measured_s"] == 0.5
    it = v["per_iteration"][0]
    assert v["per_iteration_verdict"]["met"] is it["within"]
    for r in raw[0]["iterations"]:
        r["calls"][-1]["seconds"] = exact * 2  # a miss beyond +-25% is stated as missed
    v = validate([tq_row(raw[0], QUICK_WORKLOAD)], raw, cal, QUICK_WORKLOAD, 2)
    assert v["per_call_verdict"] == {"within": 0, "of": 1, "met": False}


def test_bad_node_counts_are_refused_by_name():
    assert parse_nodes("8,1,2,2") == [1, 2, 8]
    for bad in ("3", "1,16", "", "two"):
        with pytest.raises(ConfigError, match="node count"):
            parse_nodes(bad)


def test_the_command_line_refuses_an_unknown_node_count():
    out = subprocess.run([sys.executable, str(BENCH / "scaling.py"), "--measure", "--nodes", "3"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "unknown node count" in out.stderr


@pytest.mark.ray
@pytest.mark.parametrize(
    "system", ["Conduit", pytest.param("SimpleStorage", marks=pytest.mark.slow)]
)  # the same client path: SimpleStorage's run is the slow suite's (~20 s a backend)
def test_one_node_tq_configuration(tmp_path, system):
    """The smallest real configuration: one node, one iteration; counters, checks and provenance hold."""
    pytest.importorskip("transfer_queue")
    from dataclasses import asdict, replace

    w = replace(QUICK_WORKLOAD, prompts=2, n=2)
    out = tmp_path / f"{system}.json"
    cmd = [sys.executable, str(BENCH / "scaling_measure_tq.py"), "--system", system, "--nodes", "1",
           "--workload", json.dumps(asdict(w)), "--iters", "1", "--warmup", "0", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=600, capture_output=True)
    r = json.loads(out.read_text())
    it = r["iterations"][0]
    assert it["cross_node_bytes"] == 0 and it["local_bytes"] > 0  # one node: nothing crosses
    assert it["controller_requests"] >= 3 * w.responses  # each trajectory's put: 3 requests
    ops = {c["op"] for c in it["calls"]}
    assert {"agent_put", "rank_get", "rank_put", "driver_get", "driver_put"} <= ops
    assert {"git_commit", "git_dirty", "load_average_start", "load_average_end"} <= set(r["machine"])


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.ray
def test_full_measured_sweep_one_to_eight_nodes(tmp_path):
    """scaling.py --measure at 1, 2, 4 and 8 nodes (quick sizes): every configuration measured, rows valid."""
    out = tmp_path / "scaling.json"
    cmd = [
        sys.executable,
        str(BENCH / "scaling.py"),
        "--measure",
        "--quick",
        "--nodes",
        "1,2,4,8",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, check=True, timeout=3000)
    d = json.loads(out.read_text())
    measured = [r for r in d["rows"] if r["kind"] == "measured"]
    assert not d["measured"]["errors"]
    assert {(r["system"], r["nodes"]) for r in measured} >= {
        (s, n) for s in ("conduit", "tq_simplestorage", "rllib_native", "rllib_conduit") for n in (1, 2, 4, 8)
    }
    assert all(r["cross_node_bytes"] > 0 for r in measured if r["system"] == "conduit" and r["nodes"] > 1)
    assert len(d["validation"]["per_iteration"]) == 8
