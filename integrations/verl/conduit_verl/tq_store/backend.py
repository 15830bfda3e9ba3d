"""TransferQueue storage backend ``Conduit``: TQ's put/get/clear mapped onto Conduit's keyed store.

Select it with ``transfer_queue.backend.storage_backend=Conduit`` (knobs under
``+transfer_queue.backend.Conduit.*``: ``placement.<field>=<tier>``, ``budgets.<tier>=<bytes>``,
``default_tier`` (``auto``: planned), ``timeout_s``, ``direct_put_min_bytes``). verl's workers, TQ's
clients and its controller (metadata only) are unchanged.

- ``tq.init`` starts one :class:`StorageActor` per alive Ray node (:func:`bootstrap`, ``num_cpus=0``,
  pinned to its node): a :class:`~conduit_verl.tq_store.store.NodeStore` answering on a data port
  (:mod:`conduit.port`; on loopback when the cluster has one node, else on the node's address; its key
  handed out through Ray). Ray places the actor, keeps it alive and reports its death.
- Every process that uses TQ builds a :class:`ConduitStorageManager`: samples go to the actor of their
  global index mod the number of nodes. A put of at least ``direct_put_min_bytes`` to the writer's own
  node is written in place (a write plan, :func:`conduit.buffer.mapped.write_mapped`, a commit; a plan
  refused as stale is made again); other puts travel whole, one column per field, small ones combined
  (:func:`~conduit_verl.tq_store.columns.put_batcher`). A get from the actor's node gathers straight from
  the mapped fields (:func:`conduit.buffer.mapped.read_mapped`), from another node over the port. Clear
  forgets every field of the samples (TQ reuses global indexes).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import uuid
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tensordict import TensorDict
from transfer_queue.metadata import BatchMeta
from transfer_queue.storage.managers.base import StorageManager

from conduit.buffer.mapped import Layout, StaleLayoutError, read_mapped, run_copies, write_mapped
from conduit.buffer.ragged_kernels import warm_ragged_kernels
from conduit.port import Coalescer, DataPort, PortClient
from conduit_verl.errors import StorageActorError, StorageBackendError
from conduit_verl.tq_store.columns import (
    Column,
    column_of,
    field_of,
    field_schema,
    from_wire,
    put_batcher,
    spec_of,
    to_wire,
)
from conduit_verl.tq_store.store import AUTO, PROTOCOL, NodeStore, check_placement

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
        self.port = DataPort(self.store, PROTOCOL, self.lock, port_host())

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
        self._batchers: dict[int, Coalescer] = {}
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
            self._ports = [PortClient(address, key, PROTOCOL) for address, key in ports]
        return self._actors

    def _routes(self, gis: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
        n = len(self._handles())
        if n == 1:
            return [(0, None)]
        owner = gis % n
        return [(i, pos) for i in range(n) if (pos := torch.nonzero(owner == i).flatten()).numel()]

    async def _call(self, i: int, method: str, *args: Any) -> Any:
        """``method`` of store ``i``: over its data port (``store.PROTOCOL``), else through Ray."""
        actor = self._handles()[i]
        try:
            if method not in PROTOCOL.methods:
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

    def _batcher(self, i: int) -> Coalescer:
        batcher = self._batchers.get(i)
        if batcher is None:
            batcher = self._batchers[i] = put_batcher(lambda gis, cols: self._send_put(i, gis, cols))
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
        jobs = [functools.partial(_read_field, *e) for e in mapped.values()]
        results = await run_copies(jobs, nbytes, PARALLEL_COPY_MIN_BYTES)
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
    per copy thread, :func:`conduit.buffer.mapped.run_copies`); the lengths to commit."""
    jobs = {
        name: functools.partial(
            write_mapped, _layout(layout), torch.from_numpy(np.array(rows, copy=True)), columns[name].data
        )
        for name, (layout, rows) in entries.items()
    }
    nbytes = sum(columns[name].nbytes for name in jobs)
    results = await run_copies(list(jobs.values()), nbytes, PARALLEL_COPY_MIN_BYTES)
    return {name: None if r is None else r.numpy() for name, r in zip(jobs, results)}


def _read_field(layout: Layout, rows: torch.Tensor, lengths: torch.Tensor | None, kind: str) -> Column | None:
    """A mapped field's gather; None if its file was replaced since the plan (the caller asks again)."""
    try:
        return Column(kind, read_mapped(layout, rows, lengths))
    except StaleLayoutError:
        return None


def _layout(layout: Any) -> Layout:
    return layout if isinstance(layout, Layout) else Layout(*layout)
