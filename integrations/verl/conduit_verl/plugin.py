"""verl plugin (entry point group ``verl.plugins``), imported by ``import verl`` in every process.

It registers the ``conduit`` trainer mode (when verl's V1 trainer package gets imported) and, when
``CONDUIT_VERL_CPU=1``, Conduit's CPU mode. verl swallows plugin errors at debug level, so failures
are logged here as warnings.
"""

from __future__ import annotations

import logging

from conduit_verl._post_import import when_imported

logger = logging.getLogger(__name__)

TRAINER_PACKAGE = "verl.trainer.ppo.v1"


def _register_trainer() -> None:
    try:
        import conduit_verl.trainer  # noqa: F401  (registers trainer mode "conduit")
    except Exception:
        logger.warning("conduit_verl: could not register trainer mode 'conduit'", exc_info=True)
        raise


def _load() -> None:
    from conduit_verl.cpu.patches import apply, cpu_mode_enabled

    if cpu_mode_enabled():
        try:
            apply()
        except Exception:
            logger.warning("conduit_verl: CPU mode failed to apply", exc_info=True)
            raise
    when_imported(TRAINER_PACKAGE, _register_trainer)


_load()
