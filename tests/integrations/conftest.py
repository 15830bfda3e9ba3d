"""One local Ray for the tests under ``tests/integrations``.

Starting Ray costs 5-15 s on a 2-core machine; a start per module was a large part of the suite's time.
Modules ask for ``ray_shared`` (module scope): it is started on first use, by
``conduit_rllib.local_ray.init_local_ray`` (what the recipes and benchmarks call: loopback only), and
stopped after the last test under ``tests/integrations``. A test that needs Ray to itself (its own
multi-node cluster) asks for ``no_shared_ray``, which stops it; the next ``ray_shared`` starts it
again. Modules leave nothing running behind them (they stop their algorithms and actors;
``conduit_tq`` closes TransferQueue whole), so the next module finds Ray as at its start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_saved: dict[str, object] = {}


def _start() -> None:
    from conduit_rllib.local_ray import LOOPBACK_ENV, init_local_ray
    from ray._private import ray_constants

    _saved.update(env=os.environ.get(LOOPBACK_ENV), cluster=ray_constants.ENABLE_RAY_CLUSTER)
    init_local_ray(num_cpus=2, log_to_driver=False, namespace="conduit_tests")


def _stop() -> None:
    """Stop the shared Ray (if running) and undo what starting it set in this process."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    ray.shutdown()
    if _saved:
        from conduit_rllib.local_ray import LOOPBACK_ENV
        from ray._private import ray_constants

        env = _saved.pop("env")
        if env is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = str(env)
        ray_constants.ENABLE_RAY_CLUSTER = _saved.pop("cluster")


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[None]:
    yield
    _stop()


@pytest.fixture(scope="module")
def ray_shared(_ray_session: None) -> Iterator[None]:
    """The shared local Ray (2 CPUs, listening on loopback only), started if it is not running."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        _start()
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test under ``tests/integrations`` (and its fixtures' teardown), stop the shared
    Ray: the tests after it run without Ray's processes beside them."""
    yield
    if nextitem is None or Path(__file__).parent not in nextitem.path.parents:
        _stop()


@pytest.fixture
def no_shared_ray() -> None:
    """No Ray in this process: the shared one is stopped (a later ``ray_shared`` starts it again)."""
    _stop()
