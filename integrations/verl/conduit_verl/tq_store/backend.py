"""TransferQueue storage backend ``Conduit``: TQ's put/get/clear mapped onto Conduit's keyed store.

Select it with ``transfer_queue.backend.storage_backend=Conduit`` (knobs under
``+transfer_queue.backend.Conduit.*``: ``placement.<field>=<tier>``, ``budgets.<tier>=<bytes>``,
``default_tier`` (``auto``: planned), ``timeout_s``, ``direct_put_min_bytes``). verl's workers, TQ's
clients and its controller (metadata only) are unchanged.

- ``tq.init`` starts one :class:`StorageActor` per alive Ray node (:func:`bootstrap`, ``num_cpus=0``,
  pinned to its node): a :class:`~conduit_verl.tq_store.store.NodeStore` answering on a data port
  (:mod:`conduit.port`; on loopback when the cluster has one node, else on the node's address; its key
  handed out through Ray). Ray places the actor, keeps it alive and reports its death.
- Every process that uses TQ builds a :class:`ConduitStorageManager`: TQ's put/get/clear of a batch are
  the core's :class:`~conduit.buffer.keyed_client.KeyedClient` calls (samples go to the actor of their
  global index mod the number of nodes; a put of at least ``direct_put_min_bytes`` to the writer's own
  node is written in place, a get from the actor's node gathers straight from the mapped fields), made
  over the actors' data ports. Clear forgets every field of the samples (TQ reuses global indexes).
"""

from __future__ import annotations

import asyncio
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

from conduit.buffer.keyed_client import DIRECT_PUT_MIN_BYTES, KeyedClient
from conduit.buffer.keyed_service import raised_as
from conduit.buffer.ragged_kernels import warm_ragged_kernels
from conduit.port import DataPort, PortClient
from conduit_verl.errors import StorageActorError, StorageBackendError
from conduit_verl.tq_store.columns import column_of, field_of, field_schema
from conduit_verl.tq_store.store import AUTO, PROTOCOL, NodeStore, check_placement

logger = logging.getLogger(__name__)

NAME = "Conduit"
NAMESPACE = "transfer_queue"
DEFAULT_TIMEOUT_S = 60.0
LIVENESS_TIMEOUT_S = 5.0  # a store that does not answer a data-port call is asked this long if it lives


@ray.remote(num_cpus=0)
class StorageActor:
    """A :class:`NodeStore` on one node, answering on its data port (and :meth:`call` through Ray; one lock)."""

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

    def call(self, method: str, *args: Any) -> Any:
        """One of the store's data-port calls (:data:`~conduit_verl.tq_store.store.PROTOCOL`) through Ray."""
        if method not in PROTOCOL.methods:
            raise StorageBackendError(f"a Conduit storage actor does not answer {method!r}")
        with self.lock:
            return getattr(self.store, method)(*args)

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
        self._client: KeyedClient | None = None
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

    def client(self) -> KeyedClient:
        """The core's client of the storage actors (routing, writes in place, mapped reads)."""
        if self._client is None:
            self._handles()
            self._client = KeyedClient(self._call, self._nodes, self.node, self.direct_min_bytes)
        return self._client

    async def _call(self, i: int, method: str, *args: Any) -> Any:
        """``method`` of store ``i``, over its data port (:data:`~conduit_verl.tq_store.store.PROTOCOL`)."""
        self._handles()
        try:
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
        columns = {f: column_of(f, data.get(f)) for f in data.keys()}
        with raised_as(StorageBackendError):
            await self.client().put(torch.as_tensor(metadata.global_indexes, dtype=torch.int64), columns)
        await self.notify_data_update(
            metadata.partition_ids[0], metadata.global_indexes, field_schema(data, columns)
        )

    async def get_data(self, metadata: BatchMeta) -> TensorDict:
        if metadata.size == 0:
            return TensorDict({}, batch_size=0)
        gis, names = torch.as_tensor(metadata.global_indexes, dtype=torch.int64), list(metadata.field_names)
        with raised_as(StorageBackendError):
            columns = await self.client().get(gis, names)
        return TensorDict({f: field_of(columns[f]) for f in names}, batch_size=len(gis))

    async def clear_data(self, metadata: BatchMeta) -> None:
        if metadata.size != 0:
            await self.client().clear(torch.as_tensor(metadata.global_indexes, dtype=torch.int64))

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
