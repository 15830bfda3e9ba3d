"""One local Ray for the whole test session.

Starting Ray costs 5-15 s on a 2-core machine; a start per module was a large part of the suite's time.
Modules ask for ``ray_shared`` (module scope: started on first use, stopped when the session ends); a
test that needs Ray to itself (its own multi-node cluster) asks for ``no_shared_ray``, which stops it,
and the next ``ray_shared`` starts it again. Modules leave nothing running behind them (stop their
algorithms, close TransferQueue with ``tq_session``), so the next module finds Ray as at its start.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

RAY_ARGS = {
    "num_cpus": 2,
    "include_dashboard": False,
    "_node_ip_address": "127.0.0.1",
    "log_to_driver": False,
    "namespace": "conduit_tests",
}


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[None]:
    yield
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_shared(_ray_session: None) -> Iterator[None]:
    """The session's local Ray (2 CPUs, loopback), started if it is not running."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(**RAY_ARGS)
    yield


@pytest.fixture
def no_shared_ray() -> None:
    """No Ray in this process: the shared one is stopped (a later ``ray_shared`` starts it again)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
