"""The scaling model (benchmarks/scaling_*.py, issue 32): deterministic, monotone, a serial controller
saturates past 1 / service time, the calibration fit recovers its constants, and the validation table
flags a miss beyond +-25%. Tiny workloads on a tiny cluster: seconds, not minutes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy
from scaling_config import TOPOLOGY, Calibration, Cluster, Compute, Workload
from scaling_model import DESIGNS, Controller, Iteration, compute_only_s, simulate
from scaling_validate import (
    call_seconds,
    call_validation,
    fit_stores,
    iteration_validation,
    refit_calls,
    validation_table,
)

from conduit.errors import ConfigError
from conduit.topology import load

TINY = Workload(prompts=8, n=4, response_median=300, max_response=2048)
CLUSTER = Cluster(nodes=2, gpus_per_node=2, nic_bytes_per_s=50e9, nic_latency_s=5e-6)
COMPUTE = Compute()


def run(design: str = "conduit", w: Workload = TINY, cal: Calibration | None = None, seed: int = 0, **kw):
    return simulate(DESIGNS[design], kw.pop("cluster", CLUSTER), w, COMPUTE, cal or Calibration(), seed, **kw)


def test_deterministic_for_a_seed_and_seeds_differ():
    a, b = run(seed=3), run(seed=3)
    assert a == b
    assert not np.array_equal(TINY.lengths(3)[1], TINY.lengths(4)[1])
    assert run(seed=4)["iteration_s"] != a["iteration_s"]


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_data_path_is_the_iteration_less_compute(design):
    r = run(design)
    assert r["free_iteration_s"] == pytest.approx(compute_only_s(CLUSTER, TINY, COMPUTE))
    assert r["data_path_s"] == pytest.approx(r["iteration_s"] - r["free_iteration_s"])
    assert 0 < r["data_path_share"] < 1


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_more_bytes_is_never_faster(design):
    cal = Calibration()
    slow = replace(
        cal,
        stores={
            s: {**v, "put": {**v["put"], "per_byte": 1e-8}, "get": {**v["get"], "per_byte": 1e-8}}
            for s, v in cal.stores.items()
        },
    )
    base = run(design, cal=cal)
    assert run(design, cal=slow)["iteration_s"] > base["iteration_s"]
    longer = replace(TINY, response_median=600)
    more = run(design, w=longer)
    assert (
        more["work"]["bytes_moved"] > base["work"]["bytes_moved"]
        and more["iteration_s"] >= base["iteration_s"]
    )
    thin = replace(CLUSTER, nic_bytes_per_s=1e6)
    assert run(design, cluster=thin)["iteration_s"] >= base["iteration_s"]


@pytest.mark.parametrize(
    "design, op, nodes", [("conduit", "put", 1), ("conduit", "get", 4), ("tq_simplestorage", "put", 3)]
)
def test_one_call_on_an_idle_cluster_costs_what_call_seconds_says(design, op, nodes):
    cluster = Cluster(nodes=nodes, gpus_per_node=1, nic_bytes_per_s=1e9, nic_latency_s=0.0)
    it = Iteration(DESIGNS[design], cluster, TINY, COMPUTE, Calibration(), seed=0)
    idx = np.arange(12 * nodes)
    it.env.process(it.call("driver", 0, op, idx, np.full(len(idx), 1e5)))
    it.env.run()
    expected = call_seconds(Calibration(), DESIGNS[design].store, op, nodes, len(idx), 1e5 * len(idx), 1e9)
    assert it.env.now == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("design", ["conduit", "tq_simplestorage"])
def test_a_shared_hosts_cores_serialise_the_services_beyond_them(design):
    """Ray nodes on one machine (``host_cores``): the controller, stores and callers hold one of the
    host's cores while they work, so four nodes' parallel services on one core take longer than on
    four, and a host with a core per service changes nothing. The work is the same."""
    cluster = Cluster(nodes=4, gpus_per_node=1, nic_bytes_per_s=1e9, nic_latency_s=0.0)
    free = run(design, cluster=cluster)
    one = run(design, cluster=replace(cluster, host_cores=1))
    many = run(design, cluster=replace(cluster, host_cores=10**6))
    assert one["data_path_s"] > 1.02 * free["data_path_s"] > 0
    assert many["iteration_s"] == pytest.approx(free["iteration_s"], rel=1e-9)
    assert one["work"] == free["work"] == many["work"]


def test_designs_do_equal_work_and_conduit_asks_the_controller_less():
    c, t = run("conduit"), run("tq_simplestorage")
    assert c["work"] == t["work"]
    assert (
        c["controller"]["requests"] < t["controller"]["requests"]
    )  # one driver put per piece; no kv_list polls


def _serve(rate: float, service: float, n: int) -> Controller:
    env = simpy.Environment()
    ctrl = Controller(env)

    def client(i: int):
        yield env.timeout(i / rate)
        yield from ctrl.serve(service)

    for i in range(n):
        env.process(client(i))
    env.run()
    return ctrl


def test_a_serial_controller_saturates_past_one_over_its_service_time():
    service = 1e-3
    under = _serve(rate=0.8 / service, service=service, n=2000)
    assert under.requests == 2000 and under.max_wait_s == pytest.approx(0.0, abs=1e-12)
    over = _serve(rate=1.25 / service, service=service, n=2000)
    # past saturation the queue grows without bound: the last request waits n * (s - 1/rate)
    assert over.max_wait_s == pytest.approx(1999 * (service - service / 1.25), rel=1e-6)
    assert _serve(rate=1.25 / service, service=service, n=4000).max_wait_s > 1.9 * over.max_wait_s
    assert over.busy_s == pytest.approx(2000 * service)


def test_validation_table_flags_a_miss_beyond_25_percent():
    key = {"system": "conduit", "op": "put", "nodes": 2}
    predicted = [{**key, "samples": s, "predicted_s": p} for s, p in ((1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0))]
    measured = [{**key, "samples": s, "measured_s": m} for s, m in ((1, 1.2), (2, 0.78), (3, 0.81), (5, 1.0))]
    table = {r["samples"]: r for r in validation_table(predicted, measured)}
    assert table[1]["within"] is True and table[1]["ratio"] == pytest.approx(0.833, abs=1e-3)
    assert table[2]["within"] is False  # predicted 1.28x the measured
    assert table[3]["within"] is True
    assert table[5]["within"] is None and table[5]["predicted_s"] is None  # no prediction: never a pass
    with pytest.raises(ConfigError, match="tolerance"):
        validation_table(predicted, measured, tolerance=1.5)
    with pytest.raises(ConfigError, match="measured_s must be > 0"):
        validation_table(predicted, [{**key, "samples": 1, "measured_s": 0.0}])


def test_fit_recovers_synthetic_store_constants_and_validates_them():
    truth = Calibration(
        stores={
            "Conduit": {
                "put": {"a": 2e-3, "b": 5e-5, "per_byte": 3e-10},
                "get": {"a": 1e-3, "b": 2e-5, "per_byte": 1e-10},
                "remote_per_byte": {"put": 1e-9, "get": 2e-9},
            }
        }
    )
    rows = [
        {"system": "Conduit", "op": op, "nodes": n, "samples": s, "bytes": s * 40_000 * f, "seconds": 0.0}
        for op in ("put", "get")
        for n in (1, 3)
        for s in (64, 256, 1024)
        for f in (1, 4)
    ]
    for r in rows:
        r["seconds"] = call_seconds(
            truth, "Conduit", r["op"], r["nodes"], r["samples"], r["bytes"], float("inf")
        )
    fitted = fit_stores(rows, truth)["Conduit"]
    for op in ("put", "get"):
        for k, v in truth.stores["Conduit"][op].items():
            assert fitted[op][k] == pytest.approx(v, rel=1e-6)
        assert fitted["remote_per_byte"][op] == pytest.approx(
            truth.stores["Conduit"]["remote_per_byte"][op], rel=1e-6
        )
    table = call_validation(rows, replace(truth, stores={"Conduit": fitted}))
    assert len(table) == len(rows) and all(r["within"] for r in table)
    off = replace(truth, controller={**truth.controller, "fixed_s": 0.05})  # 50 ms per request: a miss
    assert not all(r["within"] for r in call_validation(rows, off))


def test_refit_recovers_a_and_b_from_small_and_large_calls_and_keeps_the_rest():
    truth = Calibration()
    truth = replace(
        truth,
        stores={
            **truth.stores,
            "Conduit": {**truth.stores["Conduit"], "put": {"a": 3e-3, "b": 4e-5, "per_byte": 4.36e-11}},
        },
    )

    def calls(nodes, samples, nic):
        rows = [{"system": "Conduit", "op": op, "nodes": n, "samples": s, "bytes": s * 4_000, "seconds": 0.0}
                for op in ("put", "get") for n in nodes for s in samples]  # fmt: skip
        for r in rows:
            r["seconds"] = call_seconds(truth, "Conduit", r["op"], r["nodes"], r["samples"], r["bytes"], nic)
        return rows

    small = calls((1, 2, 4, 8), (32,), 2e9)  # the 2- and 4-node calls are held out: not fitted
    held_out = [r for r in small if r["nodes"] in (2, 4)]
    for r in held_out:
        r["seconds"] *= 100  # a fit that used them would move far from the truth
    refit = refit_calls(Calibration(), small, 2e9, calls((1, 3), (64, 1024), 50e9), 50e9)
    for op in ("put", "get"):
        for k in ("a", "b"):
            assert refit.stores["Conduit"][op][k] == pytest.approx(truth.stores["Conduit"][op][k], rel=1e-6)
        assert refit.stores["Conduit"][op]["per_byte"] == truth.stores["Conduit"][op]["per_byte"]
    assert refit.stores["SimpleStorage"] == Calibration().stores["SimpleStorage"]  # no calls: unchanged
    assert refit.source.startswith("refit")
    with pytest.raises(ConfigError, match="needs two measured calls"):
        refit_calls(Calibration(), small[:1], 2e9)


def test_iteration_validation_compares_the_model_with_measured_iterations():
    model = run("tq_simplestorage", cluster=replace(CLUSTER, nic_bytes_per_s=5e9))["data_path_s"]
    measured = [
        {"system": "tq_simplestorage", "nodes": 2, "gpus_per_node": 2, "data_path_s": model * 1.1},
        {"system": "tq_simplestorage", "nodes": 2, "gpus_per_node": 2, "data_path_s": model / 1.5},
    ]
    table = iteration_validation(measured, Calibration(), TINY, COMPUTE, 5e9)
    assert [r["within"] for r in table] == [True, False]
    assert table[1]["ratio"] == pytest.approx(1.5, abs=1e-3)


def test_calibration_and_cluster_reject_bad_input():
    with pytest.raises(ConfigError, match="controller.fixed_s"):
        Calibration(controller={"fixed_s": -1.0, "per_sample_s": 0.0, "per_key_s": 0.0})
    with pytest.raises(ConfigError, match="stores.Conduit.put"):
        Calibration(stores={"Conduit": {"put": {"a": 1.0}, "get": {"a": 0, "b": 0, "per_byte": 0}}})
    with pytest.raises(ConfigError, match="unknown key"):
        Calibration.from_dict({"speed": 1})
    assert Calibration.from_dict(Calibration().to_dict()) == Calibration()
    with pytest.raises(ConfigError, match="responses_sigma|prompts"):
        Workload(prompts=0)
    topo = load(TOPOLOGY)
    big = Cluster.from_topology(topo, 1024)
    assert (big.nodes, big.gpus_per_node, big.nic_bytes_per_s) == (128, 8, 50e9)
    with pytest.raises(ConfigError, match="12 GPUs is not a whole number"):
        Cluster.from_topology(topo, 12)


def _row(system: str, gpus: int, data: float, total: float = 100.0, work: int = 1) -> dict:
    return {
        "system": system,
        "gpus": gpus,
        "data_path_s": data,
        "predicted_s": total,
        "data_path_share": data / total,
        "work": {"bytes": work},
    }


def test_saturation_is_the_scale_of_the_fewest_data_path_seconds():
    import scaling

    rows = [_row("conduit", g, d) for g, d in ((8, 3.0), (16, 4.0), (32, 1.0), (64, 2.0), (128, 6.0))]
    sat = scaling.saturation(rows, "conduit")
    assert sat["saturates_at_gpus"] == 32 and sat["share_over_target_from_gpus"] == 128
    falling = [_row("conduit", g, d) for g, d in ((8, 3.0), (16, 2.0), (32, 1.0))]
    assert scaling.saturation(falling, "conduit") == {
        **scaling.saturation(falling, "conduit"),
        "saturates_at_gpus": None,
    }
    assert scaling.saturation(falling, "conduit")["share_over_target_from_gpus"] is None


def test_summary_refuses_a_ratio_on_unequal_work():
    import scaling

    same = [_row("conduit", 8, 1.0, 90.0), _row("tq_simplestorage", 8, 2.0, 100.0)]
    assert scaling.summary(same)["conduit_over_tq_iteration"] == {"8": 0.9}
    unequal = [_row("conduit", 8, 1.0, 90.0), _row("tq_simplestorage", 8, 2.0, 100.0, work=2)]
    s = scaling.summary(unequal)
    assert s["conduit_over_tq_iteration"] == {"8": None} and s["work_equal"] is False
    assert s["met"] is True and s["conduit_worst_share"] == pytest.approx(1 / 90)
