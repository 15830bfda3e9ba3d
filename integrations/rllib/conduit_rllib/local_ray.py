"""Start a local Ray whose servers listen on 127.0.0.1 only (what our recipes and benchmarks use).

Ray 2.60 turns ``ray.init(_node_ip_address="127.0.0.1")`` into the machine's routable address, and its
GCS, raylet and workers then listen on all interfaces. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
Ray takes 127.0.0.1 as the node address and binds every server there; this sets it for the processes
Ray starts (they inherit the environment) and for this one (Ray reads it when imported, so the
constant is set too). It also switches off joining a multi-machine Ray cluster: a multi-node
deployment starts Ray itself (``ray start``) and does not call this.
"""

from __future__ import annotations

import os
from typing import Any

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def init_local_ray(num_cpus: int = 2, **kwargs: Any) -> Any:
    """``ray.init`` of a local, loopback-only Ray (``num_cpus`` slots, no dashboard by default)."""
    os.environ[LOOPBACK_ENV] = "0"
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time by Ray's address lookup
    kwargs.setdefault("include_dashboard", False)
    return ray.init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)
