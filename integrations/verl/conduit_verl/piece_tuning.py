"""What ``g_ing=auto`` keeps between runs: its decision per workload, through the core's tuner cache.

The piece policy (``piece_policy.py``) decides two things: the arm (stream the step in pieces, or
ingest it as one whole-batch piece, verl's schedule) and the streamed piece's ``g``. Where its cost
model cannot tell whether streaming pays, it measures whole steps of both arms (probes) — a cost
each run would otherwise pay again. :class:`PieceTuning` keeps the decision per workload
:class:`~conduit.tuner.Signature` in the core's :class:`~conduit.tuner.ChoiceCache` (the same
files the RLlib plugin's tuner writes) and watches the workload with the core's
:class:`~conduit.tuner.DriftWatch`:

- signature: ``verl/<advantage estimator>/n<n>``, samples per step (prompt groups x n), the mean tokens
  per sample of the warm-up step (in buckets of a factor sqrt(2), so a rerun of the same workload
  finds its entry despite sampling noise) and the machine's fingerprint;
- recall: after the warm-up step the policy starts from the cached arm and ``g`` and skips its
  first probes (the other arm is still re-measured every ``REPROBE_EVERY`` steps, so a stale entry
  is corrected by measurement);
- keep: a decision the policy settled (measured medians of both arms, or a predicted gain large
  enough to stream without probes) is written when it differs from the cached one;
- drift: when the mean tokens per sample stays more than ``DRIFT`` away from the reference for
  ``PATIENCE`` steps (responses got longer), the policy forgets its measurements, looks up the new
  signature and probes again if it has none.

The settings that make the arms differ beyond the signature (how fast generation is against
ingestion) are the hardware's; a run that changes them on one machine should use its own cache
directory (``trainer.v1.conduit.tuner_cache``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from conduit.tuner import ChoiceCache, DriftWatch, Signature

log = logging.getLogger(__name__)

#: relative change of the mean tokens per sample that counts as drift, and for how many steps
DRIFT = 0.25
PATIENCE = 3


@dataclass(frozen=True)
class PieceChoice:
    """``auto``'s decision: ``arm`` ``"stream"`` (pieces of ``g_ing`` groups) or ``"whole"``."""

    arm: str
    g_ing: int


def size_bucket(tokens_per_sample: float) -> float:
    """``tokens_per_sample`` rounded to the nearest power of sqrt(2) (the signature's item size)."""
    if not tokens_per_sample > 0:
        return 0.0
    return round(2.0 ** (round(2.0 * math.log2(tokens_per_sample)) / 2.0), 1)


class PieceTuning:
    """Recalls, keeps and re-opens ``auto``'s decision for one trainer (see the module docstring).

    Args:
        cache: where decisions are kept (the core's cache; one file per signature).
        algorithm: names the workload, e.g. ``verl/grpo/n8``.
        samples: samples per step (prompt groups x n).
        hardware: the machine's fingerprint (:func:`conduit.discovery.fingerprint`).
    """

    def __init__(self, cache: ChoiceCache[PieceChoice], algorithm: str, samples: int, hardware: str) -> None:
        self.cache, self.algorithm, self.samples, self.hardware = cache, algorithm, samples, hardware
        self.signature: Signature | None = None
        self.kept: PieceChoice | None = None
        self._drift: DriftWatch | None = None

    def recall(self, tokens_per_sample: float) -> tuple[PieceChoice, str] | None:
        """The cached decision for this workload at ``tokens_per_sample`` (None: none cached); the
        value becomes the drift reference."""
        self.signature = Signature(
            self.algorithm, self.samples, size_bucket(tokens_per_sample), self.hardware
        )
        self._drift = DriftWatch(max(tokens_per_sample, 1e-9), DRIFT, PATIENCE)
        hit = self.cache.load(self.signature)
        self.kept = hit[0] if hit else None
        if hit:
            log.info("conduit g_ing=auto: starting from %s: %s", hit[0], hit[1])
        return hit

    def keep(self, choice: PieceChoice, reason: str, measured_s: dict[str, float]) -> None:
        """Cache a settled decision (written only when it differs from the cached one)."""
        if self.signature is None or choice == self.kept:
            return
        self.cache.save(self.signature, choice, reason, measured_s)
        self.kept = choice
        log.info("conduit g_ing=auto: kept %s for this workload (%s)", choice, reason)

    def drifted(self, tokens_per_sample: float) -> bool:
        """Record a step's mean tokens per sample; True once the workload drifted (see DriftWatch)."""
        return self._drift is not None and tokens_per_sample > 0 and self._drift.observe(tokens_per_sample)
