"""One measured configuration of ``scaling.py --measure``: a GRPO-shaped iteration through TransferQueue's
client on ``nodes`` Ray nodes of this machine, one backend (``Conduit``: one store per node, or
``SimpleStorage``: as many storage units, round-robin over the nodes). Run in its own process (TQ allows
one ``tq.init`` per process and one controller per Ray cluster) by ``scaling_measure.py``::

    python benchmarks/scaling_measure_tq.py --system Conduit --nodes 2 --out FILE [--quick]

The iteration is the model's (``scaling_model.Iteration``) with no compute: per node one client actor
(an agent-loop worker and a training rank, as ``gpus_per_node=1``); the driver (node 0) plays verl's
trainer. Generation: each agent puts its responses one trajectory at a time, all in flight at once
(``async_kv_batch_put``, as verl's agent loop); the driver notices completion by polling ``kv_list``
every ``POLL_S`` (SimpleStorage, verl's replay buffer, at the short poll every baseline gets: issue 47;
the record keeps it) or when the agents answer (Conduit's channel).
Log-prob stages: each rank gets its shard (the samples its node's store owns, as the model places
them), puts its log-probs; the driver gets the field (and puts it again: SimpleStorage's per-stage put).
Advantage: the driver gets the scores and puts the derived fields. Update: each rank gets its shard's
training fields. Clear. Every process counts its controller requests (round trips and their seconds),
the bytes its calls move to or from a store on another node (per sample, by TQ's routing: global index
mod stores) and times each call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # nodes bind 127.0.0.1 (local_ray.py)

import provenance  # noqa: E402
from scaling_config import (  # noqa: E402
    ADVANTAGE_READS,
    FIELDS,
    LOGPROB_READS,
    ROLLOUT_FIELDS,
    SHORT_POLL_S,
    UPDATE_READS,
    Workload,
)

PARTITION = "scaling"
MIB = 2**20
#: the driver's kv_list poll in the SimpleStorage design: the short poll every baseline gets (issue 47)
POLL_S = SHORT_POLL_S
START_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 300.0
SYSTEMS = ("Conduit", "SimpleStorage")
DESIGN = {"Conduit": "conduit", "SimpleStorage": "tq_simplestorage"}


def fields_of(names: tuple[str, ...], prompt: list[int], response: list[int], fill: list[int]) -> Any:
    """A TensorDict of ``names`` for samples of these lengths: jagged per sample, dtypes as ``FIELDS``
    (8 bytes: int64, 4: float32); each sample's values are its ``fill`` number (checked on the way back)."""
    import torch
    from tensordict import TensorDict

    span = {"prompt": prompt, "response": response, "sequence": [p + r for p, r in zip(prompt, response)]}
    out = {}
    for name in names:
        size, kind = FIELDS[name]
        lengths = torch.tensor(span[kind], dtype=torch.int64)
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        values = torch.repeat_interleave(torch.tensor(fill, dtype=torch.int64), lengths)
        values = values.to(torch.int64 if size == 8 else torch.float32)
        out[name] = torch.nested.nested_tensor_from_jagged(values, offsets)
    return TensorDict(out, batch_size=[len(prompt)])


def sample_bytes(td: Any) -> list[int]:
    """Payload bytes per sample of a TensorDict of jagged (or dense) fields."""
    n = td.batch_size[0]
    per = [0] * n
    for name in td.keys():
        v = td[name]
        if getattr(v, "is_nested", False):
            lengths = v.offsets().diff().tolist()
            size = v.values().element_size() * (v.values()[0].numel() if v.values().dim() > 1 else 1)
            per = [p + int(length) * size for p, length in zip(per, lengths)]
        else:
            row = v.element_size() * (v[0].numel() if v.dim() > 1 else 1)
            per = [p + row for p in per]
    return per


class Probe:
    """This process's counters: controller round trips (count, seconds), bytes to or from stores on
    other nodes, and each timed call. ``unit_nodes[i]``: the node of store ``i`` (TQ routes sample
    ``gi`` to store ``gi mod len(unit_nodes)``)."""

    def __init__(self, unit_nodes: list[str], caller: str) -> None:
        import ray

        self.unit_nodes, self.caller = unit_nodes, caller
        self.node = ray.get_runtime_context().get_node_id()
        self.requests, self.request_s, self.cross_bytes, self.local_bytes = 0, 0.0, 0, 0
        self.calls: list[dict[str, Any]] = []

    def install(self) -> None:
        import transfer_queue.interface as tqi
        from transfer_queue.client import TransferQueueClient
        from transfer_queue.storage.managers.base import StorageManager

        for owner, method in (
            (TransferQueueClient, "_request_controller"),
            (StorageManager, "notify_data_update"),
        ):
            setattr(owner, method, self._counted(getattr(owner, method)))
        manager = tqi._maybe_create_tq_client().storage_manager
        for method in ("put_data", "get_data"):
            setattr(manager, method, self._routed(getattr(manager, method), method == "put_data"))

    def _counted(self, fn: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.requests += 1
                self.request_s += time.perf_counter() - t0

        return counted

    def _routed(self, fn: Any, put: bool) -> Any:
        async def routed(*args: Any, **kwargs: Any) -> Any:
            out = await fn(*args, **kwargs)
            data, meta = (args[0], args[1]) if put else (out, args[0])
            n = len(self.unit_nodes)
            for gi, b in zip(meta.global_indexes, sample_bytes(data)):
                if self.unit_nodes[gi % n] == self.node:
                    self.local_bytes += b
                else:
                    self.cross_bytes += b
            return out

        return routed

    def timed(self, op: str, td_or_n: Any, seconds: float, samples: int) -> None:
        nbytes = sum(sample_bytes(td_or_n)) if td_or_n is not None else 0
        self.calls.append(
            {"caller": self.caller, "op": op, "samples": samples, "bytes": nbytes, "seconds": seconds}
        )

    def take(self) -> dict[str, Any]:
        out = {"requests": self.requests, "request_s": self.request_s, "cross_node_bytes": self.cross_bytes,
               "local_bytes": self.local_bytes, "calls": self.calls}  # fmt: skip
        self.requests, self.request_s, self.cross_bytes, self.local_bytes, self.calls = 0, 0.0, 0, 0, []
        return out


def _client_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class NodeClient:
        """An agent-loop worker and a training rank on one node (its own TQ client)."""

        def __init__(self, system: str, unit_nodes: list[str], lengths: tuple[list[int], list[int]]) -> None:
            import torch

            torch.set_num_threads(1)
            if system == "Conduit":
                import conduit_verl.tq_store as store

                store.register()
            import transfer_queue as tq

            tq.init()  # attaches to the driver's controller
            self.tq, (self.prompt, self.response) = tq, lengths
            self.probe = Probe(unit_nodes, "node")
            self.probe.install()

        def node(self) -> str:
            return self.probe.node

        async def _put(self, keys: list[str], idx: list[int], names: tuple[str, ...], caller: str) -> None:
            td = fields_of(names, [self.prompt[i] for i in idx], [self.response[i] for i in idx], idx)
            t0 = time.perf_counter()
            await self.tq.async_kv_batch_put(keys=keys, partition_id=PARTITION, fields=td)
            self.probe.timed(f"{caller}_put", td, time.perf_counter() - t0, len(idx))

        async def _get(self, keys: list[str], idx: list[int], names: tuple[str, ...]) -> None:
            t0 = time.perf_counter()
            out = await self.tq.async_kv_batch_get(
                keys=keys, partition_id=PARTITION, select_fields=list(names)
            )
            self.probe.timed("rank_get", out, time.perf_counter() - t0, len(idx))
            name = names[0]
            got = out[name].offsets().diff().tolist()
            span = {"prompt": self.prompt, "response": self.response}
            want = [
                span[FIELDS[name][1]][i] if FIELDS[name][1] in span else self.prompt[i] + self.response[i]
                for i in idx
            ]
            if got != want:
                raise RuntimeError(f"rank get of {name}: lengths {got[:8]}..., wanted {want[:8]}...")

        async def rollouts(self, keys: list[str], idx: list[int]) -> None:
            import asyncio

            await asyncio.gather(*(self._put([k], [i], ROLLOUT_FIELDS, "agent") for k, i in zip(keys, idx)))

        async def logprob(self, keys: list[str], idx: list[int], out_field: str) -> None:
            await self._get(keys, idx, LOGPROB_READS)
            await self._put(keys, idx, (out_field,), "rank")

        async def update(self, keys: list[str], idx: list[int]) -> None:
            await self._get(keys, idx, UPDATE_READS)

        def take(self) -> dict[str, Any]:
            return self.probe.take()

    return NodeClient


def start_cluster(nodes: int) -> tuple[Any, list[str]]:
    """``nodes`` Ray nodes on 127.0.0.1 (``local_ray.start_local_cluster``: loopback only; 2 logical CPUs
    each: TQ's controller and a SimpleStorage unit reserve one; a ``native_slot`` and a ``conduit_slot``
    for RLlib's env runners), this process connected to the head; the cluster and the node ids in order."""
    from conduit_rllib.local_ray import start_local_cluster

    slots = {"native_slot": 1, "conduit_slot": 1}
    args = {"num_cpus": 2, "object_store_memory": 160 * MIB, "resources": slots}
    return start_local_cluster(nodes, args, log_to_driver=False)


def unit_nodes(system: str) -> list[str]:
    """The node of each store, in TQ's routing order."""
    import ray
    import transfer_queue.interface as tqi

    manager = tqi._maybe_create_tq_client().storage_manager
    if system == "Conduit":
        manager._handles()
        return list(manager._nodes)
    handles = tqi._TQ_STORAGE["SimpleStorage"]  # name -> actor, in rank order (the manager's order)

    def where(self: Any) -> str:
        return ray.get_runtime_context().get_node_id()

    return ray.get([h.__ray_call__.remote(where) for h in handles.values()], timeout=START_TIMEOUT_S)


def run(system: str, nodes: int, workload: Workload, iters: int, warmup: int, rllib_steps: int = 0,
        seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """``warmup + iters`` iterations; per measured iteration a row of seconds, requests, bytes, calls.
    ``rllib_steps``: then, on the same cluster, RLlib DQN (``scaling_measure_rllib.measure``)."""
    import ray
    import torch
    from omegaconf import OmegaConf
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    torch.set_num_threads(1)
    t_start = time.perf_counter()
    cluster, ids = start_cluster(nodes)
    try:
        import transfer_queue as tq

        backend: dict[str, Any] = {"storage_backend": system}
        if system == "Conduit":
            import conduit_verl.tq_store as store

            store.register()
            backend["Conduit"] = {"timeout_s": CALL_TIMEOUT_S}
        else:
            backend["SimpleStorage"] = {"total_storage_size": 100_000, "num_data_storage_units": nodes}
        tq.init(OmegaConf.create({"controller": {"polling_mode": True}, "backend": backend}))
        units = unit_nodes(system)
        driver = Probe(units, "driver")
        driver.install()
        prompt, response = (x.tolist() for x in workload.lengths(seed))
        cls = _client_class()
        clients = [
            cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote(
                system, units, (prompt, response)
            )
            for n in ids
        ]
        landed = ray.get([c.node.remote() for c in clients], timeout=START_TIMEOUT_S)
        if landed != ids:
            raise RuntimeError(f"client actors landed on {landed}, wanted {ids}")
        startup_s = time.perf_counter() - t_start
        print(f"  {system} x {nodes} nodes up in {startup_s:.0f} s; stores on nodes {[ids.index(u) for u in units]}",
              file=sys.stderr, flush=True)  # fmt: skip
        rows = []
        for it in range(warmup + iters):
            row = iteration(system, it, ids, units, clients, driver, workload.responses, prompt, response)
            if it >= warmup:
                rows.append({"iteration": it - warmup, **row})
            print(f"  {system} x {nodes} nodes it {it - warmup:+d}: data path {row['data_path_s']:.3f} s, "
                  f"{row['controller_requests']} controller requests, {row['cross_node_bytes']} B across nodes",
                  file=sys.stderr, flush=True)  # fmt: skip
        tq.close()
        out = {"system": system, "nodes": nodes, "startup_s": startup_s, "store_nodes": [ids.index(u) for u in units],
               "poll_s": POLL_S, "iterations": rows, "wall_s": time.perf_counter() - t_start}  # fmt: skip
        if rllib_steps:
            from scaling_measure_rllib import measure

            for c in clients:
                ray.kill(c)
            out["rllib"] = measure(ids, iters, warmup, rllib_steps)
        return out
    finally:
        ray.shutdown()
        cluster.shutdown()


def iteration(system: str, it: int, ids: list[str], units: list[str], clients: list[Any], driver: Probe,
              responses: int, prompt: list[int], response: list[int]) -> dict[str, Any]:  # fmt: skip
    """One measured iteration (see the module docstring); its data-path seconds and counters."""
    import ray
    import transfer_queue as tq

    keys = [f"it{it}-{i}" for i in range(responses)]
    idx = list(range(responses))
    nodes = len(ids)
    phases: dict[str, float] = {}
    t0 = t = time.perf_counter()
    # generation: response i by the agent on node i mod nodes, one put each, all in flight
    puts = [c.rollouts.remote(keys[a::nodes], idx[a::nodes]) for a, c in enumerate(clients)]
    if system == "SimpleStorage":  # verl's replay buffer: kv_list every poll_s until every key is listed
        while True:
            time.sleep(POLL_S)
            listed = tq.kv_list(partition_id=PARTITION).get(PARTITION, {})
            if all(k in listed for k in keys):
                break
    ray.get(puts, timeout=CALL_TIMEOUT_S)
    phases["generate"] = time.perf_counter() - t
    # the samples each node's store owns (global index mod stores): that node's rank reads them
    client = tq.interface._maybe_create_tq_client()
    meta = client._run_coroutine(client.async_kv_retrieve_meta(keys=keys, partition_id=PARTITION))
    owner = [ids.index(units[gi % len(units)]) for gi in meta.global_indexes]
    shards = [[i for i in idx if owner[i] == g] for g in range(nodes)]
    for stage, field in (("old_log_prob", "old_log_probs"), ("ref_log_prob", "ref_log_prob")):
        t = time.perf_counter()
        ray.get([c.logprob.remote([keys[i] for i in s], s, field) for c, s in zip(clients, shards) if s],
                timeout=CALL_TIMEOUT_S)  # fmt: skip
        td = driver_call(driver, "get", keys, (field,))
        if system == "SimpleStorage":
            driver_call(driver, "put", keys, (field,), td)
        phases[stage] = time.perf_counter() - t
    t = time.perf_counter()
    driver_call(driver, "get", keys, ADVANTAGE_READS)
    derived = (
        ("advantages", "returns")
        if system == "SimpleStorage"
        else ("old_log_probs", "ref_log_prob", "advantages", "returns")
    )
    driver_call(driver, "put", keys, derived, fields_of(derived, prompt, response, idx))
    phases["advantage"] = time.perf_counter() - t
    t = time.perf_counter()
    ray.get(
        [c.update.remote([keys[i] for i in s], s) for c, s in zip(clients, shards) if s],
        timeout=CALL_TIMEOUT_S,
    )
    phases["update"] = time.perf_counter() - t
    t = time.perf_counter()
    tq.kv_clear(keys=keys, partition_id=PARTITION)
    phases["clear"] = time.perf_counter() - t
    total = time.perf_counter() - t0
    parts = [driver.take(), *ray.get([c.take.remote() for c in clients], timeout=CALL_TIMEOUT_S)]
    return {"data_path_s": total, "phases_s": phases,
            "controller_requests": sum(p["requests"] for p in parts),
            "controller_request_s": sum(p["request_s"] for p in parts),
            "cross_node_bytes": sum(p["cross_node_bytes"] for p in parts),
            "local_bytes": sum(p["local_bytes"] for p in parts),
            "calls": [c for p in parts for c in p["calls"]]}  # fmt: skip


def driver_call(driver: Probe, op: str, keys: list[str], names: tuple[str, ...], td: Any = None) -> Any:
    """A timed driver call on every key (its own side of the data path, nothing else running)."""
    import transfer_queue as tq

    t0 = time.perf_counter()
    if op == "put":
        tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=td)
        out = td
    else:
        out = tq.kv_batch_get(keys=keys, partition_id=PARTITION, select_fields=list(names))
    driver.timed(f"driver_{op}", out, time.perf_counter() - t0, len(keys))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--workload", required=True, help="a scaling_config.Workload as JSON")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--rllib-steps", type=int, default=0, help="then RLlib DQN, this many env steps an iteration"
    )
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    tok = provenance.start((a.out.parent,))  # this configuration's commit and load; earlier records aside
    out = run(a.system, a.nodes, Workload(**json.loads(a.workload)), a.iters, a.warmup, a.rllib_steps)
    a.out.write_text(json.dumps(out | {"machine": provenance.finish(tok)}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
