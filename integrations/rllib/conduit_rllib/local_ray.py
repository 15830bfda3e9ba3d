"""Start a local Ray whose servers listen on 127.0.0.1 only (what our recipes and benchmarks use).

Ray 2.60 turns ``ray.init(_node_ip_address="127.0.0.1")`` into the machine's routable address, and its
GCS, raylet and workers then listen on all interfaces. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
Ray takes 127.0.0.1 as the node address and binds every server there; this sets it for the processes
Ray starts (they inherit the environment) and for this one (Ray reads it when imported, so the
constant is set too). It also switches off joining a multi-machine Ray cluster: a multi-machine deployment
starts Ray itself (``ray start``) and calls neither; ``start_local_cluster``'s nodes all run on this machine.
"""

from __future__ import annotations

import os
from typing import Any

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _loopback() -> Any:
    """``ray``, set to loopback: the setting for the processes Ray starts, its constant for this one."""
    os.environ[LOOPBACK_ENV] = "0"
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time by Ray's address lookup
    return ray


def init_local_ray(num_cpus: int = 2, **kwargs: Any) -> Any:
    """``ray.init`` of a local, loopback-only Ray (``num_cpus`` slots, no dashboard by default)."""
    kwargs.setdefault("include_dashboard", False)
    return _loopback().init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)


def start_local_cluster(nodes: int, node_args: dict[str, Any], **init_kwargs: Any) -> tuple[Any, list[str]]:
    """``nodes`` loopback-only Ray nodes here (``ray.cluster_utils.Cluster``, each with ``node_args``), this
    process connected to the head (``init_kwargs``); the cluster and its node ids, head first."""
    ray = _loopback()  # also keeps ray.init from turning the head's 127.0.0.1 into the routable address
    from ray.cluster_utils import Cluster

    args = {**node_args, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
    try:
        added = [cluster.add_node(**args) for _ in range(nodes - 1)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", **init_kwargs)
    except BaseException:  # a node or the connection failed: stop what started
        cluster.shutdown()
        raise
    return cluster, [n.node_id for n in [cluster.head_node, *added]]
