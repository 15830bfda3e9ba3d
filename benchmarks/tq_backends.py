"""TransferQueue storage backends through TQ's own client API: SimpleStorage vs RayStore vs Conduit.

    python benchmarks/tq_backends.py [--quick] [--nodes {1,3}] [--out FILE]

What is timed is what verl calls: ``tq.kv_batch_put`` of a GRPO-shaped batch, then ``tq.kv_batch_get``
of all its fields (then ``tq.kv_clear``, untimed). The batch, per sample: ``input_ids``, ``responses``,
``response_mask`` (int64), ``old_log_probs`` (float32) — jagged nested tensors sharing one length per
sample, drawn uniformly in [L/2, L] for response length L — and ``rm_scores`` (one float32).

TransferQueue allows one ``tq.init`` per process and one controller per Ray cluster, so every system
runs in its own long-lived worker subprocess (this file with ``--worker``) with its own Ray cluster;
the driver sends it one cell at a time over stdin/stdout (JSON lines). Cells are interleaved: for each
cell, round by round, each system in turn (rotating the order), so drift in machine load hits every
system alike; each number reported is the median over the timed rounds (round 0 is a warm-up that
also checks the data read back equals the data written). A plain memcpy of the same bytes is timed
in the driver in the same rounds (per round the fastest of a few back-to-back copies): ``copy_into``,
``copy_`` of each field's flat values into preallocated tensors, is the reference of the memcpy
target; ``copy``, a ``clone`` (fresh memory: fast while glibc reuses freed pages, slow once a field
passes its 32 MiB mmap threshold and every copy faults its pages in), is reported beside it.

- ``--nodes 1`` (same node): the worker process is the TQ client (as verl's driver is); it puts and gets.
- ``--nodes 3`` (cross node): a ``ray.cluster_utils.Cluster`` of 3 nodes on this machine (127.0.0.1);
  puts come from an actor pinned to node A, gets from an actor pinned to node B. All "nodes" share one
  machine, so cross-node traffic is loopback TCP (Ray's object manager, or TQ's ZMQ), not a real NIC.
- Default: both (same node: 3 x 3 cells; cross node: 3 cells). ``--quick``: same node, 2 x 2 cells.

RayStore: TQ's ``RayStorageClient.put`` stores every tensor with ``ray.put(t, _tensor_transport="nixl")``;
where Ray's NIXL transport is unavailable that put raises, and RayStore is dropped from the run with
the error recorded under ``skipped`` (and ``errors``) in the JSON.

SimpleStorage runs at 1, 2 and 4 storage units (``--simple-units``; TQ's default is 2), each unit
count in its own worker, interleaved with the other systems; its rows carry ``storage_units``, and the
ratios and targets compare Conduit with SimpleStorage's best unit count in each cell and op (named in
``simplestorage_units``; ``best_of_units`` marks that row).

Ray logical CPUs: TQ's controller and each SimpleStorage unit reserve ``num_cpus=1``, so ``u`` units
need ``u + 1`` logical CPUs (too few and ``tq.init`` hangs). A same-node cluster gets
``max(3, u + 1)``; a cross-node node gets 2, or 3 where the units round-robin more than one unit onto
a node (logical only; the machine has what it has). Conduit's storage actors reserve none.

Conduit's path bytes (``conduit_path_bytes``): the storage actors' counters per round, summed over the
actors — gets: ``bytes_get_mapped`` (read in place by a same-node reader) and ``bytes_get_copied``
(gathered and shipped over the data port); puts: ``bytes_put_direct`` (scattered by a same-node writer
straight into the store's mapped memory) out of ``bytes_put``. ``mapped_share`` is the measured share
of the payload that took the mapped path. They count bytes per path, not copies: the JSON reports no
copies-per-byte figure (an earlier one multiplied these counters by a table of copies per path).

Writes a JSON (rows, ratios, targets, machine facts) and a PNG of the same stem.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import provenance  # noqa: E402

DEFAULT_OUT = HERE / "results" / "tq_backends.json"

SYSTEMS = ("SimpleStorage", "RayStore", "Conduit")
SAME_FULL = [(b, t) for b in (64, 256, 1024) for t in (512, 4096, 16384)]
SAME_QUICK = [(b, t) for b in (64, 256) for t in (512, 4096)]
CROSS_CELLS = [(256, 4096), (1024, 4096), (256, 16384)]
ROUNDS = {"quick": 5, "full": 7}  # timed rounds per cell, after one warm-up round
PARTITION = "train"
MIB = 2**20
#: the Conduit storage actors' counters each cell records (deltas over the put and the get)
COUNTERS = ("bytes_put", "bytes_put_direct", "bytes_get_mapped", "bytes_get_copied")
TARGET_MIN_FIELD_BYTES = MIB  # the get/put targets apply to cells with >= 1 MiB in every token field
CALL_TIMEOUT_S = 600.0
START_TIMEOUT_S = 240.0

SIMPLE_UNITS = (1, 2, 4)  # SimpleStorage storage units swept (TQ's default: 2)
SIMPLE_TOTAL_SIZE = 100_000

NIXL_NOTE = (
    " (TQ's RayStorageClient.put calls ray.put(tensor, _tensor_transport='nixl') for every tensor;"
    " Ray's NIXL transport needs the nixl package, which is not installed here, so RayStore cannot"
    " store tensors on this machine)"
)

JAGGED_FIELDS = {
    "input_ids": "int64",
    "responses": "int64",
    "response_mask": "int64",
    "old_log_probs": "float32",
}


# -- the batch (shared by the driver, the workers and the cross-node actors) ------------------------


def make_arrays(samples: int, tokens: int, seed: int) -> dict[str, Any]:
    """Flat values per field, shared offsets, and the scalar rewards (deterministic in ``seed``)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(tokens // 2, 1), tokens + 1, (samples,), generator=g)
    offsets = torch.zeros(samples + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    total = int(offsets[-1])
    values = {
        "input_ids": torch.randint(0, 151_936, (total,), generator=g, dtype=torch.int64),
        "responses": torch.randint(0, 151_936, (total,), generator=g, dtype=torch.int64),
        "response_mask": torch.randint(0, 2, (total,), generator=g, dtype=torch.int64),
        "old_log_probs": -5.0 * torch.rand(total, generator=g, dtype=torch.float32),
    }
    return {"offsets": offsets, "values": values, "rm_scores": torch.randn(samples, generator=g)}


def payload_bytes(arrays: dict[str, Any]) -> int:
    return sum(int(v.nbytes) for v in arrays["values"].values()) + int(arrays["rm_scores"].nbytes)


def min_field_bytes(arrays: dict[str, Any]) -> int:
    return min(int(v.nbytes) for v in arrays["values"].values())


def make_batch(arrays: dict[str, Any]) -> Any:
    """The TensorDict verl would put: jagged nested tensors plus one dense scalar field."""
    import torch
    from tensordict import TensorDict

    offsets = arrays["offsets"]
    fields = {
        name: torch.nested.nested_tensor_from_jagged(v, offsets) for name, v in arrays["values"].items()
    }
    fields["rm_scores"] = arrays["rm_scores"]
    return TensorDict(fields, batch_size=[len(offsets) - 1])


def check_batch(out: Any, arrays: dict[str, Any]) -> str | None:
    """None if ``out`` (what kv_batch_get returned) holds exactly ``arrays``; else what differs."""
    import torch

    want = set(arrays["values"]) | {"rm_scores"}
    missing = want - set(out.keys())
    if missing:
        return f"missing fields {sorted(missing)}"
    for name, values in arrays["values"].items():
        got = out[name]
        if getattr(got, "is_nested", False) and got.layout == torch.jagged:
            if not torch.equal(got.offsets().to(torch.int64), arrays["offsets"]):
                return f"{name}: offsets differ"
            if not torch.equal(got.values().reshape(-1), values):
                return f"{name}: values differ"
        else:
            pieces = list(got.unbind()) if isinstance(got, torch.Tensor) else list(got)
            flat = torch.cat([torch.as_tensor(p).reshape(-1) for p in pieces])
            if not torch.equal(flat, values):
                return f"{name}: values differ ({type(got).__name__})"
    rm = out["rm_scores"]
    if getattr(rm, "is_nested", False):
        rm = torch.stack(list(rm.unbind())).reshape(-1)
    if not torch.equal(torch.as_tensor(rm).reshape(-1), arrays["rm_scores"]):
        return "rm_scores differ"
    return None


def cell_seed(samples: int, tokens: int) -> int:
    return samples * 1_000_003 + tokens


# -- worker side ------------------------------------------------------------------------------------


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
    keys = COUNTERS
    return [{"node": n, **{k: int(s.get(k, 0)) for k in keys}} for s, n in zip(stats, nodes)]


def counter_delta(before: list[dict] | None, after: list[dict] | None) -> list[dict] | None:
    if before is None or after is None:
        return None
    keys = COUNTERS
    return [{"node": a["node"], **{k: a[k] - b[k] for k in keys}} for b, a in zip(before, after)]


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


class SameNodeRunner:
    """This process is the TQ client: it puts, gets and clears."""

    def __init__(self, system: str, units: int | None = None) -> None:
        import ray
        import transfer_queue as tq
        from omegaconf import OmegaConf

        register_backend(system)
        ray.init(
            address="local",
            num_cpus=ray_cpus(units, 1),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            object_store_memory=2 * 2**30,
        )
        tq.init(OmegaConf.create(tq_config(system, units)))
        self.tq, self.system = tq, system
        self.cache: tuple[tuple, dict, Any] | None = None
        self.clock = BackendClock()

    def cell(self, msg: dict[str, Any]) -> dict[str, Any]:
        tq = self.tq
        self.clock.install()
        key = (msg["samples"], msg["tokens"], msg["seed"])
        if self.cache is None or self.cache[0] != key:
            self.cache = None
            arrays = make_arrays(*key)
            self.cache = (key, arrays, make_batch(arrays))
        _, arrays, td = self.cache
        keys = [f"{msg['tag']}-{i}" for i in range(msg["samples"])]
        c0 = conduit_counters() if self.system == "Conduit" else None
        b0 = dict(self.clock.total)
        t0 = time.perf_counter()
        tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=td)
        t1 = time.perf_counter()
        b1 = dict(self.clock.total)
        c1 = conduit_counters() if self.system == "Conduit" else None
        t2 = time.perf_counter()
        out = tq.kv_batch_get(keys=keys, partition_id=PARTITION)
        t3 = time.perf_counter()
        c2 = conduit_counters() if self.system == "Conduit" else None
        problem = check_batch(out, arrays) if msg.get("verify") else None
        del out
        tq.kv_clear(keys=keys, partition_id=PARTITION)
        return {
            "put_s": t1 - t0,
            "get_s": t3 - t2,
            "put_backend_s": self.clock.put_s(b0),
            "get_backend_s": self.clock.get_s(b1),
            "bytes": payload_bytes(arrays),
            "verified": bool(msg.get("verify")) and problem is None,
            "mismatch": problem,
            "put_counters": counter_delta(c0, c1),
            "get_counters": counter_delta(c1, c2),
        }

    def close(self) -> None:
        import ray

        try:
            self.tq.close()
        finally:
            ray.shutdown()


def _client_actor_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class TQClient:
        """A TQ client process pinned to one node (it builds its own storage manager, as verl's workers do)."""

        def __init__(self, system: str, threads: int) -> None:
            import torch

            torch.set_num_threads(threads)
            register_backend(system)
            import transfer_queue as tq

            tq.init()  # attaches to the controller the cluster's driver started
            self.tq = tq
            self.cache: tuple[tuple, dict, Any] | None = None
            self.clock = BackendClock()

        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

        def arrays(self, samples: int, tokens: int, seed: int) -> dict[str, Any]:
            key = (samples, tokens, seed)
            if self.cache is None or self.cache[0] != key:
                self.cache = None
                arrays = make_arrays(*key)
                self.cache = (key, arrays, make_batch(arrays))
            return self.cache[1]

        def put(self, samples: int, tokens: int, seed: int, keys: list[str]) -> tuple[float, float, int]:
            arrays = self.arrays(samples, tokens, seed)
            td = self.cache[2]  # type: ignore[index]
            self.clock.install()
            before = dict(self.clock.total)
            t0 = time.perf_counter()
            self.tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=td)
            return time.perf_counter() - t0, self.clock.put_s(before), payload_bytes(arrays)

        def get(self, samples: int, tokens: int, seed: int, keys: list[str], verify: bool) -> tuple:
            arrays = self.arrays(samples, tokens, seed) if verify else None
            self.clock.install()
            before = dict(self.clock.total)
            t0 = time.perf_counter()
            out = self.tq.kv_batch_get(keys=keys, partition_id=PARTITION)
            seconds = time.perf_counter() - t0
            return seconds, self.clock.get_s(before), (check_batch(out, arrays) if verify else None)

    return TQClient


class CrossNodeRunner:
    """A 3-node Ray cluster on this machine: puts from node A, gets from node B, clears from the driver."""

    def __init__(self, system: str, threads: int, units: int | None = None) -> None:
        import ray
        import transfer_queue as tq
        from omegaconf import OmegaConf
        from ray.cluster_utils import Cluster
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        register_backend(system)
        # ray.init(address=...) turns a 127.0.0.1 address into the machine's IP, where nodes bound to
        # 127.0.0.1 do not listen: keep the address as given (this process only)
        services = ray._private.services
        services.resolve_ip_for_localhost = lambda host: host
        node_args = {
            "num_cpus": ray_cpus(units, 3),
            "node_ip_address": "127.0.0.1",
            "object_store_memory": 768 * MIB,
        }
        self.cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
        nodes = [self.cluster.add_node(**node_args) for _ in range(2)]
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, _node_ip_address="127.0.0.1")
        tq.init(OmegaConf.create(tq_config(system, units)))
        self.tq, self.system = tq, system
        client = _client_actor_class()
        ids = [n.node_id for n in nodes]

        def pinned(node_id: str) -> Any:
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            return client.options(scheduling_strategy=strategy).remote(system, threads)

        self.putter, self.getter = pinned(ids[0]), pinned(ids[1])
        got = ray.get([self.putter.node.remote(), self.getter.node.remote()], timeout=START_TIMEOUT_S)
        if got != ids:
            raise RuntimeError(f"client actors landed on {got}, wanted {ids}")
        self.node_a, self.node_b = ids
        self.head = self.cluster.head_node.node_id

    def cell(self, msg: dict[str, Any]) -> dict[str, Any]:
        import ray

        b, t, seed = msg["samples"], msg["tokens"], msg["seed"]
        keys = [f"{msg['tag']}-{i}" for i in range(b)]
        verify = bool(msg.get("verify"))
        c0 = conduit_counters() if self.system == "Conduit" else None
        put_s, put_backend_s, nbytes = ray.get(
            self.putter.put.remote(b, t, seed, keys), timeout=CALL_TIMEOUT_S
        )
        c1 = conduit_counters() if self.system == "Conduit" else None
        get_s, get_backend_s, problem = ray.get(
            self.getter.get.remote(b, t, seed, keys, verify), timeout=CALL_TIMEOUT_S
        )
        c2 = conduit_counters() if self.system == "Conduit" else None
        self.tq.kv_clear(keys=keys, partition_id=PARTITION)
        return {
            "put_s": put_s,
            "get_s": get_s,
            "put_backend_s": put_backend_s,
            "get_backend_s": get_backend_s,
            "bytes": nbytes,
            "verified": verify and problem is None,
            "mismatch": problem,
            "put_counters": counter_delta(c0, c1),
            "get_counters": counter_delta(c1, c2),
            "node_a": self.node_a,
            "node_b": self.node_b,
        }

    def close(self) -> None:
        import ray

        try:
            self.tq.close()
        finally:
            ray.shutdown()
            self.cluster.shutdown()


def worker_main(system: str, nodes: int, threads: int, units: int | None = None) -> None:
    """One system's worker: JSON lines in on stdin, JSON lines out on the original stdout."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # Ray's and TQ's chatter goes to stderr (the worker log), never into the protocol

    def reply(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    def failure(e: BaseException) -> dict[str, Any]:
        return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-6000:]}

    t0 = time.perf_counter()
    try:
        import torch

        torch.set_num_threads(threads)
        runner: Any = SameNodeRunner(system, units) if nodes == 1 else CrossNodeRunner(system, threads, units)
    except BaseException as e:  # noqa: BLE001
        reply({"ready": False, **failure(e)})
        return
    reply({"ready": True, "startup_s": time.perf_counter() - t0, "torch_threads": torch.get_num_threads()})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        try:
            reply(runner.cell(msg))
        except BaseException as e:  # noqa: BLE001
            reply(failure(e))
    try:
        runner.close()
    except BaseException as e:  # noqa: BLE001
        print(f"close failed: {e!r}", file=sys.stderr)
    reply({"closed": True})


# -- driver side ------------------------------------------------------------------------------------


class Worker:
    """A system's worker subprocess, driven one JSON line at a time."""

    def __init__(self, label: str, nodes: int, logdir: Path, threads: int) -> None:
        self.system, self.nodes = label, nodes
        backend, units = parse_label(label)
        self.log_path = logdir / f"{backend}{units or ''}-nodes{nodes}.log"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"tqb{nodes}{backend[:2]}{units or ''}", dir="/tmp"))
        env = dict(os.environ, RAY_TMPDIR=str(self.tmp), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                backend,
                "--nodes",
                str(nodes),
                "--threads",
                str(threads),
                *(["--units", str(units)] if units else []),
            ],  # fmt: skip
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=str(REPO),
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.error: str | None = None
        self.info: dict[str, Any] = {}

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.system} worker did not answer within {timeout:.0f}s") from None
        if line is None:
            raise RuntimeError(f"{self.system} worker exited (rc {self.proc.poll()}); log: {self.log_path}")
        return json.loads(line)

    def start(self, deadline: float) -> None:
        try:
            self.info = self.receive(max(deadline - time.monotonic(), 1.0))
        except (TimeoutError, RuntimeError) as e:
            self.info = {"ready": False, "error": str(e)}
        if not self.info.get("ready"):
            self.error = "startup: " + str(self.info.get("error"))
            self.kill()

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self.receive(CALL_TIMEOUT_S)

    @property
    def alive(self) -> bool:
        return self.error is None and self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=90)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)  # the worker's own session: it and what it started
                    self.proc.wait(timeout=20)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def time_memcpy(values: list[Any], into: list[Any] | None = None, min_total_s: float = 0.02,
                max_reps: int = 20) -> float:  # fmt: skip
    """Fastest of a few back-to-back copies of every field: ``clone`` (fresh memory, as a get returns),
    or ``copy_`` into the preallocated ``into`` (no allocation, no page faults)."""
    best, spent, reps = float("inf"), 0.0, 0
    while reps < 2 or (spent < min_total_s and reps < max_reps):
        t0 = time.perf_counter()
        if into is None:
            out = [v.clone() for v in values]
        else:
            for d, v in zip(into, values):
                d.copy_(v)
        seconds = time.perf_counter() - t0
        if into is None:
            del out
        best, spent, reps = min(best, seconds), spent + seconds, reps + 1
    return best


def conduit_path_bytes(op: str, counters: list[list[dict]] | None) -> dict[str, Any] | None:
    """Bytes per round through each of Conduit's paths for ``op``, from the storage actors' counters
    (summed over the actors, averaged over the rounds), and the share that took the mapped path."""
    if not counters:
        return None
    keys = ("bytes_put", "bytes_put_direct") if op == "put" else ("bytes_get_mapped", "bytes_get_copied")
    per_round = {k: sum(a[k] for run in counters for a in run) / len(counters) for k in keys}
    if op == "put":
        total, mapped = per_round["bytes_put"], per_round["bytes_put_direct"]
    else:
        mapped = per_round["bytes_get_mapped"]
        total = mapped + per_round["bytes_get_copied"]
    return {
        **{k: round(v) for k, v in per_round.items()},
        "storage_actors": len(counters[0]),
        "mapped_share": round(mapped / total, 4) if total else None,
    }


def run_phase(nodes: int, cells: list[tuple[int, int]], systems: list[str], rounds: int, logdir: Path,
              skipped: dict[str, str], errors: list[dict], t_start: float,
              threads: int) -> list[dict]:  # fmt: skip
    """All cells of one phase, interleaved across the systems' workers; returns result rows."""
    systems = [s for s in systems if s not in skipped]
    phase = "same node" if nodes == 1 else f"cross node ({nodes}-node cluster)"
    print(f"\n== {phase}: starting workers for {', '.join(systems)} ...", flush=True)
    workers = {s: Worker(s, nodes, logdir, threads) for s in systems}
    deadline = time.monotonic() + START_TIMEOUT_S  # they start in parallel
    for w in workers.values():
        w.start(deadline)
        if w.error:
            skipped[w.system] = w.error
            print(f"   {w.system}: FAILED to start: {w.error.splitlines()[0][:300]}", flush=True)
        else:
            print(f"   {w.system}: ready in {w.info.get('startup_s', 0):.1f}s", flush=True)
    rows: list[dict] = []
    try:
        for ci, (samples, tokens) in enumerate(cells):
            if not any(w.alive for w in workers.values()):
                print(f"   no system left to measure in the {phase} phase", flush=True)
                break
            seed = cell_seed(samples, tokens)
            arrays = make_arrays(samples, tokens, seed)
            flats = [*arrays["values"].values(), arrays["rm_scores"]]
            into = [v.clone() for v in flats]
            nbytes, per_field = payload_bytes(arrays), min_field_bytes(arrays)
            results: dict[str, list[dict]] = {s: [] for s in systems}
            verified: dict[str, bool] = {}
            memcpy_s: list[float] = []
            copy_into_s: list[float] = []
            for r in range(rounds + 1):
                live = [s for s in systems if workers[s].alive]
                order = live[r % len(live) :] + live[: r % len(live)] if live else []
                for s in order:
                    msg = {"cmd": "cell", "samples": samples, "tokens": tokens, "seed": seed,
                           "tag": f"n{nodes}c{ci}r{r}", "verify": r == 0}  # fmt: skip
                    try:
                        res = workers[s].call(msg)
                    except (TimeoutError, RuntimeError, OSError) as e:
                        res = {"error": str(e)}
                        workers[s].error = str(e)
                    if "error" in res:
                        errors.append({"system": s, "nodes": nodes, "samples": samples, "tokens": tokens,
                                       "round": r, "error": res["error"],
                                       "traceback": res.get("traceback")})  # fmt: skip
                        print(f"   {s} {samples}x{tokens} round {r}: ERROR {res['error'][:300]}", flush=True)
                        if s == "RayStore" or not workers[s].alive:  # RayStore failing: see the docstring
                            workers[s].error = workers[s].error or res["error"]
                            skipped[s] = res["error"] + (NIXL_NOTE if "nixl" in res["error"] else "")
                            workers[s].close()
                        continue
                    if res.get("mismatch"):
                        errors.append({"system": s, "nodes": nodes, "samples": samples, "tokens": tokens,
                                       "round": r, "error": "data read back differs: " + res["mismatch"]})  # fmt: skip
                        print(f"   {s}: DATA MISMATCH: {res['mismatch']}", flush=True)
                    if r == 0:
                        verified[s] = bool(res.get("verified"))
                    else:
                        results[s].append(res)
                if r > 0:
                    memcpy_s.append(time_memcpy(flats))
                    copy_into_s.append(time_memcpy(flats, into))
            del arrays, flats, into
            line: list[str] = []
            med_memcpy = statistics.median(memcpy_s) if memcpy_s else None
            if med_memcpy is not None:
                rows.append(make_row("memcpy", "copy", nodes, samples, tokens, nbytes, per_field, memcpy_s,
                                     None, None, med_memcpy))  # fmt: skip
                rows.append(make_row("memcpy", "copy_into", nodes, samples, tokens, nbytes, per_field,
                                     copy_into_s, None, None, med_memcpy))  # fmt: skip
            for s in systems:
                runs = results[s]
                if not runs:
                    continue
                for op in ("put", "get"):
                    secs = [x[f"{op}_s"] for x in runs]
                    backend = [x[f"{op}_backend_s"] for x in runs]
                    counters = [x[f"{op}_counters"] for x in runs if x.get(f"{op}_counters")]
                    paths = conduit_path_bytes(op, counters) if s == "Conduit" else None
                    backend_name, units = parse_label(s)
                    row = make_row(backend_name, op, nodes, samples, tokens, nbytes, per_field, secs,
                                   med_memcpy, units=units, paths=paths)  # fmt: skip
                    rows.append({**row, **backend_split(secs, backend), "verified": verified.get(s, False)})
                    line.append(f"{s} {op} {nbytes / statistics.median(secs) / 1e9:.2f}")
            print(
                f"[{phase} cell {ci + 1}/{len(cells)}] {samples}x{tokens} ({nbytes / MIB:.1f} MiB) GB/s: "
                + ", ".join(line)
                + (f", memcpy(clone) {nbytes / med_memcpy / 1e9:.2f}" if med_memcpy else "")
                + f"  [t={time.perf_counter() - t_start:.0f}s, load {os.getloadavg()[0]:.2f}]",
                flush=True,
            )
    finally:
        for w in workers.values():
            w.close()
    return rows


def make_row(system: str, op: str, nodes: int, samples: int, tokens: int, nbytes: int, per_field: int,
             secs: list[float], memcpy_s: float | None, units: int | None = None,
             paths: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    med = statistics.median(secs)
    row: dict[str, Any] = {"system": system}
    if system == "SimpleStorage":
        row["storage_units"] = units
    row.update({
        "op": op,
        "nodes": nodes,
        "samples": samples,
        "tokens_per_sample": tokens,
        "bytes": nbytes,
        "seconds": med,
        "gb_per_s": nbytes / med / 1e9,
        "memcpy_equivalents": None if not memcpy_s else round(med / memcpy_s, 2),
        "min_field_bytes": per_field,
        "all_seconds": [round(x, 6) for x in secs],
    })  # fmt: skip
    if system == "Conduit":
        row["conduit_path_bytes"] = paths
    return row


def backend_split(secs: list[float], backend: list[float]) -> dict[str, Any]:
    """Medians of the time inside the backend and of the rest (TransferQueue's client), per round."""
    return {
        "backend_seconds": statistics.median(backend),
        "client_seconds": statistics.median(s - b for s, b in zip(secs, backend)),
    }


# -- analysis, report -------------------------------------------------------------------------------


def find(rows: list[dict], system: str, op: str, nodes: int, b: int, t: int,
         units: int | None = None) -> dict | None:  # fmt: skip
    """The row of ``system`` for one cell and op; for SimpleStorage, the given unit count's row or, by
    default, the best (highest GB/s) over the unit counts swept."""
    found = [
        r
        for r in rows
        if (r["system"], r["op"], r["nodes"], r["samples"], r["tokens_per_sample"])
        == (system, op, nodes, b, t)
        and (units is None or r.get("storage_units") == units)
    ]
    return max(found, key=lambda r: r["gb_per_s"]) if found else None


def mark_best_units(rows: list[dict]) -> None:
    """Set ``best_of_units`` on every SimpleStorage row: whether it is its cell and op's best unit count."""
    for r in rows:
        if r["system"] == "SimpleStorage":
            best = find(rows, "SimpleStorage", r["op"], r["nodes"], r["samples"], r["tokens_per_sample"])
            r["best_of_units"] = best is r


def simple_units(rows: list[dict]) -> list[int]:
    return sorted({r["storage_units"] for r in rows if r["system"] == "SimpleStorage"})


def units_summary(rows: list[dict]) -> list[dict]:
    """Per phase and op, each SimpleStorage unit count's geometric-mean GB/s over the cells and the
    number of cells where it was the best."""
    out = []
    for nodes in sorted({r["nodes"] for r in rows}):
        for op in ("put", "get"):
            for u in simple_units(rows):
                mine = [r for r in rows if (r["system"], r["nodes"], r["op"], r.get("storage_units")) ==
                        ("SimpleStorage", nodes, op, u)]  # fmt: skip
                if mine:
                    geo = statistics.geometric_mean([r["gb_per_s"] for r in mine])
                    best = sum(bool(r.get("best_of_units")) for r in mine)
                    out.append({"nodes": nodes, "op": op, "storage_units": u, "cells": len(mine),
                                "geomean_gb_per_s": round(geo, 4), "best_in_cells": best})  # fmt: skip
    return out


def cells_of(rows: list[dict]) -> list[tuple[int, int, int]]:
    seen: list[tuple[int, int, int]] = []
    for r in rows:
        key = (r["nodes"], r["samples"], r["tokens_per_sample"])
        if key not in seen:
            seen.append(key)
    return seen


def compute_ratios(rows: list[dict]) -> list[dict]:
    out = []
    for nodes, b, t in cells_of(rows):
        memcpy = find(rows, "memcpy", "copy_into", nodes, b, t)
        for op in ("put", "get"):
            c, s = find(rows, "Conduit", op, nodes, b, t), find(rows, "SimpleStorage", op, nodes, b, t)
            if c is None:
                continue
            out.append({
                "nodes": nodes, "samples": b, "tokens_per_sample": t, "op": op,
                "conduit_over_simplestorage": None if s is None else round(c["gb_per_s"] / s["gb_per_s"], 3),
                "simplestorage_units": None if s is None else s["storage_units"],
                "conduit_over_memcpy": None if memcpy is None else round(c["gb_per_s"] / memcpy["gb_per_s"], 3),
            })  # fmt: skip
    return out


def evaluate_targets(rows: list[dict]) -> dict[str, dict]:
    def rule(name: str, text: str, nodes: int, op: str, ref: str, factor: float, big_only: bool) -> dict:
        cells = []
        for n, b, t in cells_of(rows):
            if n != nodes:
                continue
            c = find(rows, "Conduit", op, n, b, t)
            r = find(rows, ref, "copy_into" if ref == "memcpy" else op, n, b, t)
            if c is None or r is None or (big_only and c["min_field_bytes"] < TARGET_MIN_FIELD_BYTES):
                continue
            ratio = c["gb_per_s"] / r["gb_per_s"]
            cell = {"samples": b, "tokens_per_sample": t, "ratio": round(ratio, 3), "pass": ratio >= factor}
            if ref == "SimpleStorage":
                cell["simplestorage_units"] = r["storage_units"]  # its best unit count in this cell
            if c.get("client_seconds"):
                # the ratio a backend taking no time at all would reach, given the TQ client's own time
                cell["bound"] = round(r["seconds"] / c["client_seconds"], 2)
            cells.append(cell)
        return {
            "rule": text,
            "cells": cells,
            "pass": all(x["pass"] for x in cells) if cells else None,
        }

    big = f"cells with >= {TARGET_MIN_FIELD_BYTES // MIB} MiB in every token field"
    return {
        "same_node_get_vs_simplestorage": rule(
            "get5x",
            f"same-node get GB/s >= 5x SimpleStorage, best unit count ({big})",
            1,
            "get",
            "SimpleStorage",
            5.0,
            True,
        ),
        "same_node_get_vs_memcpy": rule(
            "get50",
            f"same-node get GB/s >= 50% of memcpy into preallocated memory ({big})",
            1,
            "get",
            "memcpy",
            0.5,
            True,
        ),
        "same_node_put_vs_simplestorage": rule(
            "put3x",
            f"same-node put GB/s >= 3x SimpleStorage, best unit count ({big})",
            1,
            "put",
            "SimpleStorage",
            3.0,
            True,
        ),
        "same_node_put_vs_simplestorage_all_cells": rule(
            "put3x_all",
            "same-node put GB/s >= 3x SimpleStorage, best unit count (every cell; informational)",
            1,
            "put",
            "SimpleStorage",
            3.0,
            False,
        ),
        "cross_node_put_vs_simplestorage": rule(
            "xput",
            "cross-node put GB/s >= SimpleStorage, best unit count (every cell)",
            3,
            "put",
            "SimpleStorage",
            1.0,
            False,
        ),
        "cross_node_get_vs_simplestorage": rule(
            "xget",
            "cross-node get GB/s >= SimpleStorage, best unit count (every cell)",
            3,
            "get",
            "SimpleStorage",
            1.0,
            False,
        ),
    }


def columns_of(rows: list[dict], systems: list[str]) -> list[tuple[str, str, int | None]]:
    """(heading, system, units) per column: SimpleStorage once per unit count swept."""
    cols: list[tuple[str, str, int | None]] = []
    for s in systems:
        if s == "SimpleStorage":
            cols += [(f"Simple u={u}", s, u) for u in simple_units(rows)]
        elif any(r["system"] == s for r in rows):
            cols.append((s, s, None))
    return cols


def format_table(rows: list[dict], systems: list[str]) -> str:
    cols = columns_of(rows, systems)
    head = ["nodes", "samples x tokens", "MiB", "op", *[f"{h} GB/s" for h, _, _ in cols], "clone GB/s",
            "copy_ GB/s", "Conduit/Simple(best u)", "Conduit/copy_", "Conduit mapped %",
            "Conduit TQ-client ms"]  # fmt: skip
    lines = []
    for nodes, b, t in cells_of(rows):
        memcpy = find(rows, "memcpy", "copy", nodes, b, t)
        into = find(rows, "memcpy", "copy_into", nodes, b, t)
        for op in ("put", "get"):
            got = [find(rows, s, op, nodes, b, t, u) for _, s, u in cols]
            if not any(got):
                continue
            anyrow = next(r for r in got if r)
            c, s = find(rows, "Conduit", op, nodes, b, t), find(rows, "SimpleStorage", op, nodes, b, t)
            share = (c.get("conduit_path_bytes") or {}).get("mapped_share") if c else None
            lines.append([
                str(nodes), f"{b} x {t}", f"{anyrow['bytes'] / MIB:.1f}", op,
                *[f"{x['gb_per_s']:.3f}" if x else "-" for x in got],
                f"{memcpy['gb_per_s']:.2f}" if memcpy else "-",
                f"{into['gb_per_s']:.2f}" if into else "-",
                f"{c['gb_per_s'] / s['gb_per_s']:.2f}x (u={s['storage_units']})" if c and s else "-",
                f"{c['gb_per_s'] / into['gb_per_s']:.0%}" if c and into else "-",
                f"{share:.0%}" if share is not None else "-",
                f"{c['client_seconds'] * 1e3:.1f}" if c and c.get("client_seconds") is not None else "-",
            ])  # fmt: skip
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*head), fmt.format(*["-" * w for w in widths]), *(fmt.format(*x) for x in lines)]
    )


def format_targets(targets: dict[str, dict]) -> str:
    out = []
    for t in targets.values():
        verdict = "n/a (no cells)" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        cells = ", ".join(
            f"{c['samples']}x{c['tokens_per_sample']}: {c['ratio']:.2f}"
            + (f" (u={c['simplestorage_units']})" if "simplestorage_units" in c else "")
            + (f" (bound {c['bound']:.2f})" if "bound" in c else "")
            for c in t["cells"]
        )
        out.append(f"  [{verdict}] {t['rule']}" + (f"\n         ratios: {cells}" if cells else ""))
    return "\n".join(out)


def plot(rows: list[dict], systems: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = sorted({r["nodes"] for r in rows})
    fig, axes = plt.subplots(len(phases), 2, figsize=(14, 4.8 * len(phases)), squeeze=False)
    colors = {"RayStore": "tab:orange", "Conduit": "tab:green"}
    blues = {1: "lightsteelblue", 2: "tab:blue", 4: "navy"}
    for pi, nodes in enumerate(phases):
        cells = [(b, t) for n, b, t in cells_of(rows) if n == nodes]
        here = [r for r in rows if r["nodes"] == nodes]
        names = columns_of(here, systems)
        for oi, op in enumerate(("put", "get")):
            ax = axes[pi][oi]
            width = 0.8 / max(len(names), 1)
            for si, (label, s, u) in enumerate(names):
                ys = [(find(rows, s, op, nodes, b, t, u) or {}).get("gb_per_s", 0.0) for b, t in cells]
                xs = [i - 0.4 + width * (si + 0.5) for i in range(len(cells))]
                ax.bar(xs, ys, width, label=label, color=blues.get(u or 0) if u else colors.get(s))
            mc = [(find(rows, "memcpy", "copy", nodes, b, t) or {}).get("gb_per_s") for b, t in cells]
            if any(mc):
                ax.scatter(range(len(cells)), mc, marker="_", s=900, color="black", label="memcpy (clone)",
                           zorder=3)  # fmt: skip
            mi = [(find(rows, "memcpy", "copy_into", nodes, b, t) or {}).get("gb_per_s") for b, t in cells]
            if any(mi):
                ax.scatter(range(len(cells)), mi, marker="_", s=900, color="gray", linestyle="--",
                           label="memcpy (copy_ into preallocated)", zorder=3)  # fmt: skip
            ax.set_xticks(range(len(cells)), [f"{b}x{t}" for b, t in cells], rotation=30)
            ax.set_yscale("log")
            ax.set_ylabel("GB/s (payload / median seconds)")
            where = "same node" if nodes == 1 else f"cross node ({nodes}-node cluster, one machine)"
            ax.set_title(f"{op}: tq.kv_batch_{op} — {where}")
            ax.set_xlabel("samples x response tokens (lengths uniform in [L/2, L])")
            ax.grid(axis="y", alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_title(result: dict[str, Any]) -> str:
    m = result["machine"]
    title = (
        f"TransferQueue backends via tq.kv_batch_put/get ({result['mode']}, {m['cpu_count']} cores, "
        f"{result['setup']['torch_threads']} torch thread(s), load {m['load_average_start'][0]:.1f}"
        f"->{m['load_average_end'][0]:.1f})"
    )
    for name, why in result["skipped"].items():
        title += f"\n{name} not shown: {why.splitlines()[0].split(' (')[0][:100]} (see 'skipped' in the JSON)"
    return title


def machine_facts() -> dict[str, Any]:
    from importlib import metadata

    import torch

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    digest = hashlib.sha256()
    store = REPO / "integrations" / "verl" / "conduit_verl" / "tq_store"
    for f in sorted(store.glob("*.py")):
        digest.update(f.name.encode() + f.read_bytes())
    model = "unknown"
    try:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
            model,
        )
    except OSError:
        pass
    return {
        "tq_store_sha256": digest.hexdigest()[:16],
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads_driver": torch.get_num_threads(),
        "ray": version("ray"),
        "transfer_queue": version("TransferQueue"),
        "tensordict": version("tensordict"),
        "hostname": platform.node(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="same node only, 2 x 2 cells, 5 rounds (~3 min)")
    ap.add_argument("--nodes", type=int, choices=(1, 3), default=None,
                    help="only the same-node (1) or the cross-node (3) phase (default: both; --quick: 1)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"result JSON (default {DEFAULT_OUT})")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of systems")
    ap.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per cell (default 5 quick, 7 full)"
    )
    ap.add_argument("--samples", default=None, help="comma list overriding the samples axis (every phase)")
    ap.add_argument("--tokens", default=None, help="comma list overriding the tokens axis (every phase)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads in the driver, the workers and the client actors (default 1: on a "
                    "small shared machine intra-op threads stall on each other)")  # fmt: skip
    ap.add_argument("--simple-units", default=",".join(str(u) for u in SIMPLE_UNITS),
                    help="SimpleStorage storage unit counts to sweep (default 1,2,4; TQ's default is 2)")  # fmt: skip
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--units", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.nodes or 1, args.threads, args.units)
        return 0
    import torch

    prov = provenance.start()
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_start = prov.load_average_start
    mode = "quick" if args.quick else "full"
    systems = [s for s in args.systems.split(",") if s]
    bad = set(systems) - set(SYSTEMS)
    if bad:
        raise SystemExit(f"unknown systems {sorted(bad)}; choose from {SYSTEMS}")
    units = [int(u) for u in args.simple_units.split(",") if u]
    labels = [
        lab for s in systems for lab in ([worker_label(s, u) for u in units] if s == "SimpleStorage" else [s])
    ]
    phases = [args.nodes] if args.nodes else ([1] if args.quick else [1, 3])
    same = SAME_QUICK if args.quick else SAME_FULL
    cross = CROSS_CELLS
    if args.samples or args.tokens:  # override the cells of every phase
        bs = [int(x) for x in args.samples.split(",")] if args.samples else sorted({b for b, _ in same})
        ts = [int(x) for x in args.tokens.split(",")] if args.tokens else sorted({t for _, t in same})
        same = cross = [(b, t) for b in bs for t in ts]
    rounds = args.rounds or ROUNDS[mode]
    logdir = Path(tempfile.mkdtemp(prefix="tq_backends-logs-"))
    print(f"tq_backends ({mode}): systems {labels}, phases {phases}, {rounds} timed rounds + 1 warm-up "
          f"per cell; load {load_start}; worker logs in {logdir}", flush=True)  # fmt: skip
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    errors: list[dict] = []
    for nodes in phases:
        cells = same if nodes == 1 else cross
        phase_systems = labels
        if nodes == 3 and "RayStore" in skipped:  # it failed on the same node: the same call fails here
            print(f"\n(RayStore skipped for the cross-node phase: {skipped['RayStore'][:200]})", flush=True)
        rows += run_phase(nodes, cells, phase_systems, rounds, logdir, skipped, errors, t_start, args.threads)
    wall = time.perf_counter() - t_start
    mark_best_units(rows)
    ratios, targets = compute_ratios(rows), evaluate_targets(rows)
    facts = provenance.finish(prov)  # git_commit, git_dirty, load_average_start/_end, created_utc
    created = facts.pop("created_utc")
    facts.update(machine_facts())
    result = {
        "benchmark": "tq_backends",
        "mode": mode,
        "created": created,
        "wall_seconds": round(wall, 1),
        "machine": facts,
        "setup": {
            "api": "transfer_queue kv_batch_put / kv_batch_get (timed), kv_clear (untimed)",
            "fields": {**JAGGED_FIELDS, "rm_scores": "float32 scalar per sample"},
            "lengths": "per sample uniform in [L/2, L], shared by all token fields",
            "rounds": rounds,
            "warmup_rounds": 1,
            "statistic": "median over timed rounds, systems interleaved per round (rotating order)",
            "backend_seconds": "time inside the TQ storage manager's put_data / get_data, less the controller "
            "notification TQ's base class sends from put_data; client_seconds: the rest of the call "
            "(TransferQueue's client and controller, the same for every backend); a target cell's 'bound' is "
            "the reference's seconds (SimpleStorage or memcpy) / Conduit's client_seconds: the ratio a backend "
            "taking no time would reach",
            "ray": "same node: ray.init(address='local', num_cpus=3, 127.0.0.1, no dashboard); cross node: "
            "ray.cluster_utils.Cluster, 3 nodes x num_cpus=2 on 127.0.0.1 (logical CPUs; see docstring)",
            "simplestorage": {
                "total_storage_size": SIMPLE_TOTAL_SIZE,
                "num_data_storage_units": units,
                "compared": "per cell and op, the unit count with the highest GB/s "
                "(rows: storage_units, best_of_units; ratios and targets: simplestorage_units)",
            },
            "ray_cpus": "same node: max(3, units + 1) logical CPUs; cross node: 2 per node (3 where the "
            "SimpleStorage units put two on one node)",
            "conduit_path_bytes": "per Conduit row, bytes per round through each path from the storage actors' "
            "counters (put: bytes_put, bytes_put_direct; get: bytes_get_mapped, bytes_get_copied) and "
            "mapped_share = bytes on the mapped path / payload bytes; measured bytes per path, not copies",
            "torch_threads": args.threads,
            "memcpy": "op 'copy_into': copy_ of every field's flat values into preallocated tensors (the reference "
            "of the memcpy target); op 'copy': torch clone (fresh memory). In the driver, per round the fastest of "
            ">= 2 back-to-back copies (>= 20 ms in all, at most 20), then the median over rounds",
        },
        "skipped": skipped,
        "errors": errors,
        "rows": rows,
        "ratios": ratios,
        "simplestorage_units": units_summary(rows),
        "targets": targets,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    png = args.out.with_suffix(".png")
    all_names = [*systems]
    if rows:
        plot(rows, all_names, png, figure_title(result))
    print("\n" + format_table(rows, all_names))
    for s, why in skipped.items():
        print(f"\n{s}: SKIPPED — {why.splitlines()[0][:400]}")
    if errors:
        print(f"\n{len(errors)} error(s) recorded in the JSON")
    print("\nTargets:\n" + format_targets(targets))
    print(
        f"\nwrote {args.out} and {png}  ({wall:.0f}s wall; load {load_start} -> {facts['load_average_end']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
