"""The scaling model's off-path host CPU (``Calibration.offpath_s``, issue 32): concurrent calls on a
host with few cores queue for it and a lone call does not; it costs nothing where nodes have cores to
spare (``host_cores=0``, the modelled cluster); ``fit_offpath`` recovers it from iterations on the fit
nodes and refuses input it cannot fit. Tiny workloads: seconds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy
from scaling_config import Calibration, Cluster, Compute, Workload
from scaling_model import DESIGNS, Iteration, simulate
from scaling_validate import call_seconds, fit_offpath, iteration_validation

from conduit.errors import ConduitError, ConfigError

TINY = Workload(prompts=8, n=4, prompt_median=128, response_median=256, max_prompt=512, max_response=1024)
NO_COMPUTE = Compute(peak_flops=1e30, decode_step_s=1e-12, decode_per_seq_s=1e-12)
NIC = 2e9
OFF = 4e-3


def host(nodes: int, cores: int) -> Cluster:
    return Cluster(nodes, 1, NIC, 0.0, "test host", cores)


def puts(cal: Calibration, cluster: Cluster, callers: int) -> float:
    """``callers`` one-sample puts from as many agents, all sent at once; when the last one returns."""
    it = Iteration(DESIGNS["conduit"], cluster, TINY, NO_COMPUTE, cal, seed=0, agent_workers=callers)
    procs = [
        it.env.process(it.call(f"agent{a}", a % cluster.nodes, "put", np.array([a]), np.array([1e4])))
        for a in range(callers)
    ]
    done: list[float] = []

    def wait():
        yield simpy.AllOf(it.env, procs)
        done.append(it.env.now)

    it.env.process(wait())
    it.env.run()
    return done[0]


def test_concurrent_calls_queue_for_the_off_path_cores_and_a_lone_call_does_not():
    cal, off = Calibration(), Calibration(offpath_s=OFF)
    shared = host(nodes=8, cores=2)
    # a lone call: its off-path work runs on the spare core, so it costs what call_seconds says
    lone = call_seconds(cal, "Conduit", "put", 1, 1, 1e4, NIC)
    assert puts(off, shared, 1) == pytest.approx(lone, rel=1e-9)
    assert puts(cal, shared, 1) == pytest.approx(lone, rel=1e-9)
    # eight at once on two cores: slower than without the term, by at least its share of the cores
    before, after = puts(cal, shared, 8), puts(off, shared, 8)
    assert after > before > lone
    assert after - before >= 0.5 * (8 * OFF / 2)


@pytest.mark.parametrize("design", ["conduit", "tq_simplestorage"])
def test_the_term_costs_nothing_where_nodes_have_cores_to_spare(design):
    """The modelled cluster has ``host_cores=0``: the 2-core calibration must not reach it."""
    cluster = Cluster(nodes=4, gpus_per_node=2, nic_bytes_per_s=50e9, nic_latency_s=5e-6)
    base = simulate(DESIGNS[design], cluster, TINY, Compute(), Calibration())
    with_term = simulate(DESIGNS[design], cluster, TINY, Compute(), Calibration(offpath_s=0.05))
    assert with_term["iteration_s"] == base["iteration_s"]
    shared = replace(cluster, host_cores=2)
    a = simulate(DESIGNS[design], shared, TINY, Compute(), Calibration())
    b = simulate(DESIGNS[design], shared, TINY, Compute(), Calibration(offpath_s=OFF))
    assert b["iteration_s"] > a["iteration_s"]
    assert a["work"] == b["work"]


def measured_at(nodes: tuple[int, ...], off: float) -> list[dict]:
    """Iterations as the model gives them with ``offpath_s = off`` on a 2-core host (measured rows)."""
    rows = [
        {"system": s, "nodes": n, "gpus_per_node": 1, "agent_workers": n, "data_path_s": 1.0}
        for s in DESIGNS
        for n in nodes
    ]
    table = iteration_validation(rows, Calibration(offpath_s=off), TINY, NO_COMPUTE, NIC, host_cores=2)
    for r, t in zip(rows, table):
        r["data_path_s"] = t["predicted_s"]
    return rows


def test_fit_offpath_recovers_the_value_from_the_fit_nodes_only():
    rows = measured_at((1, 8), OFF)
    # the held-out node count carries a wrong value: it must not move the fit
    rows += [dict(r, data_path_s=10 * r["data_path_s"]) for r in measured_at((2,), OFF)]
    got = fit_offpath(rows, Calibration(), TINY, NO_COMPUTE, NIC, host_cores=2, fit_nodes=(1, 8))
    assert got == pytest.approx(OFF, rel=0.05)


def test_fit_offpath_refuses_what_it_cannot_fit():
    rows = measured_at((1, 8), OFF)
    with pytest.raises(ConfigError, match="host_cores") as e:
        fit_offpath(rows, Calibration(), TINY, NO_COMPUTE, NIC, host_cores=0)
    assert isinstance(e.value, ConduitError)
    with pytest.raises(ConfigError, match="no measured iteration on the fit nodes"):
        fit_offpath(rows, Calibration(), TINY, NO_COMPUTE, NIC, host_cores=2, fit_nodes=(4,))
    with pytest.raises(ConfigError, match="measured_s must be > 0"):
        fit_offpath([dict(rows[0], data_path_s=0.0)], Calibration(), TINY, NO_COMPUTE, NIC, host_cores=2)
    with pytest.raises(ConfigError, match="offpath_s"):
        Calibration(offpath_s=-1e-3)
