"""verl plugin of the CPU harness (entry point ``conduit_cpu`` in group ``verl.plugins``).

Imported by ``import verl`` in every process; it changes nothing unless ``CONDUIT_VERL_CPU=1``
(set by the launcher, ``run.py``, and inherited by every Ray worker), in which case it applies the
CPU mode (:func:`conduit_verl_cpu.patches.apply`). verl swallows plugin errors at debug level, so
a failure is logged here as a warning.
"""

from __future__ import annotations

import logging

from conduit_verl_cpu.patches import apply, cpu_mode_enabled

logger = logging.getLogger(__name__)

if cpu_mode_enabled():
    try:
        apply()
    except Exception:
        logger.warning("conduit_verl_cpu: CPU mode failed to apply", exc_info=True)
        raise
