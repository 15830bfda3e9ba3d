"""The scaling model against measurements: one call's predicted time, the fit of the store constants,
and the validation table (predicted vs measured within +-25%).

A measured call is ``{"system", "op", "nodes", "samples", "bytes", "seconds"}`` (the rows of
``benchmarks/results/tq_backends.json``, or of ``scaling.py --measure`` later); an iteration is
``{"system", "nodes", "gpus_per_node", "data_path_s"}`` (:func:`iteration_validation`). :func:`call_seconds` is the model's time for one call on an
idle system, the same arithmetic the simulation charges (``scaling_model.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from scaling_config import REQUESTS, Calibration, Cluster, Compute, Workload
from scaling_model import DESIGNS, simulate

from conduit.costmodel import OperatorCost, Sample
from conduit.errors import ConfigError

TOLERANCE = 0.25


def controller_seconds(cal: Calibration, op: str, samples: int) -> float:
    """The controller's service time of one ``op`` call's requests on ``samples`` samples, unqueued."""
    c = cal.controller
    return REQUESTS[op] * (c["fixed_s"] + c["per_sample_s"] * samples + cal.rtt_s)


def parts(nodes: int, samples: int) -> int:
    """Stores a call on ``samples`` samples touches when samples go to ``index mod nodes``."""
    return max(1, min(nodes, samples))


def call_seconds(
    cal: Calibration, system: str, op: str, nodes: int, samples: int, nbytes: float, nic_bytes_per_s: float
) -> float:
    """One call on an idle system, as the simulation charges it: its controller requests, then ``k``
    equal parts (one per store; a + b * samples + per_byte * bytes each, remote ones plus the extra
    per byte), the caller's side (1 - store_share) of each in turn, the caller's own node's first;
    the call ends with the last part's store side and its wire."""
    k = parts(nodes, samples)
    per_part = cal.store(system, op).seconds(samples / k, nbytes / k)
    if k == 1:
        return controller_seconds(cal, op, samples) + per_part
    remote_part = nbytes / k
    extra = cal.remote_per_byte(system, op) * remote_part
    share = cal.store_share
    caller_side = (1 - share) * (k * per_part + (k - 1) * extra)
    last = share * (per_part + extra) + remote_part / nic_bytes_per_s
    return controller_seconds(cal, op, samples) + caller_side + last


def fit_stores(
    rows: Iterable[Mapping[str, Any]], cal: Calibration, nic_bytes_per_s: float = float("inf")
) -> dict[str, dict[str, Any]]:
    """Store constants per system and op from measured calls, less the controller's share: a, b,
    per_byte from one-node calls (``OperatorCost.fit``), the remote extra per byte as the median
    excess of multi-node calls over :func:`call_seconds` without it, per remote byte it weighs (>= 0). Rows of other systems are ignored;
    SimpleStorage rows only at one storage unit per node."""
    out: dict[str, dict[str, Any]] = {}
    rows = [r for r in rows if r.get("system") in ("SimpleStorage", "Conduit")]
    rows = [r for r in rows if r.get("storage_units") in (None, r.get("nodes"))]
    for system in sorted({r["system"] for r in rows}):
        out[system] = {"remote_per_byte": {}}
        for op in ("put", "get"):
            local = [
                Sample(
                    1,
                    r["samples"],
                    r["bytes"],
                    max(0.0, r["seconds"] - controller_seconds(cal, op, r["samples"])),
                )
                for r in rows
                if r["system"] == system and r["op"] == op and r["nodes"] == 1
            ]
            if not local:
                raise ConfigError(f"no one-node {system} {op} measurements to fit")
            cost = OperatorCost.fit(local)
            out[system][op] = {"a": cost.a, "b": cost.b, "per_byte": cost.per_byte}
        plain = replace(cal, stores={system: {**out[system], "remote_per_byte": {}}})
        for op in ("put", "get"):
            excess = []
            for r in (r for r in rows if r["system"] == system and r["op"] == op and r["nodes"] > 1):
                k = parts(r["nodes"], r["samples"])
                rest = call_seconds(plain, system, op, r["nodes"], r["samples"], r["bytes"], nic_bytes_per_s)
                weight = r["bytes"] / k * ((1 - cal.store_share) * (k - 1) + cal.store_share)
                excess.append(max(0.0, (r["seconds"] - rest) / weight))
            out[system]["remote_per_byte"][op] = statistics.median(excess) if excess else 0.0
    return out


#: the node counts the per-call refit is fitted to; the others (2 and 4) are held out to validate it
FIT_NODES = (1, 8)


def _with_store_terms(cal: Calibration, system: str, op: str, a: float, b: float) -> Calibration:
    stores = {s: {k: dict(v) for k, v in x.items()} for s, x in cal.stores.items()}
    stores[system][op].update(a=a, b=b)
    return replace(cal, stores=stores)


def refit_calls(
    cal: Calibration,
    small: Iterable[Mapping[str, Any]],
    small_nic_bytes_per_s: float,
    large: Iterable[Mapping[str, Any]] = (),
    large_nic_bytes_per_s: float = float("inf"),
    fit_nodes: tuple[int, ...] = FIT_NODES,
) -> Calibration:
    """``cal`` with each system's and op's per-call ``a`` and per-sample ``b`` refitted (per_byte and
    the remote extra kept) to two sets of measured calls together: ``small``, ``scaling.py
    --measure``'s driver calls (32 samples) on ``fit_nodes`` only (the other node counts are held out
    to validate the fit), and ``large``, the calls the defaults were fitted to (``tq_backends.json``:
    64-1,024 samples on 1 and 3 nodes), each set with its network's bytes per second. A call on ``k``
    stores is linear in ``a`` and ``b`` (:func:`call_seconds`); the fit minimises relative errors
    (each call weighted by 1 / its seconds: the validation's +-25% is relative), clipped at 0. Why: the
    model's calls at scale are small parts (a 1,024-GPU driver call is 64 samples on each of 128
    stores), and the defaults' intercept, fitted to large calls alone, over-predicted the measured
    32-sample calls 2-3x. ``ConfigError`` if a system's op has fewer than two calls to fit."""
    rows = [(r, small_nic_bytes_per_s) for r in small if r.get("nodes") in fit_nodes]
    rows += [(r, large_nic_bytes_per_s) for r in large if r.get("storage_units") in (None, r.get("nodes"))]
    rows = [(r, nic) for r, nic in rows if r.get("system") in cal.stores]
    out = cal
    for system in sorted({r["system"] for r, _ in rows}):
        for op in ("put", "get"):
            mine = [(r, nic) for r, nic in rows if r["system"] == system and r["op"] == op]
            if len({(r["nodes"], r["samples"], r["bytes"]) for r, _ in mine}) < 2:
                raise ConfigError(f"refit: {system} {op} needs two measured calls (nodes {fit_nodes})")
            x, y = [], []
            for r, nic in mine:
                at = (r["nodes"], r["samples"], r["bytes"], nic)
                base = call_seconds(_with_store_terms(cal, system, op, 0.0, 0.0), system, op, *at)
                unit_a = call_seconds(_with_store_terms(cal, system, op, 1.0, 0.0), system, op, *at) - base
                unit_b = call_seconds(_with_store_terms(cal, system, op, 0.0, 1.0), system, op, *at) - base
                x.append([unit_a / r["seconds"], unit_b / r["seconds"]])
                y.append((r["seconds"] - base) / r["seconds"])
            (a, b), *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
            out = _with_store_terms(out, system, op, max(0.0, float(a)), max(0.0, float(b)))
    return replace(
        out,
        source=f"refit: a, b to the driver's measured calls on {list(fit_nodes)} Ray nodes (scaling.py "
        f"--measure) and tq_backends.json's, relative least squares; per_byte, remote extra: {cal.source}",
    )


def validation_table(
    predicted: Iterable[Mapping[str, Any]],
    measured: Iterable[Mapping[str, Any]],
    tolerance: float = TOLERANCE,
) -> list[dict[str, Any]]:
    """Predicted vs measured per matching key (every key but the value columns): one row each with
    ``ratio`` = predicted / measured and ``within`` (|ratio - 1| <= tolerance). A measured row without
    a prediction is a row with ``within: None`` (never a silent pass)."""
    if not 0 < tolerance < 1:
        raise ConfigError(f"tolerance must be in (0, 1), got {tolerance!r}")
    value = ("predicted_s", "measured_s")

    def key(r: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        return tuple(sorted((k, v) for k, v in r.items() if k not in value))

    pred = {key(r): float(r["predicted_s"]) for r in predicted}
    table = []
    for m in measured:
        k, got = key(m), float(m["measured_s"])
        if got <= 0:
            raise ConfigError(f"measured_s must be > 0, got {got!r} for {dict(k)}")
        p = pred.get(k)
        ratio = None if p is None else p / got
        table.append(
            {
                **dict(k),
                "predicted_s": p,
                "measured_s": got,
                "ratio": None if ratio is None else round(ratio, 3),
                "within": None if ratio is None else abs(ratio - 1) <= tolerance,
            }
        )
    return table


def call_validation(
    rows: Iterable[Mapping[str, Any]], cal: Calibration, nic_bytes_per_s: float = float("inf")
) -> list[dict[str, Any]]:
    """The per-call validation table over measured TransferQueue calls (one store per node)."""
    measured, predicted = [], []
    for r in rows:
        if r.get("system") not in cal.stores or r.get("storage_units") not in (None, r.get("nodes")):
            continue
        k = {
            "system": r["system"],
            "op": r["op"],
            "nodes": r["nodes"],
            "samples": r["samples"],
            "bytes": r["bytes"],
        }
        measured.append({**k, "measured_s": r["seconds"]})
        s = call_seconds(cal, r["system"], r["op"], r["nodes"], r["samples"], r["bytes"], nic_bytes_per_s)
        predicted.append({**k, "predicted_s": s})
    return validation_table(predicted, measured)


def iteration_validation(
    measured: Iterable[Mapping[str, Any]],
    cal: Calibration,
    workload: Workload,
    compute: Compute,
    nic_bytes_per_s: float,
    host_cores: int = 0,
) -> list[dict[str, Any]]:
    """The per-iteration validation table: each measured iteration's data-path seconds (``system`` a
    design name, ``nodes`` x ``gpus_per_node`` workers, ``workload`` the measured run's shape, NICs at
    ``nic_bytes_per_s``: loopback on one machine; ``agent_workers`` where given, else verl's 8) against
    the model's for the same configuration; ``host_cores``: the measuring machine's cores, shared by all
    of its Ray nodes (``Cluster.host_cores``; 0: cores to spare)."""
    measured = list(measured)
    predicted = []
    for m in measured:
        cluster = Cluster(
            m["nodes"], m["gpus_per_node"], nic_bytes_per_s, 0.0, "measured configuration", host_cores
        )
        design = DESIGNS[m["system"]]
        got = simulate(design, cluster, workload, compute, cal, agent_workers=m.get("agent_workers", 8))[
            "data_path_s"
        ]
        predicted.append({k: m[k] for k in ("system", "nodes", "gpus_per_node")} | {"predicted_s": got})
    rows = [
        {k: m[k] for k in ("system", "nodes", "gpus_per_node")} | {"measured_s": m["data_path_s"]}
        for m in measured
    ]
    return validation_table(predicted, rows)


def fit_offpath(
    measured: Iterable[Mapping[str, Any]],
    cal: Calibration,
    workload: Workload,
    compute: Compute,
    nic_bytes_per_s: float,
    host_cores: int,
    fit_nodes: tuple[int, ...] = FIT_NODES,
    upper_s: float = 0.05,
) -> float:
    """``Calibration.offpath_s`` fitted to the measured iterations on ``fit_nodes`` (the rows of
    :func:`iteration_validation`; the others are held out), every other constant of ``cal`` kept: the
    value in [0, ``upper_s``] minimising the squared log ratios of predicted to measured data-path
    seconds (a grid, then Brent's method around its best point). The term acts only through
    ``host_cores`` (the cores every Ray node of the measuring machine shared), so ``ConfigError``
    without them, or without a measured iteration on ``fit_nodes``."""
    from scipy.optimize import minimize_scalar

    rows = [m for m in measured if m.get("nodes") in fit_nodes]
    if host_cores <= 0:
        raise ConfigError(
            f"fit_offpath: host_cores must be > 0 (the measuring host's cores), got {host_cores!r}"
        )
    if not rows:
        raise ConfigError(f"fit_offpath: no measured iteration on the fit nodes {fit_nodes}")

    def loss(x: float) -> float:
        table = iteration_validation(
            rows, replace(cal, offpath_s=max(0.0, x)), workload, compute, nic_bytes_per_s, host_cores
        )
        return sum(float(np.log(max(t["predicted_s"], 1e-12) / t["measured_s"])) ** 2 for t in table)

    grid = np.linspace(0.0, upper_s, 21)
    best = int(np.argmin([loss(x) for x in grid]))
    lo, hi = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    res = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-5})
    return float(res.x) if res.fun <= loss(grid[best]) else float(grid[best])


def probe_controller(fields: int = 8, reps: int = 20) -> dict[str, float]:
    """TransferQueue's controller's work per request, measured in this process: its request handlers
    (``kv_retrieve_meta``, ``notify_data_update``, ``kv_list``) on real messages, serialised and
    deserialised as on the wire, without the sockets. Returns a least-squares fit: ``fixed_s`` (one
    request), ``per_sample_s`` (a line through the medians per size and kind), ``per_key_s`` (a
    ``kv_list`` per key in the partition), and the median
    ``create_one_s`` of a ``kv_retrieve_meta`` that creates one key."""
    import time

    import numpy as np
    import torch
    from transfer_queue.controller import PartitionIndexManager, TransferQueueController
    from transfer_queue.sampler import SequentialSampler
    from transfer_queue.utils.zmq_utils import ZMQMessage, ZMQRequestType

    cls = TransferQueueController.__ray_metadata__.modified_class  # the class without Ray's actor
    c = cls.__new__(cls)  # no sockets, no threads: only the state the handlers read
    c.sampler, c.controller_id, c.polling_mode, c.tq_config = SequentialSampler(), "probe", False, None
    c.partitions, c.index_manager, c._metrics = {}, PartitionIndexManager(), None
    schema = {f"f{i}": {"dtype": torch.int64, "shape": (1024,), "is_nested": False} for i in range(fields)}

    def request(kind: Any, body: dict[str, Any], handler: Any) -> float:
        t = time.perf_counter()
        msg = ZMQMessage.deserialize(
            ZMQMessage.create(request_type=kind, sender_id="p", receiver_id="probe", body=body).serialize()
        )
        ZMQMessage.deserialize(handler(msg).serialize())
        return time.perf_counter() - t

    xs, ys, created, n = [], [], [], 0
    for s in (1, 8, 64, 256):
        for _ in range(reps):
            keys = [f"k{n + i}" for i in range(s)]
            n += s
            t = request(
                ZMQRequestType.KV_RETRIEVE_META,
                {"keys": keys, "partition_id": "p", "create": True},
                c._handle_kv_retrieve_meta_request,
            )
            gis = [c.partitions["p"].keys_mapping[k] for k in keys]
            t2 = request(
                ZMQRequestType.NOTIFY_DATA_UPDATE,
                {"partition_id": "p", "global_indexes": gis, "field_schema": schema},
                c._handle_notify_data_update_request,
            )
            t3 = request(
                ZMQRequestType.KV_RETRIEVE_META,
                {"keys": keys, "partition_id": "p", "create": False},
                c._handle_kv_retrieve_meta_request,
            )
            xs += [s, s]
            ys += [t2, t3]
            if s == 1:
                created.append(t)
    # the fit is over requests on existing samples (a put's notify, a get's retrieve); creating keys is
    # reported apart: verl creates one trajectory's key at a time, and that is what the model charges
    x, y = np.array(xs, float), np.array(ys)
    sizes = sorted(set(xs))
    med = [statistics.median(y[(x == v) & (np.arange(len(x)) % 2 == k)]) for v in sizes for k in (0, 1)]
    per_sample, fixed = np.polyfit(np.repeat(sizes, 2).astype(float), np.array(med), 1)
    listing = statistics.median(
        request(ZMQRequestType.KV_LIST, {"partition_id": "p"}, c._handle_kv_list_request) for _ in range(5)
    )
    return {
        "fixed_s": max(0.0, float(fixed)),
        "per_sample_s": max(0.0, float(per_sample)),
        "per_key_s": (listing - max(0.0, float(fixed))) / n,
        "create_one_s": statistics.median(created),
    }


def refit_report(result: Mapping[str, Any]) -> dict[str, Any]:
    """The refit redone from a ``scaling.py --measure`` result (its driver-call medians and measured
    iterations): the constants, the held-out and per-iteration validation, and the modelled share of
    the data path at the largest scale for both designs on the refitted constants. ``ConfigError`` for
    a result measured at another poll than the short one (before issue 47's rules)."""
    import scaling_measure as sm
    from scaling_config import TOPOLOGY

    from conduit.topology import load

    poll = ((result.get("measured") or {}).get("setup") or {}).get("poll_s")
    if poll != sm.POLL_S:
        raise ConfigError(f"refit: measured at poll {poll} s, not {sm.POLL_S} s (issue 47); re-measure")

    calls = [dict(r, seconds=r["measured_s"]) for r in result["validation"]["per_call_measured"]]
    iters = [{"system": r["system"], "nodes": r["nodes"], "gpus_per_node": 1, "agent_workers": r["nodes"],
              "data_path_s": r["measured_s"]}
             for r in result["rows"] if r.get("kind") == "measured" and r["system"] in DESIGNS]  # fmt: skip
    cal = (
        Calibration.from_dict(result["calibration"])
        if "refit" in result["calibration"]["source"]
        else Calibration()
    )
    topo = load(TOPOLOGY)
    out = sm.refit_validation(calls, iters, cal, sm.WORKLOAD, 2)
    largest = Cluster.from_topology(topo, topo.gpu_count)
    refit = Calibration.from_dict(out["calibration"])
    out["data_path_share_at_largest"] = {
        d: round(simulate(DESIGNS[d], largest, Workload(), Compute(), refit)["data_path_share"], 4)
        for d in DESIGNS
    }
    return out


if __name__ == "__main__":  # the defaults' sources: the controller probe and the store fit (printed only)
    import json
    import sys
    from pathlib import Path
    from pprint import pformat

    if sys.argv[1:2] == [
        "refit"
    ]:  # python benchmarks/scaling_validate.py refit benchmarks/results/scaling.json
        import provenance

        tok = provenance.start()
        report = refit_report(json.loads(Path(sys.argv[2]).read_text()))
        print(json.dumps({**report, "machine": provenance.finish(tok)}, indent=1, default=str))
        sys.exit(0)

    print("controller (in process, no sockets):", pformat(probe_controller()))
    rows = json.loads((Path(__file__).resolve().parent / "results" / "tq_backends.json").read_text())["rows"]
    print("stores (tq_backends.json less the controller):", pformat(fit_stores(rows, Calibration())))
    sys.exit(0)
