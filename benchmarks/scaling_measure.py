"""``scaling.py --measure``: 1, 2, 4 and 8 Ray nodes on this machine (``ray.cluster_utils.Cluster``,
127.0.0.1), the measured rows and the model's validation against them (issue 32).

Per node count, two processes (``scaling_measure_tq.py``: TQ allows one ``tq.init`` per process, one
controller per cluster), each with its own cluster: TransferQueue's client on Conduit's backend (one
store per node), then RLlib DQN on the same cluster (``scaling_measure_rllib.py``: one env runner per
node per system, native vs ``conduit_rllib.enable``); and TransferQueue's SimpleStorage (one unit per
node). On two shared cores every node, store, client and runner shares the same two cores: these times
are calibration points of the model, not scaling figures.

Each configuration's record (``<system>_<nodes>.json``, with its commit, load and poll) is written to a
folder in the repository, ``benchmarks/results/scaling_measured/`` by default (beside the result JSON:
``<out stem>_measured/``), so the measured half is committed with the model's; ``--measured-from`` reads
such a folder back, taking a record only if it was measured at the short poll (``POLL_S``; older ones
are run again). The logs stay in a temporary folder.

Validation (``scaling_validate``): per call, the driver's calls (made while nothing else runs: the model's
idle ``call_seconds``), median per configuration and call; per iteration, the measured data path against
the model's simulation of the same configuration (``nodes`` x 1 rank, one agent-loop worker per node,
the measured workload, no compute, the measured poll interval). Both against +-25%, met or missed as
measured. Ratios of the two TQ backends, and of RLlib's two systems, are refused where the work differs.
The calibration the model extrapolates is fitted and validated without ``offpath_s`` (``scaling_rules``:
the cluster cannot carry it); its fit is kept as a diagnostic of the measuring host only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import provenance
from scaling_config import TOPOLOGY, Calibration, Cluster, Compute, Workload
from scaling_measure_tq import DESIGN, POLL_S, SYSTEMS
from scaling_validate import (
    FIT_NODES,
    TOLERANCE,
    call_validation,
    fit_offpath,
    iteration_validation,
    refit_calls,
)

from conduit.errors import ConfigError
from conduit.topology import load

HERE = Path(__file__).resolve().parent
NODE_COUNTS = (1, 2, 4, 8)
QUICK_NODES = (1, 2)
#: the measured GRPO workload: 8 prompts x 4 responses (quick: 4 x 4), lengths drawn as the model draws them
WORKLOAD = Workload(prompts=8, n=4, prompt_median=128, response_median=256, max_prompt=512, max_response=1024)
QUICK_WORKLOAD = replace(WORKLOAD, prompts=4)
#: no GPU compute in the measured iteration: the model's compute made negligible (every field must be > 0)
NO_COMPUTE = Compute(peak_flops=1e30, decode_step_s=1e-12, decode_per_seq_s=1e-12)
#: the calls the default constants were fitted to (64-1,024 samples), refitted together with this run's
LARGE_CALLS = HERE / "results" / "tq_backends.json"
LOOPBACK_BYTES_PER_S = 2e9  # loopback TCP on this machine, an order of magnitude (< 1 MB moves per iteration)
CONFIG_TIMEOUT_S = 1200.0
RLLIB_STEPS = {"quick": 200, "full": 400}
ITERS = {"quick": (2, 1), "full": (3, 1)}  # measured, warm-up iterations per configuration


def parse_nodes(text: str) -> list[int]:
    """``"1,2,4,8"`` -> node counts; each must be one of :data:`NODE_COUNTS`."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--nodes: a comma list of node counts from {NODE_COUNTS}, got {text!r}") from None
    bad = [n for n in counts if n not in NODE_COUNTS]
    if bad or not counts:
        raise ConfigError(f"--nodes: unknown node count(s) {bad or text!r}; choose from {NODE_COUNTS}")
    return sorted(set(counts))


def measured_dir(out: Path | None, quick: bool) -> Path:
    """Where a run's per-configuration records go: beside its result JSON (``<stem>_measured/``; default
    ``benchmarks/results/scaling[_quick]_measured/``), in the repository so that they are committed."""
    result = out or HERE / "results" / f"scaling{'_quick' if quick else ''}.json"
    return result.with_name(f"{result.stem}_measured")


def reusable(path: Path, poll_s: float = POLL_S) -> dict[str, Any] | None:
    """An earlier configuration's record at ``path``, or None (printed why) where it is missing, failed
    or was measured at another poll than ``poll_s`` (before issue 47's rules: none recorded, 0.05 s)."""
    if not path.exists():
        return None
    r = json.loads(path.read_text())
    if "error" in r or r.get("poll_s") != poll_s:
        why = r.get("error", f"measured at poll {r.get('poll_s', 'unrecorded')}, not {poll_s} s")
        print(f"not reusing {path}: {str(why)[:200]}; measuring it again", flush=True)
        return None
    return r


def run_config(system: str, nodes: int, quick: bool, rllib: bool, logdir: Path, into: Path) -> dict[str, Any]:
    """One configuration in its own process (its own session: a timeout ends everything it started);
    its record written to ``into``, its log to ``logdir``."""
    mode = "quick" if quick else "full"
    iters, warmup = ITERS[mode]
    out = into / f"{system}_{nodes}.json"
    cmd = [sys.executable, str(HERE / "scaling_measure_tq.py"), "--system", system, "--nodes", str(nodes),
           "--workload", json.dumps(asdict(QUICK_WORKLOAD if quick else WORKLOAD)), "--iters", str(iters),
           "--warmup", str(warmup), "--out", str(out)]  # fmt: skip
    if rllib:
        cmd += ["--rllib-steps", str(RLLIB_STEPS[mode])]
    log = logdir / f"{system}_{nodes}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=CONFIG_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this call started, nothing else
            proc.wait()
            rc = -9
    if rc != 0 or not out.exists():
        tail = log.read_text()[-1500:]
        return {"system": system, "nodes": nodes, "error": f"exit {rc}; log {log}:\n{tail}"}
    return json.loads(out.read_text())


def percentiles(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": float(np.percentile(values, 50)),
        "p99": float(np.percentile(values, 99)),
    }


def tq_row(r: dict[str, Any], workload: Workload) -> dict[str, Any]:
    """A measured row (medians over the measured iterations) of one TQ configuration."""
    its = r["iterations"]
    med = {k: statistics.median(i[k] for i in its) for k in
           ("data_path_s", "controller_requests", "controller_request_s", "cross_node_bytes", "local_bytes")}  # fmt: skip
    calls = [c for i in its for c in i["calls"]]
    ops = sorted({c["op"] for c in calls})
    prompt, response = workload.lengths(0)
    return {
        "kind": "measured",
        "system": DESIGN[r["system"]],
        "backend": r["system"],
        "nodes": r["nodes"],
        "gpus": r["nodes"],
        "gpus_note": "training ranks on CPU, one per node (no GPU here)",
        "measured_s": round(med["data_path_s"], 4),
        "data_path_s": round(med["data_path_s"], 4),
        "data_path_share": 1.0,
        "controller_requests": med["controller_requests"],
        "controller_request_s": round(med["controller_request_s"], 4),
        "cross_node_bytes": med["cross_node_bytes"],
        "local_bytes": med["local_bytes"],
        "per_call_s": {op: percentiles([c["seconds"] for c in calls if c["op"] == op]) for op in ops},
        "phases_s": {
            k: round(statistics.median(i["phases_s"][k] for i in its), 4) for k in its[0]["phases_s"]
        },
        "iterations": len(its),
        "store_nodes": r["store_nodes"],
        "startup_s": round(r["startup_s"], 1),
        "work": {
            "responses": workload.responses,
            "response_tokens": int(response.sum()),
            "prompt_tokens": int(prompt.sum()),
            "agent_puts": sum(c["op"] == "agent_put" for c in calls) // len(its),
        },  # fmt: skip
    }


def rllib_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Measured rows of RLlib DQN at one node count: data path (exposed) seconds per iteration, medians."""
    from rllib_native_timing import ratio_or_refusal, work_totals

    rows = r["rows"]
    work = {s: work_totals(rows, s) for s in ("native", "conduit")}
    out = []
    for s in ("native", "conduit"):
        mine = [x for x in rows if x["system"] == s]
        exposed = statistics.median(x["exposed_s"] for x in mine)
        wall = statistics.median(x["wall_s"] for x in mine)
        out.append({"kind": "measured", "system": f"rllib_{s}", "nodes": r["nodes"], "gpus": None,
                    "env_runners": r["nodes"], "runner_nodes": r["runner_nodes"].get(s),
                    "measured_s": round(exposed, 4), "wall_s": round(wall, 4), "data_path_share": round(exposed / wall, 4),
                    "iterations": len(mine), "work": work[s]})  # fmt: skip
    n, c = out
    for key, field in (("ratio_exposed", "measured_s"), ("ratio_wall", "wall_s")):
        ratio, refused = ratio_or_refusal(n[field], c[field], work["native"], work["conduit"])
        c[key], c["ratio_refused"] = None if ratio is None else round(ratio, 3), refused
    return out


def backend_ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Conduit / SimpleStorage data path per node count, refused where the work differs."""
    out: dict[str, Any] = {}
    for n in sorted({r["nodes"] for r in rows}):
        by = {r["system"]: r for r in rows if r["nodes"] == n}
        if {"conduit", "tq_simplestorage"} - set(by):
            continue
        c, t = by["conduit"], by["tq_simplestorage"]
        if c["work"] != t["work"]:
            out[str(n)] = {
                "ratio": None,
                "refused": f"work differs: conduit {c['work']}, tq_simplestorage {t['work']}",
            }
        else:
            out[str(n)] = {"ratio": round(c["measured_s"] / t["measured_s"], 3), "refused": None}
    return out


def validate(
    rows: list[dict[str, Any]],
    raw: list[dict[str, Any]],
    cal: Calibration,
    workload: Workload,
    host_cores: int,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """The per-call and per-iteration tables (+-25%) and the verdicts, stated as met or missed; the
    per-iteration model puts every node, store, client and the controller on ``host_cores`` shared
    cores and polls every ``poll_s``, as they ran (``Cluster.host_cores``)."""
    calls = []
    for r in raw:
        groups: dict[tuple, list[float]] = {}
        for it in r["iterations"]:
            for c in it["calls"]:
                if c["caller"] == "driver":
                    key = (c["op"].removeprefix("driver_"), c["samples"], c["bytes"])
                    groups.setdefault(key, []).append(c["seconds"])
        for (op, samples, nbytes), secs in sorted(groups.items()):
            calls.append({"system": r["system"], "op": op, "nodes": r["nodes"], "samples": samples, "bytes": nbytes,
                          "seconds": statistics.median(secs)})  # fmt: skip
    per_call = call_validation(calls, cal, LOOPBACK_BYTES_PER_S)
    tq = [r for r in rows if r["system"] in ("conduit", "tq_simplestorage")]
    iters = [{"system": r["system"], "nodes": r["nodes"], "gpus_per_node": 1, "agent_workers": r["nodes"],
              "data_path_s": r["measured_s"]} for r in tq]  # fmt: skip
    per_iteration = iteration_table(iters, cal, workload, host_cores, poll_s)
    for v in per_iteration:
        row = next(r for r in tq if (r["system"], r["nodes"]) == (v["system"], v["nodes"]))
        row["predicted_s"] = round(v["predicted_s"], 4)

    def verdict(table: list[dict[str, Any]]) -> dict[str, Any]:
        within = sum(bool(t["within"]) for t in table)
        return {"within": within, "of": len(table), "met": bool(table) and within == len(table)}

    out = {"per_call": per_call, "per_iteration": per_iteration,
           "per_call_verdict": verdict(per_call), "per_iteration_verdict": verdict(per_iteration),
           "tolerance": TOLERANCE, "poll_s": poll_s}  # fmt: skip
    if set(FIT_NODES) <= {c["nodes"] for c in calls}:  # a (quick) run without them: no refit
        out["refit"] = refit_validation(calls, iters, cal, workload, host_cores, poll_s)
        out["refit"]["per_call_held_out_verdict"] = verdict(out["refit"]["per_call_held_out"])
        out["refit"]["per_iteration_verdict"] = verdict(out["refit"]["per_iteration"])
        out["refit"]["per_iteration_held_out_verdict"] = verdict(out["refit"]["per_iteration_held_out"])
        for v in out["refit"]["per_iteration"]:  # the model runs on this calibration: its prediction leads
            row = next(r for r in tq if (r["system"], r["nodes"]) == (v["system"], v["nodes"]))
            row["predicted_defaults_s"], row["predicted_s"] = row["predicted_s"], round(v["predicted_s"], 4)
    return out


def iteration_table(
    iters: list[dict[str, Any]], cal: Calibration, workload: Workload, host_cores: int, poll_s: float = POLL_S
) -> list[dict[str, Any]]:
    """The per-iteration validation of ``iters`` (TQ rows) against the model on ``cal``, as they ran:
    the measured poll period ``poll_s``, no compute, loopback, ``host_cores`` shared cores."""
    table = iteration_validation(
        iters, replace(cal, poll_s=poll_s), workload, NO_COMPUTE, LOOPBACK_BYTES_PER_S, host_cores
    )
    for v in table:
        v.pop("agent_workers", None)
    return table


def refit_validation(
    calls: list[dict[str, Any]],
    iters: list[dict[str, Any]],
    cal: Calibration,
    workload: Workload,
    host_cores: int,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """One calibration from the measurements on ``FIT_NODES`` only: the store constants refitted to the
    driver's calls there (``refit_calls``), ``offpath_s`` 0 (the cluster cannot carry it:
    ``scaling_rules``); validated on the calls and iterations of the other node counts (held out), as
    they ran (``host_cores`` shared cores, polling every ``poll_s``), every table kept whole too. The
    model extrapolates this calibration as it is. ``offpath_diagnostic``: what an off-path term fitted
    to the fit-node iterations (``fit_offpath``) would give the held-out ones; not used."""
    large = json.loads(LARGE_CALLS.read_text())["rows"]
    nic = Cluster.from_topology(load(TOPOLOGY), 16).nic_bytes_per_s  # as scaling.py validates those calls
    refit = replace(refit_calls(cal, calls, LOOPBACK_BYTES_PER_S, large, nic), offpath_s=0.0)
    per_call = call_validation(calls, refit, LOOPBACK_BYTES_PER_S)
    per_iteration = iteration_table(iters, refit, workload, host_cores, poll_s)
    off = fit_offpath(iters, replace(refit, poll_s=poll_s), workload, NO_COMPUTE, LOOPBACK_BYTES_PER_S,
                      host_cores)  # fmt: skip
    with_off = iteration_table(iters, replace(refit, offpath_s=off), workload, host_cores, poll_s)
    return {"fit_nodes": list(FIT_NODES), "stores": refit.stores, "offpath_s": refit.offpath_s,
            "source": refit.source, "calibration": refit.to_dict(),
            "per_call_held_out": [t for t in per_call if t["nodes"] not in FIT_NODES],
            "per_call_in_sample": [t for t in per_call if t["nodes"] in FIT_NODES],
            "per_call_large_in_sample": call_validation(large, refit, nic),
            "per_iteration": per_iteration,
            "per_iteration_held_out": [t for t in per_iteration if t["nodes"] not in FIT_NODES],
            "offpath_diagnostic": {"offpath_s": off, "used": False,
                                   "why": "acts only through the measuring host's shared cores; the modelled "
                                   "cluster has none, so it is not in the validated calibration",
                                   "per_iteration_held_out": [t for t in with_off if t["nodes"] not in FIT_NODES]}}  # fmt: skip


def measure(
    nodes: list[int], quick: bool, cal: Calibration, reuse: Path | None = None, into: Path | None = None
) -> dict[str, Any]:
    """Every configuration, printed as it ends; the measured rows, the ratios and the validation.
    ``reuse``: a folder of an earlier run's per-configuration JSONs (``<system>_<nodes>.json``), taken as
    measured there where ``reusable``; the others are run. Every record used ends up in ``into``
    (default ``measured_dir(None, quick)``, in the repository)."""
    tok = provenance.start()  # the measuring phase's load, apart from the model's
    logdir = Path(tempfile.mkdtemp(prefix="scaling-measure-"))
    into = into or measured_dir(None, quick)
    into.mkdir(parents=True, exist_ok=True)
    workload = QUICK_WORKLOAD if quick else WORKLOAD
    print(
        f"measure: nodes {nodes}, systems {SYSTEMS} (+ RLlib DQN on Conduit's cluster); records in {into}, "
        f"logs in {logdir}",
        flush=True,
    )
    raw, rows, errors = [], [], []
    for n in nodes:
        for system in SYSTEMS:
            t = time.perf_counter()
            done = reuse / f"{system}_{n}.json" if reuse else None
            r = reusable(done) if done is not None else None
            if r is not None and done is not None and done.resolve() != (into / done.name).resolve():
                shutil.copyfile(done, into / done.name)  # the measured half used is the one committed
            if r is None:
                (into / f"{system}_{n}.json").unlink(missing_ok=True)  # no stale record beside this run's
                r = run_config(system, n, quick, rllib=system == "Conduit", logdir=logdir, into=into)
            if "error" in r:
                errors.append(r)
                print(f"{n} node(s) {system}: FAILED ({r['error'][:300]})", flush=True)
                continue
            raw.append(r)
            rows.append(tq_row(r, workload))
            row = rows[-1]
            print(f"{n} node(s) {system:13s} data path {row['measured_s']:.3f} s/iteration, {row['controller_requests']} "
                  f"controller requests ({row['controller_request_s']:.3f} s), {row['cross_node_bytes']} B across "
                  f"nodes  [{time.perf_counter() - t:.0f} s]", flush=True)  # fmt: skip
            if "rllib" in r:
                rows += rllib_rows(r["rllib"])
                nat, con = rows[-2], rows[-1]
                print(f"{n} node(s) RLlib DQN     exposed native {nat['measured_s']:.3f} s, conduit {con['measured_s']:.3f} s"
                      f" (ratio {con['ratio_exposed'] if con['ratio_exposed'] is not None else 'refused'}); runners on "
                      f"nodes {nat['runner_nodes']} / {con['runner_nodes']}", flush=True)  # fmt: skip
    return {"rows": rows, "errors": errors, "ratios": backend_ratios([r for r in rows if r["system"] in DESIGN.values()]),
            "validation": validate(rows, raw, cal, workload, host_cores()), "workload": asdict(workload),
            "setup": setup(quick), "reused": str(reuse) if reuse else None, "records": repo_path(into),
            "logs": str(logdir),
            "machine": provenance.finish(tok)}  # fmt: skip


def repo_path(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it (a committed folder), else as given."""
    try:
        return str(path.resolve().relative_to(HERE.parent))
    except ValueError:
        return str(path)


def host_cores() -> int:
    """The cores this machine's Ray nodes share (a reused run is taken as measured on this machine)."""
    return len(os.sched_getaffinity(0))


def setup(quick: bool) -> dict[str, Any]:
    mode = "quick" if quick else "full"
    iters, warmup = ITERS[mode]
    return {
        "ray": "ray.cluster_utils.Cluster on 127.0.0.1, 2 logical CPUs and 160 MiB object store per node",
        "iterations": {"measured": iters, "warmup": warmup, "statistic": "median over measured iterations"},
        "tq": "per node one client actor (agent-loop worker and rank); the driver on node 0; see scaling_measure_tq.py",
        "poll_s": POLL_S,
        "rllib": f"DQN CartPole-v1, train batch 32, {RLLIB_STEPS[mode]} env steps an iteration, one env runner per node "
        "per system, overlap async; data path = the exposed experience path (rllib_native_timing wrappers)",
        "data_path_share": "TQ rows: 1.0 (no compute in the measured iteration); RLlib rows: exposed / wall",
        "cross_node_bytes": "payload bytes of each call's samples whose store (global index mod stores) is on "
        "another node than the caller, counted in every client process",
        "controller_requests": "every client's round trips to TransferQueue's controller (its request socket and "
        "the storage manager's notify), with the seconds each caller waited on them",
        "no_compute": asdict(NO_COMPUTE),
        "loopback_bytes_per_s": LOOPBACK_BYTES_PER_S,
        "host_cores": host_cores(),
        "caveat": "2 shared cores for every node, store, client and runner: calibration points, not scaling figures; "
        "the per-iteration validation models that sharing (Cluster.host_cores)",
    }
