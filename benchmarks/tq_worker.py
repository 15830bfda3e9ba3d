"""The worker side of ``tq_backends.py`` (``--worker SYSTEM``; its docstring says why and how): one system's
Ray cluster and TransferQueue client(s), one cell per request over ``peers/child.py``'s JSON lines."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from child import failure, protocol_reply, serve
from tq_batch import check_batch, make_arrays, make_batch, payload_bytes

PARTITION = "train"
MIB = 2**20
#: the Conduit storage actors' counters each cell records (deltas over the put and the get)
COUNTERS = ("bytes_put", "bytes_put_direct", "bytes_get_mapped", "bytes_get_copied")
CALL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 240.0
SIMPLE_TOTAL_SIZE = 100_000


def worker_label(system: str, units: int | None) -> str:
    """The name of one worker: a system, or SimpleStorage at one unit count (``SimpleStorage@2``)."""
    return f"{system}@{units}" if units else system


def parse_label(label: str) -> tuple[str, int | None]:
    """Inverse of :func:`worker_label`."""
    system, _, units = label.partition("@")
    return system, int(units) if units else None


def tq_config(system: str, units: int | None = None) -> dict[str, Any]:
    backend: dict[str, Any] = {"storage_backend": system}
    if system == "SimpleStorage":
        backend["SimpleStorage"] = {
            "total_storage_size": SIMPLE_TOTAL_SIZE,
            "num_data_storage_units": units or 2,
        }
    else:
        backend[system] = {}
    return {"controller": {"polling_mode": True}, "backend": backend}


def ray_cpus(units: int | None, nodes: int) -> int:
    """Logical CPUs per Ray node: TQ's controller and every SimpleStorage unit reserve one."""
    need = (units or 0) + 1
    if nodes == 1:
        return max(3, need)
    return 2 if -(-(units or 0) // nodes) <= 1 else 3  # units round-robin over the nodes


def register_backend(system: str) -> None:
    if system == "Conduit":
        import conduit_verl.tq_store as store

        store.register()


def conduit_counters() -> list[dict[str, Any]] | None:
    """Each Conduit storage actor's counters, with its node (through this process's TQ manager)."""
    import transfer_queue.interface as tqi

    manager = getattr(tqi._TQ_CLIENT, "storage_manager", None)
    if manager is None or not hasattr(manager, "stats"):
        return None
    stats = manager.stats()
    nodes = list(getattr(manager, "_nodes", []) or [None] * len(stats))
    return [{"node": n, **{k: int(s.get(k, 0)) for k in COUNTERS}} for s, n in zip(stats, nodes)]


def counter_delta(before: list[dict] | None, after: list[dict] | None) -> list[dict] | None:
    if before is None or after is None:
        return None
    return [{"node": a["node"], **{k: a[k] - b[k] for k in COUNTERS}} for b, a in zip(before, after)]


class BackendClock:
    """Seconds this process's TQ storage manager spends in ``put_data`` / ``get_data``, less the
    controller notification TQ's base class sends from inside ``put_data`` (the same protocol for every
    backend): the part of a put or get a backend can change. The rest of a call (metadata round trips
    to the controller, the client's own schema extraction) is TransferQueue's client, the same for all
    systems: it bounds the ratio any backend can reach against another."""

    def __init__(self) -> None:
        self.total = {"put": 0.0, "get": 0.0, "notify": 0.0}
        self.manager: Any = None

    def install(self) -> None:
        import transfer_queue.interface as tqi

        manager = tqi._maybe_create_tq_client().storage_manager
        if manager is self.manager:
            return
        self.manager = manager
        for method, key in (("put_data", "put"), ("get_data", "get"), ("notify_data_update", "notify")):
            setattr(manager, method, self._timed(getattr(manager, method), key))

    def _timed(self, fn: Any, key: str) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self.total[key] += time.perf_counter() - t0

        return timed

    def put_s(self, before: dict[str, float]) -> float:
        return (self.total["put"] - before["put"]) - (self.total["notify"] - before["notify"])

    def get_s(self, before: dict[str, float]) -> float:
        return self.total["get"] - before["get"]


class Client:
    """A TQ client's timed put and get of one cell's batch (built once per cell, then reused)."""

    def __init__(self, tq: Any) -> None:
        self.tq, self.clock = tq, BackendClock()
        self.cache: tuple[tuple, dict, Any] | None = None

    def batch(self, samples: int, tokens: int, seed: int) -> tuple[dict[str, Any], Any]:
        key = (samples, tokens, seed)
        if self.cache is None or self.cache[0] != key:
            self.cache = None
            arrays = make_arrays(*key)
            self.cache = (key, arrays, make_batch(arrays))
        return self.cache[1], self.cache[2]

    def put(self, samples: int, tokens: int, seed: int, keys: list[str]) -> tuple[float, float, int]:
        """(seconds, seconds inside the backend, payload bytes) of one ``kv_batch_put``."""
        arrays, td = self.batch(samples, tokens, seed)
        self.clock.install()
        before = dict(self.clock.total)
        t0 = time.perf_counter()
        self.tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=td)
        return time.perf_counter() - t0, self.clock.put_s(before), payload_bytes(arrays)

    def get(self, samples: int, tokens: int, seed: int, keys: list[str], verify: bool) -> tuple:
        """(seconds, seconds inside the backend, what differs or None) of one ``kv_batch_get``."""
        arrays = self.batch(samples, tokens, seed)[0] if verify else None
        self.clock.install()
        before = dict(self.clock.total)
        t0 = time.perf_counter()
        out = self.tq.kv_batch_get(keys=keys, partition_id=PARTITION)
        seconds = time.perf_counter() - t0
        return seconds, self.clock.get_s(before), (check_batch(out, arrays) if verify else None)


class Runner:
    """One cell: put, get (through ``self.put`` / ``self.get``), then clear; Conduit's counters around each."""

    put: Callable[..., tuple]
    get: Callable[..., tuple]
    extra: dict[str, Any] = {}

    def __init__(self, system: str, units: int | None) -> None:
        import transfer_queue as tq
        from omegaconf import OmegaConf

        tq.init(OmegaConf.create(tq_config(system, units)))
        self.tq, self.system = tq, system

    def cell(self, msg: dict[str, Any]) -> dict[str, Any]:
        b, t, seed, verify = msg["samples"], msg["tokens"], msg["seed"], bool(msg.get("verify"))
        keys = [f"{msg['tag']}-{i}" for i in range(b)]
        counted = self.system == "Conduit"
        c0 = conduit_counters() if counted else None
        put_s, put_backend_s, nbytes = self.put(b, t, seed, keys)
        c1 = conduit_counters() if counted else None
        get_s, get_backend_s, problem = self.get(b, t, seed, keys, verify)
        c2 = conduit_counters() if counted else None
        self.tq.kv_clear(keys=keys, partition_id=PARTITION)
        return {"put_s": put_s, "get_s": get_s, "put_backend_s": put_backend_s, "get_backend_s": get_backend_s,
                "bytes": nbytes, "verified": verify and problem is None, "mismatch": problem,
                "put_counters": counter_delta(c0, c1), "get_counters": counter_delta(c1, c2),
                **self.extra}  # fmt: skip

    def close(self) -> None:
        import ray

        try:
            self.tq.close()
        finally:
            ray.shutdown()


class SameNodeRunner(Runner):
    """This process is the TQ client: it puts, gets and clears."""

    def __init__(self, system: str, units: int | None = None) -> None:
        from conduit_rllib.local_ray import init_local_ray

        register_backend(system)
        init_local_ray(ray_cpus(units, 1), address="local", object_store_memory=2 * 2**30)
        super().__init__(system, units)
        client = Client(self.tq)
        self.put, self.get = client.put, client.get


def _client_actor_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class TQClient(Client):
        """A TQ client process pinned to one node (it builds its own storage manager, as verl's workers do)."""

        def __init__(self, system: str, threads: int) -> None:
            import torch

            torch.set_num_threads(threads)
            register_backend(system)
            import transfer_queue as tq

            tq.init()  # attaches to the controller the cluster's driver started
            super().__init__(tq)

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

    return TQClient


class CrossNodeRunner(Runner):
    """A 3-node Ray cluster on this machine: puts from node A, gets from node B, clears from the driver."""

    def __init__(self, system: str, threads: int, units: int | None = None) -> None:
        import ray
        from conduit_rllib.local_ray import start_local_cluster
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        register_backend(system)
        node_args = {"num_cpus": ray_cpus(units, 3), "object_store_memory": 768 * MIB}
        self.cluster, (_, *ids) = start_local_cluster(3, node_args)  # ids: A and B, added to the head
        super().__init__(system, units)
        client = _client_actor_class()

        def pinned(node_id: str) -> Any:
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            return client.options(scheduling_strategy=strategy).remote(system, threads)

        putter, getter = pinned(ids[0]), pinned(ids[1])
        got = ray.get([putter.node.remote(), getter.node.remote()], timeout=START_TIMEOUT_S)
        if got != ids:
            raise RuntimeError(f"client actors landed on {got}, wanted {ids}")
        self.put = lambda *a: ray.get(putter.put.remote(*a), timeout=CALL_TIMEOUT_S)
        self.get = lambda *a: ray.get(getter.get.remote(*a), timeout=CALL_TIMEOUT_S)
        self.extra = {"node_a": ids[0], "node_b": ids[1]}

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.cluster.shutdown()


def worker_main(system: str, nodes: int, threads: int, units: int | None = None) -> None:
    """One system's worker: a cell per request (``peers/child.py``), until the driver says exit."""
    reply = protocol_reply()  # Ray's and TQ's chatter goes to the worker log, never into the protocol
    t0 = time.perf_counter()
    try:
        import torch

        torch.set_num_threads(threads)
        runner: Runner = (
            SameNodeRunner(system, units) if nodes == 1 else CrossNodeRunner(system, threads, units)
        )
    except BaseException as e:  # noqa: BLE001
        reply({"ready": False, **failure(e)})
        return
    reply({"ready": True, "startup_s": time.perf_counter() - t0, "torch_threads": torch.get_num_threads()})
    serve(reply, runner.cell)
    try:
        runner.close()
    except BaseException as e:  # noqa: BLE001
        print(f"close failed: {e!r}", file=sys.stderr)
    reply({"closed": True})
