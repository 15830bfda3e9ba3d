"""verl plugin (entry point group ``verl.plugins``), imported by ``import verl`` in every process.

It registers the ``conduit`` trainer mode when verl's V1 trainer package gets imported (nothing
heavier is imported up front). verl swallows plugin errors at debug level, so failures are logged
here as warnings. A verl release that lacks something conduit_verl needs (``compat.py``) leaves
verl's own trainer modes working and logs why ``conduit`` is not available.

(The CPU harness used by the tests and benchmarks is a separate package, ``tools/verl_cpu``.)
"""

from __future__ import annotations

import logging
import sys

from conduit_verl._post_import import when_imported

logger = logging.getLogger(__name__)

TRAINER_PACKAGE = "verl.trainer.ppo.v1"


def _register_trainer() -> None:
    compat = sys.modules.get("conduit_verl.compat")
    if compat is not None and not getattr(compat, "READY", True):
        # compat.py is importing verl's trainer package right now: register once it is done
        compat.after_import(_register_trainer)
        return
    try:
        import conduit_verl.trainer  # noqa: F401  (registers trainer mode "conduit")
    except Exception as err:
        from conduit_verl.errors import VerlCompatError

        if isinstance(err, VerlCompatError):  # verl's own modes keep working
            logger.warning("conduit_verl: trainer mode 'conduit' is not available: %s", err)
            return
        logger.warning("conduit_verl: could not register trainer mode 'conduit'", exc_info=True)
        raise


when_imported(TRAINER_PACKAGE, _register_trainer)


def _register_tq_store() -> None:
    try:
        from conduit_verl.tq_store import register

        register()  # storage_backend=Conduit, in every process that uses TransferQueue
    except Exception:
        logger.warning(
            "conduit_verl: could not register TransferQueue storage backend 'Conduit'", exc_info=True
        )


when_imported("transfer_queue", _register_tq_store)
