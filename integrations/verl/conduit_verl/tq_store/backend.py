"""TransferQueue storage backend ``Conduit``: verl's token-level experience in Conduit's storage.

Select it with ``transfer_queue.backend.storage_backend=Conduit`` (knobs under
``+transfer_queue.backend.Conduit.*``: ``placement.<field>=<tier>``, ``budgets.<tier>=<bytes>``,
``default_tier`` (``auto``: planned, see ``planning.py``), ``timeout_s``, ``direct_put_min_bytes``).
verl's workers, TQ's clients and TQ's controller are unchanged; the controller stays metadata-only.

- ``tq.init`` (verl's task runner) starts one storage actor per alive Ray node (:func:`bootstrap`,
  ``num_cpus=0``, pinned to its node) and writes their names into the config every process reads.
  Each actor answers its store's calls on a data port (``data_port.py``: one ZMQ socket, on loopback
  when the cluster has one node, else on the node's address; a data-only wire, every frame signed
  with the actor's key, which it hands out through Ray; payloads as raw frames; ~0.2 ms a call where
  a Ray actor call costs ~1.3 ms, and no trip through Ray's object stores between nodes); Ray places
  it, keeps it alive and reports its death.
- Every process that uses TQ builds a :class:`ConduitStorageManager`. A put of at least
  ``direct_put_min_bytes`` (1 MiB) to the actor owning the samples (global index mod number of nodes)
  on the writer's own node asks it for a write plan (fresh rows of each field's shared-memory file),
  scatters each field's rows straight into the mapped file (one copy), and commits (metadata only:
  the lengths; the samples become visible then, all fields at once). A plan refused as stale (the
  field grew into a new file meanwhile) is made again. Fields the writer cannot map (objects,
  host/pinned/cuda tiers), smaller puts and puts to an actor on another node travel whole — one
  column per field, not one object per sample — over the data port. Then the put tells the
  controller.
- A get from the actor's node maps the field's shared-memory file and gathers the requested tokens
  straight into its own tensor (memory from a :class:`~conduit.buffer.recycled.HostPool`): one copy,
  no serialisation. From another node the actor gathers the field and sends it whole over the data
  port (per field, never per sample).
- Clear forgets every field of the samples (TQ reuses global indexes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tensordict import TensorDict
from transfer_queue.metadata import BatchMeta
from transfer_queue.storage.managers.base import StorageManager

from conduit.buffer.ragged_kernels import warm_ragged_kernels
from conduit_verl.errors import StorageActorError, StorageBackendError
from conduit_verl.tq_store.columns import (
    Column,
    column_of,
    field_of,
    field_schema,
    from_wire,
    spec_of,
    to_wire,
)
from conduit_verl.tq_store.data_port import METHODS, PortClient, StorePort
from conduit_verl.tq_store.fields import Layout, StaleLayoutError, read_mapped, write_mapped
from conduit_verl.tq_store.put_batcher import PutBatcher
from conduit_verl.tq_store.store import AUTO, NodeStore, check_placement

logger = logging.getLogger(__name__)

NAME = "Conduit"
NAMESPACE = "transfer_queue"
DEFAULT_TIMEOUT_S = 60.0
#: a get or put whose mapped fields hold at least this many bytes (a get counts 8 per token) copies
#: them on threads, one field each
PARALLEL_COPY_MIN_BYTES = 4 << 20
LIVENESS_TIMEOUT_S = 5.0  # a store that does not answer a data-port call is asked this long if it lives
#: a same-node put of fewer payload bytes sends its data through Ray (one round trip) instead of
#: writing in place (two round trips, plan and commit, ~3.5 ms each here): verl's agent loop puts one
#: trajectory at a time
DIRECT_PUT_MIN_BYTES = 1 << 20
PLAN_TRIES = 3  # write plans tried (each refused as stale) before a put sends its data instead


@ray.remote(num_cpus=0)
class StorageActor:
    """A :class:`NodeStore` on one node, answering on its data port and through Ray (one lock)."""

    def __init__(self, **kwargs: Any) -> None:
        warm_ragged_kernels()
        self.store = NodeStore(**kwargs)
        self.node = ray.get_runtime_context().get_node_id()
        self.lock = threading.Lock()
        self.port = StorePort(self.store, self.lock, port_host())

    def node_id(self) -> str:
        return self.node

    def port_address(self) -> tuple[str, bytes]:
        """The data port's address and its key (handed out only through Ray)."""
        return self.port.address, self.port.key

    def put(self, gis: np.ndarray, wires: dict[str, tuple]) -> None:
        with self.lock:
            self.store.put(gis, wires)

    def get(self, gis: np.ndarray, names: list[str]) -> dict[str, tuple]:
        with self.lock:
            return self.store.get(gis, names)

    def write_plan(self, gis: np.ndarray, specs: dict[str, tuple], node: str) -> tuple[int, dict]:
        with self.lock:
            return self.store.write_plan(gis, specs, node == self.node)

    def commit(self, plan_id: int, gis: np.ndarray, lengths: dict, wires: dict[str, tuple]) -> bool:
        with self.lock:
            return self.store.commit(plan_id, gis, lengths, wires)

    def abandon(self, plan_id: int) -> None:
        with self.lock:
            self.store.abandon(plan_id)

    def read_plan(self, gis: np.ndarray, names: list[str], node: str) -> dict[str, tuple]:
        with self.lock:
            return self.store.read_plan(gis, names, node == self.node)

    def clear(self, gis: np.ndarray) -> None:
        with self.lock:
            self.store.clear(gis)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return self.store.stats()

    def close(self) -> None:
        self.port.close()
        with self.lock:
            self.store.close()


def port_host() -> str:
    """Where a storage actor's data port listens: loopback when the Ray cluster has one alive node
    (every reader is on it), else this node's address (readers on other nodes reach it there)."""
    if sum(1 for n in ray.nodes() if n.get("Alive")) <= 1:
        return "127.0.0.1"
    return ray.util.get_node_ip_address()


def _section(conf: Any) -> dict[str, Any]:
    if conf is None:
        return {}
    raw = OmegaConf.to_container(conf, resolve=True) if isinstance(conf, DictConfig) else dict(conf)
    return dict(raw or {})


#: the keys of ``transfer_queue.backend.Conduit`` (``actors`` is written by the bootstrap)
SECTION_KEYS = (
    "placement",
    "budgets",
    "default_tier",
    "directory",
    "timeout_s",
    "direct_put_min_bytes",
    "actors",
)


def check_section(section: dict[str, Any]) -> None:
    """Raise :class:`StorageBackendError` naming an unknown key or a bad value of the backend's config."""
    unknown = sorted(set(section) - set(SECTION_KEYS))
    if unknown:
        raise StorageBackendError(
            f"transfer_queue.backend.{NAME}: unknown key(s) {unknown}; known: {', '.join(SECTION_KEYS)}"
        )
    for key, low in (("timeout_s", 1e-9), ("direct_put_min_bytes", 0)):
        if key not in section:
            continue
        value = section[key]
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= low
        if not ok or (key == "direct_put_min_bytes" and not float(value).is_integer()):
            want = "a number of seconds > 0" if key == "timeout_s" else "a whole number of bytes >= 0"
            raise StorageBackendError(f"transfer_queue.backend.{NAME}.{key}={value!r}: want {want}")


def bootstrap(conf: DictConfig) -> list[Any]:
    """TQ's storage bootstrap for ``Conduit``: one storage actor per alive node (run by ``tq.init``)."""
    section = _section(conf.backend.get(NAME))
    check_section(section)
    placement = dict(section.get("placement") or {})
    check_placement(placement)
    kwargs = {
        "placement": placement,
        "budgets": dict(section.get("budgets") or {}),
        "default_tier": section.get("default_tier", AUTO),
        "directory": section.get("directory"),
    }
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    tag = uuid.uuid4().hex[:8]
    names, actors = [], []
    for i, node in enumerate(nodes):
        name = f"ConduitTQStorage-{tag}-{i}"
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        actors.append(
            StorageActor.options(name=name, namespace=NAMESPACE, scheduling_strategy=strategy).remote(
                **kwargs
            )
        )
        names.append(name)
    ray.get([a.node_id.remote() for a in actors])  # started (a bad placement fails here, by name)
    with open_dict(conf):
        if conf.backend.get(NAME) is None:
            conf.backend[NAME] = {}
        conf.backend[NAME]["actors"] = names
    logger.info("conduit tq store: %d storage actor(s), one per node: %s", len(names), names)
    return actors


class ConduitStorageManager(StorageManager):
    """TransferQueue's storage manager for the ``Conduit`` backend (one per process)."""

    def __init__(self, controller_info: Any, config: Any, zmq_context: Any = None) -> None:
        section = _section(config)
        names = section.get("actors")
        if not names:
            raise StorageBackendError(
                "transfer_queue.backend.Conduit.actors is empty: the Conduit backend's bootstrap did not run. "
                "Install conduit-rl[verl] (it registers the backend through verl's plugin entry point) in "
                "every process, and let tq.init start the storage"
            )
        check_section(section)
        super().__init__(controller_info, config, zmq_context)
        self.names: list[str] = list(names)
        self.timeout_s = float(section.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.direct_min_bytes = int(section.get("direct_put_min_bytes", DIRECT_PUT_MIN_BYTES))
        self._actors: list[Any] | None = None
        self._nodes: list[str] = []
        self._ports: list[PortClient] = []
        self._batchers: dict[int, PutBatcher] = {}
        self.node = ray.get_runtime_context().get_node_id()
        warm_ragged_kernels()  # load the compiled copy kernels now, not in the first get

    # -- routing and calls --------------------------------------------------------------------------

    def _handles(self) -> list[Any]:
        if self._actors is None:
            try:
                actors = [ray.get_actor(n, namespace=NAMESPACE) for n in self.names]
                nodes = ray.get([a.node_id.remote() for a in actors], timeout=self.timeout_s)
                ports = ray.get([a.port_address.remote() for a in actors], timeout=self.timeout_s)
            except Exception as e:  # noqa: BLE001
                raise StorageActorError(f"Conduit storage actors {self.names} are not reachable: {e}") from e
            self._actors, self._nodes = actors, nodes
            self._ports = [PortClient(address, key) for address, key in ports]
        return self._actors

    def _routes(self, gis: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
        n = len(self._handles())
        if n == 1:
            return [(0, None)]
        owner = gis % n
        return [(i, pos) for i in range(n) if (pos := torch.nonzero(owner == i).flatten()).numel()]

    async def _call(self, i: int, method: str, *args: Any) -> Any:
        """``method`` of store ``i``: over its data port (``data_port.METHODS``), else through Ray."""
        actor = self._handles()[i]
        try:
            if method not in METHODS:
                return await asyncio.wait_for(getattr(actor, method).remote(*args), self.timeout_s)
            if method in ("write_plan", "read_plan"):  # the store is told whether the caller shares its node
                args = (*args[:-1], args[-1] == self._nodes[i])
            return await self._ports[i].call(
                method, args, self.timeout_s, lambda: self._alive(i, method, args)
            )
        except StorageBackendError:
            raise
        except TimeoutError as e:
            raise StorageActorError(
                f"Conduit storage actor {self.names[i]} (node {self._nodes[i][:12]}) did not answer "
                f"{method} within {self.timeout_s:g}s"
            ) from e
        except ray.exceptions.RayActorError as e:
            raise self._died(i, method, args, e) from e
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause()
            raise (cause if isinstance(cause, StorageBackendError) else StorageBackendError(str(e))) from e
        except Exception as e:  # noqa: BLE001  (raised by the store, sent back over the port)
            raise StorageBackendError(f"Conduit storage actor {self.names[i]}: {method}: {e}") from e

    async def _alive(self, i: int, method: str, args: tuple) -> None:
        """Raise :class:`StorageActorError` if store ``i``'s actor is dead (a slow answer is no error)."""
        try:
            await asyncio.wait_for(self._handles()[i].node_id.remote(), LIVENESS_TIMEOUT_S)
        except ray.exceptions.RayActorError as e:
            raise self._died(i, method, args, e) from e
        except TimeoutError:
            pass

    def _died(self, i: int, method: str, args: tuple, e: Exception) -> StorageActorError:
        keys = args[0] if args and isinstance(args[0], np.ndarray) else np.empty(0, dtype=np.int64)
        ids = f"; this {method} asked for {len(keys)} of them, global indexes {keys[:16].tolist()}"
        return StorageActorError(
            f"Conduit storage actor {self.names[i]} (node {self._nodes[i][:12]}) died; the samples it "
            f"held are lost{ids if len(keys) else ''}: {e}"
        )

    # -- TransferQueue's interface --------------------------------------------------------------------

    async def put_data(self, data: TensorDict, metadata: BatchMeta, data_parser: Any = None) -> None:
        if data_parser is not None:
            raise NotImplementedError("data_parser is only supported by TransferQueue's SimpleStorage")
        if metadata.size == 0:
            return
        gis = torch.as_tensor(metadata.global_indexes, dtype=torch.int64)
        columns = {f: column_of(f, data.get(f)) for f in data.keys()}
        calls = []
        for i, pos in self._routes(gis):
            part = columns if pos is None else {f: c.select(pos) for f, c in columns.items()}
            calls.append(self._put(i, gis if pos is None else gis[pos], part))
        await asyncio.gather(*calls)
        await self.notify_data_update(
            metadata.partition_ids[0], metadata.global_indexes, field_schema(data, columns)
        )

    async def _put(self, i: int, keys: torch.Tensor, columns: dict[str, Column]) -> None:
        """One store's part of a put: in place through a write plan where the store is on this node."""
        gis = keys.numpy()
        nbytes = sum(c.nbytes for c in columns.values())
        if self._nodes[i] == self.node and nbytes >= self.direct_min_bytes:
            specs = {f: spec_of(c) for f, c in columns.items()}
            for _ in range(PLAN_TRIES):
                plan_id, entries = await self._call(i, "write_plan", gis, specs, self.node)
                if not entries:
                    break
                try:
                    lengths = await _write_planned(entries, columns)
                except StaleLayoutError:  # the field grew into a new file since the plan
                    await self._call(i, "abandon", plan_id)
                    continue
                rest = {f: to_wire(c) for f, c in columns.items() if f not in entries}
                if await self._call(i, "commit", plan_id, gis, lengths, rest):
                    return
        if nbytes < self.direct_min_bytes:  # small: combined with the puts queued meanwhile
            await self._batcher(i).put(gis, columns)
        else:
            await self._send_put(i, gis, columns)

    async def _send_put(self, i: int, gis: np.ndarray, columns: dict[str, Column]) -> None:
        await self._call(i, "put", gis, {f: to_wire(c) for f, c in columns.items()})

    def _batcher(self, i: int) -> PutBatcher:
        batcher = self._batchers.get(i)
        if batcher is None:
            batcher = self._batchers[i] = PutBatcher(lambda gis, cols: self._send_put(i, gis, cols))
        return batcher

    async def get_data(self, metadata: BatchMeta) -> TensorDict:
        if metadata.size == 0:
            return TensorDict({}, batch_size=0)
        gis = torch.as_tensor(metadata.global_indexes, dtype=torch.int64)
        names = list(metadata.field_names)
        routes = self._routes(gis)
        parts = await asyncio.gather(
            *(
                self._read(i, gis if pos is None else gis[pos], names, own=len(routes) == 1)
                for i, pos in routes
            )
        )
        if len(parts) == 1:
            columns = parts[0]
        else:
            positions = [pos for _, pos in routes]
            columns = {f: Column.merge([p[f] for p in parts], positions, len(gis)) for f in names}
        return TensorDict({f: field_of(columns[f]) for f in names}, batch_size=len(gis))

    async def _read(self, i: int, gis: torch.Tensor, names: list[str], own: bool) -> dict[str, Column]:
        """One store's part of a get. ``own``: the columns are returned as they are, so arrays from the
        data port (read-only) are copied; parts that are merged afterwards are read in place. Mapped
        fields are gathered on the reader pool's threads when the get is large (the copies release
        the GIL: two fields copy at once, and the event loop is not blocked meanwhile)."""
        plan = await self._call(i, "read_plan", gis.numpy(), names, self.node)
        out: dict[str, Column] = {}
        mapped: dict[str, tuple] = {}
        for name, entry in plan.items():
            if entry[0] != "mapped":
                out[name] = from_wire(entry, writable=own)
                continue
            _, kind, layout, lengths, rows = entry
            lens = None if lengths is None else torch.from_numpy(np.array(lengths, copy=True))
            mapped[name] = (_layout(layout), torch.from_numpy(np.array(rows, copy=True)), lens, kind)
        nbytes = sum(int(e[2].sum()) * 8 for e in mapped.values() if e[2] is not None)
        if len(mapped) > 1 and nbytes >= PARALLEL_COPY_MIN_BYTES:
            loop = asyncio.get_running_loop()
            results = await asyncio.gather(
                *(loop.run_in_executor(_copy_pool(), _read_field, *e) for e in mapped.values())
            )
        else:
            results = [_read_field(*e) for e in mapped.values()]
        retry = [name for name, col in zip(mapped, results) if col is None]
        out.update({name: col for name, col in zip(mapped, results) if col is not None})
        if retry:  # those fields grew into new files since the plan
            wires = await self._call(i, "get", gis.numpy(), retry)
            out.update({n: from_wire(w, writable=own) for n, w in wires.items()})
        return out

    async def clear_data(self, metadata: BatchMeta) -> None:
        if metadata.size == 0:
            return
        gis = torch.as_tensor(metadata.global_indexes, dtype=torch.int64)
        await asyncio.gather(
            *(
                self._call(i, "clear", (gis if pos is None else gis[pos]).numpy())
                for i, pos in self._routes(gis)
            )
        )

    async def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Refused with a clear error. TransferQueue would take a ``NotImplementedError`` as "this backend
        keeps its data elsewhere", save the controller's metadata alone, and a resume would then find
        rows marked finished with no data behind them."""
        raise StorageBackendError(
            "Conduit's TransferQueue backend does not save its rows in TransferQueue's checkpoint "
            f"({checkpoint_dir}); a resume would find finished samples without data. Under verl's async "
            "trainers with trainer.save_freq > 0 use SimpleStorage, or trainer mode conduit with "
            "+trainer.v1.conduit.max_staleness=k (its checkpoint keeps the rows in Conduit's own format)"
        )

    async def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Refused: this backend never wrote rows into a TransferQueue checkpoint (``save_checkpoint``)."""
        raise StorageBackendError(
            f"Conduit's TransferQueue backend has no rows in TransferQueue's checkpoint {checkpoint_dir}; "
            "it was saved by another backend, or without its storage"
        )

    def close(self) -> None:
        for port in getattr(self, "_ports", []):  # also when __init__ failed early (TQ's __del__)
            port.close()
        super().close()

    def stats(self) -> list[dict[str, Any]]:
        """Each node's counters and field tiers."""
        return ray.get([a.stats.remote() for a in self._handles()], timeout=self.timeout_s)


async def _write_planned(
    entries: dict[str, tuple], columns: dict[str, Column]
) -> dict[str, np.ndarray | None]:
    """Each planned field's rows scattered into the store's mapped file (one copy; large puts one field
    per copy thread); the lengths to commit. Every field's copy has ended before an error is raised
    (a stale plan's rows go back to the store, and no thread may still write into them)."""
    jobs = [
        (name, _layout(layout), torch.from_numpy(np.array(rows, copy=True)))
        for name, (layout, rows) in entries.items()
    ]
    nbytes = sum(columns[name].nbytes for name, _, _ in jobs)
    if len(jobs) > 1 and nbytes >= PARALLEL_COPY_MIN_BYTES:
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(
            *(
                loop.run_in_executor(_copy_pool(), write_mapped, lay, rows, columns[name])
                for name, lay, rows in jobs
            ),
            return_exceptions=True,
        )
    else:
        results = []
        for name, lay, rows in jobs:
            try:
                results.append(write_mapped(lay, rows, columns[name]))
            except Exception as e:  # noqa: BLE001  (raised below, once every field is done)
                results.append(e)
                break
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return {name: None if r is None else r.numpy() for (name, _, _), r in zip(jobs, results)}


def _read_field(layout: Layout, rows: torch.Tensor, lengths: torch.Tensor | None, kind: str) -> Column | None:
    """A mapped field's gather; None if its file was replaced since the plan (the caller asks again)."""
    try:
        return read_mapped(layout, rows, lengths, kind)
    except StaleLayoutError:
        return None


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _copy_pool() -> ThreadPoolExecutor:
    """This process's threads for large mapped reads and writes (two: the cores of the smallest machine
    this targets; the copies release the GIL)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=min(2, os.cpu_count() or 1), thread_name_prefix="conduit-tq-read"
            )
        return _POOL


def _layout(layout: Any) -> Layout:
    return layout if isinstance(layout, Layout) else Layout(*layout)
