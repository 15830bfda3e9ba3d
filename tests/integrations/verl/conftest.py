"""TransferQueue with Conduit's storage on the session's shared Ray (``ray_shared``), closed whole."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def conduit_storage_actors() -> list[Any]:
    """The Conduit storage actors of the running TransferQueue (one per node)."""
    import ray

    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    names = ray.get(controller.get_config.remote()).backend.Conduit.actors
    return [ray.get_actor(n, namespace="transfer_queue") for n in names]


@contextlib.contextmanager
def _conduit_tq(section: dict[str, Any]) -> Iterator[None]:
    import conduit_verl.tq_store as tq_store
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    tq_store.register()
    tq.init(
        OmegaConf.create(
            {
                "controller": {"polling_mode": True},
                "backend": {"storage_backend": "Conduit", "Conduit": section},
            }
        )
    )
    try:
        yield
    finally:
        try:
            actors = conduit_storage_actors()
        except Exception:  # noqa: BLE001 - the controller is gone already: nothing of ours to find
            actors = []
        tq.close()  # kills TQ's controller; TQ does not stop a registered backend's actors
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        # the next tq.init must not find this controller (it would attach to it and ignore its config)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ray.get_actor("TransferQueueController", namespace="transfer_queue")
            except ValueError:
                break
            time.sleep(0.05)


@pytest.fixture(scope="module")
def conduit_tq(ray_shared: None) -> Callable[[dict[str, Any]], contextlib.AbstractContextManager[None]]:
    """``with conduit_tq({...}):`` TransferQueue on the shared Ray with the Conduit backend (``section`` is
    ``transfer_queue.backend.Conduit``); on exit its controller and storage actors are gone."""
    return _conduit_tq
